"""`TrainConfig`: every optimization toggle of a training step, in one frozen dataclass.

Validation here is device-independent (bad values, combinations that can never
work, in `workbench.config_rules`, grouped by lever); what *this* device can do is
each lever's own question (`workbench.levers.capabilities()`).
No torch import: the config must load anywhere, fast.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from workbench.config_rules import COMPILE_MODES_WITH_CUDA_GRAPHS as COMPILE_MODES_WITH_CUDA_GRAPHS
from workbench.config_rules import ConfigError, check_budget_value, validate

AmpDtype = Literal["fp32", "bf16", "fp16"]
CompileMode = Literal["off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
CheckpointPolicy = Literal["off", "full", "selective"]
MatmulPrecision = Literal["highest", "high", "medium"]
OptimizerName = Literal["adamw", "sgd"]
OptimizerImpl = Literal["default", "for-loop", "foreach", "fused"]
AttentionBackend = Literal["auto", "math", "efficient", "flash", "cudnn", "flex"]
Strategy = Literal["none", "ddp", "fsdp2"]
CommHook = Literal["none", "fp16", "bf16"]
FsdpParamDtype = Literal["fp32", "bf16"]
Float8Recipe = Literal["off", "tensorwise", "rowwise"]


@dataclass(frozen=True)
class TrainConfig:
    """One training-step configuration: the thing a trial measures and an export writes out."""

    amp: AmpDtype = "fp32"
    """Autocast dtype for forward/backward. fp16 adds a GradScaler; bf16 needs none."""

    compile: CompileMode = "off"
    """`torch.compile` mode for the model; 'off' runs eager."""

    compile_fullgraph: bool = False
    """Fail on graph breaks instead of falling back to eager for the broken region."""

    compile_dynamic: bool | None = None
    """Dynamic shapes: None lets dynamo decide, True/False force it."""

    compile_backend: str = "inductor"
    """Compile backend. 'inductor' is the real one; 'eager'/'aot_eager' check plumbing cheaply."""

    activation_checkpointing: CheckpointPolicy = "off"
    """Recompute activations in backward: 'full' saves nothing inside a target, 'selective'
    keeps matmul/conv outputs and recomputes the cheap ops."""

    checkpoint_target: str = "auto"
    """Which submodules to checkpoint: a class name ('ResBlock'), a name glob ('encoder.*'),
    or 'auto' (the workload's repeated block type)."""

    cuda_graphs: bool = False
    """Capture the whole step (forward, backward, optimizer) once and replay it. CUDA only."""

    channels_last: bool = False
    """NHWC memory format for the model's 4-D weights and the batch's 4-D inputs."""

    matmul_precision: MatmulPrecision = "highest"
    """`torch.set_float32_matmul_precision`, float32 matmuls only: 'highest' (PyTorch's default) is full
    fp32, 'high' allows TF32 on NVIDIA Ampere and newer, 'medium' bfloat16-based kernels."""

    cudnn_tf32: bool = True
    """`torch.backends.cudnn.allow_tf32`: cuDNN convolutions may use TF32 on NVIDIA Ampere and newer.
    On is PyTorch's default (even while matmuls stay 'highest'); off gives strict fp32 convolutions,
    e.g. for a numerics study. cuDNN runs on CUDA only."""

    optimizer: OptimizerName = "adamw"
    """Optimizer algorithm: AdamW, or SGD with momentum 0.9."""

    optimizer_impl: OptimizerImpl = "default"
    """Kernel strategy: 'default' leaves it to PyTorch, as a script that never chose would (foreach
    on CUDA, a for-loop on CPU; the trial records which); or force one kernel per parameter
    ('for-loop'), batched ('foreach'), or fused."""

    lr: float = 1e-3
    """Learning rate of the optimizer (the same for every candidate keeps losses comparable)."""

    attention_backend: AttentionBackend = "auto"
    """Backend for `F.scaled_dot_product_attention`; 'auto' lets PyTorch choose. 'flex' routes the
    model's SDPA-path attention (modules with an `attention_fn`, as the built-in workloads have)
    through FlexAttention, which needs compile: its fused kernel exists only under torch.compile."""

    batch_size: int | None = None
    """Samples per micro-batch; None takes the workload preset's default."""

    grad_accumulation: int = 1
    """Micro-batches per optimizer step."""

    num_workers: int = 0
    """DataLoader worker processes; 0 loads in the training process."""

    pin_memory: bool = False
    """Page-locked host batches for faster, asynchronous host-to-device copies. CUDA only."""

    prefetch_factor: int | None = None
    """Batches each worker loads ahead; needs num_workers > 0. None keeps PyTorch's default (2)."""

    persistent_workers: bool = False
    """Keep loader workers alive between epochs; needs num_workers > 0."""

    uint8_images: bool = False
    """Camera images leave the loader as uint8 (a quarter of float32's bytes to copy to the device)
    and are scaled and normalized on the device after the copy. For workloads that offer it
    (bev-perception with camera_files); off keeps the loader's float32 images."""

    seed: int = 0
    """Seed for model initialisation and data: equal seeds give equal batches and losses."""

    intra_op_threads: int | None = None
    """CPU threads one operator may use (`torch.set_num_threads`) during the step; None keeps what
    PyTorch picks (the cores it sees). On a shared or small host, threads × processes above the
    cores slows every step down; the resolved count is recorded with every result."""

    strategy: Strategy = "none"
    """Data parallelism: 'none' (one process), 'ddp' (DistributedDataParallel: every rank holds the
    whole model, gradients are all-reduced in buckets during backward) or 'fsdp2' (fully_shard:
    parameters, gradients and optimizer state are sharded, gathered per block when needed).
    Distributed trials run through torchrun; batch_size is then the GLOBAL batch, split evenly."""

    nproc_per_node: int = 1
    """Ranks (processes) per node: one per GPU on CUDA, a few gloo ranks on CPU."""

    rdzv_endpoint: str = ""
    """'HOST:PORT' of torchrun's c10d rendezvous (the first node); needed when nnodes > 1.
    Empty on one node: torchrun --standalone picks a free local port."""

    nnodes: int = 1
    """Nodes taking part; each runs the same torchrun command (see `workbench.export.to_command`)."""

    ddp_bucket_cap_mb: float | None = None
    """DDP gradient bucket size in MB; None keeps PyTorch's 25. Smaller buckets start the
    all-reduce earlier in backward (more overlap) but pay more per-message latency."""

    ddp_gradient_as_bucket_view: bool = False
    """Gradients are views into DDP's flat buckets: saves one gradient copy per step and its memory."""

    ddp_static_graph: bool = False
    """Promise DDP the set of used parameters never changes: it can skip the unused-parameter
    search and reorder buckets after the first step (also needed for reentrant checkpointing)."""

    comm_hook: CommHook = "none"
    """DDP gradient compression before the all-reduce: fp16 or bf16 halves the bytes sent. bf16
    needs NCCL (GPUs): PyTorch refuses the bf16 hook on gloo."""

    fsdp_reshard_after_forward: bool = True
    """FSDP2: free each block's gathered parameters after its forward (gather again in backward):
    less memory, one more all-gather per block; False keeps them until backward."""

    fsdp_param_dtype: FsdpParamDtype = "fp32"
    """FSDP2 mixed-precision policy: dtype parameters are gathered and computed in (gradients are
    reduced in fp32). bf16 halves all-gather bytes; BatchNorm layers stay fp32 and need amp=bf16."""

    tensor_parallel: int = 1
    """Tensor-parallel degree (Megatron-style, on DTensor): each layer of the model's plan is split
    over this many ranks (attention by heads, the MLP by width), so each holds 1/degree of those
    weights. The ranks form a 2-D mesh, dp × tp = nproc_per_node × nnodes; strategy=fsdp2 shards
    the rest over dp, strategy=none runs tensor parallelism alone (dp = 1). 1 is off."""

    sequence_parallel: bool = False
    """With tensor_parallel: the norms and residual stream between the split layers hold 1/degree
    of the sequence each (activation memory / degree there), all-gathered before a column-wise layer
    and reduce-scattered after a row-wise one instead of all-reduced. Needs the sequence length to
    divide by the degree."""

    async_tp: bool = False
    """With tensor_parallel and compile: overlap tensor parallelism's all-gathers and reduce-scatters
    with the matmuls next to them (inductor's micro-pipelined TP over symmetric memory), instead of
    waiting for each collective. CUDA GPUs with peer-to-peer access only."""

    liger_kernels: bool = False
    """Liger's fused Triton kernels on a Hugging Face model (RMSNorm, RoPE, SwiGLU, fused linear +
    cross-entropy, which never materializes the logits: the big memory win at a large vocabulary).
    CUDA only; needs `pip install 'training-workbench[liger]'`."""

    activation_memory_budget: float = 1.0
    """Compile only: the share (0-1) of the default compiled graph's saved activations to keep; the
    compiler's partitioner recomputes the cheapest rest in backward. 1.0 is off (PyTorch's default,
    fastest), 0.0 keeps what full checkpointing of each compiled graph would. A continuous
    alternative to full/selective checkpointing (`torch._functorch.config.activation_memory_budget`)."""

    compiled_autograd: bool = False
    """Compile only: capture each step's whole backward at `.backward()` and compile it too (compiled
    autograd, `torch._dynamo.compiled_autograd`), beyond the backward AOTAutograd derives per
    forward graph. May fuse more, or only add compile time and recompiles: measure it."""

    float8: Float8Recipe = "off"
    """float8 training of the `nn.Linear` layers worth it (torchao): 'tensorwise' (one scale per
    tensor, fastest) or 'rowwise' (a scale per row, more accurate). Needs compile (fuses the casts),
    an NVIDIA GPU of compute capability 8.9+ and torchao (`pip install 'training-workbench[float8]'`)."""

    activation_offload: str = "off"
    """Keep the activations saved inside these modules in pinned host memory until backward
    (`torch.autograd.graph.save_on_cpu`): less GPU memory for PCIe copy time. 'off', 'auto' (the
    workload's repeated block) or, as checkpoint_target, a class name or name glob. CUDA only; under
    compile each offloaded module is a graph break."""

    extra: dict[str, Any] = field(default_factory=dict, compare=True, hash=False)
    """Workload options passed to the workload factory (e.g. {'sample_cost_ms': 5})."""

    def __post_init__(self) -> None:
        _check_choices(self)
        validate(self)

    # --- conversion -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _copy(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"a config must be a dict of field values, got {type(data).__name__}")
        unknown = sorted(set(data) - set(field_names()))
        if unknown:
            raise ConfigError(f"unknown config field(s) {', '.join(unknown)}; valid fields: {', '.join(field_names())}")
        return cls(**data)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config JSON does not parse: {exc}") from None
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some fields changed, validated again."""
        unknown = sorted(set(changes) - set(field_names()))
        if unknown:
            raise ConfigError(f"unknown config field(s) {', '.join(unknown)}; valid fields: {', '.join(field_names())}")
        return dataclasses.replace(self, **changes)

    def with_overrides(self, text: str) -> TrainConfig:
        """Apply 'amp=bf16,channels_last=true' style overrides (as typed on a command line).

        `extra.KEY=VALUE` entries are merged into the existing `extra`, not replacing it.
        """
        changes = parse_overrides(text)
        if "extra" in changes:
            changes["extra"] = {**self.extra, **changes["extra"]}
        return self.replace(**changes)

    def diff(self, other: TrainConfig) -> dict[str, tuple[Any, Any]]:
        """Fields whose values differ: name -> (self's value, other's value)."""
        return {
            f.name: (getattr(self, f.name), getattr(other, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        }

    @property
    def launches_ranks(self) -> bool:
        """Whether a trial of this config runs as torchrun ranks (data or tensor parallel)."""
        return self.strategy != "none" or self.tensor_parallel > 1

    def describe(self) -> str:
        """Short label: the fields that differ from the defaults ('amp=bf16, channels_last=True')."""
        changed = TrainConfig().diff(self)
        return ", ".join(f"{k}={v[1]}" for k, v in changed.items()) or "defaults"


# --- what PyTorch's defaults resolved to ---------------------------------------------------

#: `applied` records that say which kernels and precision a trial really ran with, defaults
#: resolved: 'optimizer' ('adamw/foreach': the algorithm and the implementation PyTorch picked
#: for optimizer_impl='default'), 'matmul_precision' and 'cudnn_tf32' (the flags set for the step).
RESOLVED_TOGGLES = ("optimizer", "matmul_precision", "cudnn_tf32")


def resolved_settings(applied: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """toggle -> value of a result's `RESOLVED_TOGGLES` records (a result's `applied` list).

    A trial recorded before the precision flags were recorded lacks some of them, so its
    settings differ from any newer trial's: it is not known to have run the same kernels.
    """
    return {a["toggle"]: a["value"] for a in applied if a.get("toggle") in RESOLVED_TOGGLES}


def resolved_optimizer_impl(applied: Iterable[Mapping[str, Any]]) -> str | None:
    """The optimizer implementation a trial ran ('for-loop', 'foreach', 'fused'), None if unrecorded."""
    value = resolved_settings(applied).get("optimizer")
    return str(value).rpartition("/")[2] if value else None


# --- field metadata ----------------------------------------------------------------


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


def field_choices(name: str) -> tuple[Any, ...] | None:
    """The allowed values of an enumerated field (Literal or bool), else None."""
    hint = _hints()[name]
    args = typing.get_args(hint)
    if typing.get_origin(hint) is Literal:
        return args
    if hint is bool:
        return (False, True)
    if set(args) == {bool, type(None)}:
        return (None, False, True)
    literals = [a for a in args if typing.get_origin(a) is Literal]
    if literals:
        return typing.get_args(literals[0])
    return None


def field_doc(name: str) -> str:
    """The docstring written under a field (used for tooltips and `--help`)."""
    return _field_docs().get(name, "")


def field_type(name: str) -> Any:
    return _hints()[name]


_HINTS: dict[str, Any] = {}
_DOCS: dict[str, str] = {}


def _hints() -> dict[str, Any]:
    if not _HINTS:
        _HINTS.update(typing.get_type_hints(TrainConfig))
    return _HINTS


def _field_docs() -> dict[str, str]:
    """Read the attribute docstrings from the class source (they are not kept at runtime)."""
    if not _DOCS:
        import ast
        import inspect
        import textwrap

        tree = ast.parse(textwrap.dedent(inspect.getsource(TrainConfig)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, nxt in itertools.pairwise(body):
            documented = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and documented:
                _DOCS[node.target.id] = " ".join(str(nxt.value.value).split())  # type: ignore[attr-defined]
    return _DOCS


# --- parsing ------------------------------------------------------------------------


def parse_overrides(text: str) -> dict[str, Any]:
    """'amp=bf16,channels_last=true' -> {'amp': 'bf16', 'channels_last': True}, typed by the field.

    Unknown keys and unparsable values raise ConfigError naming the valid choices.
    """
    out: dict[str, Any] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        if "=" not in item:
            raise ConfigError(f"'{item}' is not key=value; example: amp=bf16,channels_last=true")
        key, raw = (s.strip() for s in item.split("=", 1))
        if key.startswith("extra."):
            out.setdefault("extra", {})[key[len("extra.") :]] = _parse_scalar(raw)
            continue
        if key not in field_names() or key == "extra":
            raise ConfigError(f"unknown config field '{key}'; valid fields: {', '.join(field_names())}")
        out[key] = parse_value(key, raw)
    return out


def parse_value(name: str, raw: str) -> Any:
    """Convert a string to the type of field `name`."""
    hint = _hints()[name]
    args = set(typing.get_args(hint))
    low = raw.strip().lower()
    if low in ("none", "null", "auto-default") and type(None) in args:
        return None
    if hint is bool or bool in args:
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{name} must be true or false, got '{raw}'")
    if hint is int or int in args:
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got '{raw}'") from None
    if hint is float or float in args:
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{name} must be a number, got '{raw}'") from None
    return raw.strip()


def _parse_scalar(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


# --- each field's own type and choices (the rules between fields: `config_rules`) -------------


def _check_choices(cfg: TrainConfig) -> None:
    for name in field_names():
        choices = field_choices(name)
        value = getattr(cfg, name)
        if choices is None or (value is None and type(None) in typing.get_args(_hints()[name])):
            continue
        if _hints()[name] is bool or bool in typing.get_args(_hints()[name]):
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be true or false, got {value!r}")
            continue
        if value not in choices:
            raise ConfigError(f"{name}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")
    if not isinstance(cfg.compile_backend, str) or not cfg.compile_backend:
        raise ConfigError("compile_backend must be a backend name such as 'inductor', 'aot_eager' or 'eager'")
    if not isinstance(cfg.checkpoint_target, str) or not cfg.checkpoint_target.strip():
        raise ConfigError(
            "checkpoint_target must be a module class name, a name pattern such as 'encoder.*', or 'auto'"
        )
    check_budget_value(cfg.activation_memory_budget)
    if not isinstance(cfg.activation_offload, str) or not cfg.activation_offload.strip():
        raise ConfigError(
            "activation_offload must be 'off', 'auto', a module class name or a name pattern such as 'encoder.*'"
        )
    if not isinstance(cfg.extra, dict):
        raise ConfigError(f"extra must be a dict of workload options, got {type(cfg.extra).__name__}")


def _copy(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else value
