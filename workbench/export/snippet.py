"""The paste-able plain-PyTorch snippet: header, imports, helpers and sections, from the levers.

The snippet is generated text, not a copy of `workbench.levers`: users paste it into
their own training scripts, so it must not import workbench and should hold only what the
config turns on. The price is a second implementation of each toggle; tests run the snippet
on a model of their own and check every toggle on the user's objects to keep the two equal.
"""

from __future__ import annotations

import json
import re
from typing import Any

from workbench.config import ConfigError, TrainConfig, field_doc
from workbench.export.command import cli_text
from workbench.export.nvtx import NVTX_RANGE, with_nvtx_ranges
from workbench.levers.checkpointing import SAVED_OP_NAMES
from workbench.levers.fragment import Snippet, call, comment, q

_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}
_SDPA_BACKENDS = {
    "math": "MATH",
    "efficient": "EFFICIENT_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
}
_DEVICE = re.compile(r"[a-z]+(:[0-9]+)?")
_WARMUP_ITERS = 3  # as `workbench.levers.cuda_graphs.WARMUP_ITERS` and PyTorch's recipe


def to_snippet(config: TrainConfig, *, device: str = "cuda", nvtx: bool = False) -> str:
    """Plain-PyTorch code applying `config` to the user's own model, optimizer, data and loop.

    The snippet defines `optimize_model`, `make_optimizer`, `make_loader` and `train_step`
    (plus `make_graphed_step` under CUDA graphs), in the order `levers.build` applies
    the toggles, with a header listing the config and a usage example. `nvtx=True` wraps the
    step and each phase of `train_step` in NVTX ranges (Nsight Systems shows them; no-ops off CUDA).
    """
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise ConfigError(f"device must be a device string such as 'cuda', 'cuda:1' or 'cpu', got {device!r}")
    if config.cuda_graphs and not device.startswith("cuda"):
        raise ConfigError(f"cuda_graphs=true needs a CUDA device; export it with device='cuda', not {device!r}")
    snippet = Snippet(imports={"import torch", "from torch import nn"})
    snippet.imports.add("from collections.abc import Callable, Mapping, Sequence")
    snippet.constants += [f"DEVICE = torch.device({q(device)})", f"SEED = {config.seed}"]
    snippet.constants.append(f"GRAD_ACCUMULATION = {config.grad_accumulation}  # micro-batches per optimizer step")
    if config.batch_size is not None:
        snippet.constants.append(f"BATCH_SIZE = {config.batch_size}  # samples per micro-batch")
    if config.activation_checkpointing != "off" and config.checkpoint_target != "auto":
        snippet.constants += [
            "# Modules to checkpoint: a class name, or an fnmatch glob over qualified names.",
            f"CHECKPOINT_TARGET = {q(config.checkpoint_target)}",
        ]
    if config.activation_offload != "off":
        target = config.activation_offload
        note = "  # the workbench's 'auto': its workload's block; name yours" if target == "auto" else ""
        snippet.constants += [
            "# Modules whose saved activations wait in host memory: a class name or fnmatch glob.",
            f"OFFLOAD_TARGET = {q('MyBlock' if target == 'auto' else target)}{note}",
        ]
    snippet.imports.add("from typing import Any")
    snippet.constants += [
        "",
        "# A micro-batch is a tensor, an (inputs, targets, ...) tuple or a dict of the model's",
        "# keyword arguments (Hugging Face style), nested freely: the workbench's convention.",
        "Batch = Any",
        "LossFn = Callable[[Any, Batch], torch.Tensor]  # loss_fn(output, batch)",
        "ForwardFn = Callable[[nn.Module, Batch], Any]  # forward_fn(model, batch)",
    ]
    _add_statements(snippet, config, device)
    if config.activation_checkpointing != "off":
        _add_checkpointing(snippet, config.activation_checkpointing)
    snippet.functions.append(_optimize_model(config))
    snippet.functions.append(_make_optimizer(config, device))
    snippet.imports.add("from torch.utils.data import DataLoader, Dataset")
    snippet.functions.append(_make_loader(config, device))
    snippet.functions += _BATCH_HELPERS
    if config.channels_last:
        snippet.functions.append(_IMAGES_CHANNELS_LAST)
    if config.float8 != "off":
        _add_float8(snippet, config.float8)
    if config.activation_offload != "off":
        _add_offload(snippet)
    if config.attention_backend == "flex":
        _add_flex_attention(snippet)
    elif config.attention_backend != "auto":
        snippet.imports.add("from torch.nn.attention import SDPBackend, sdpa_kernel")
    if nvtx:
        snippet.imports.add("from contextlib import nullcontext")
        snippet.functions.append(NVTX_RANGE)
        snippet.functions.append(with_nvtx_ranges(_train_step(config, device)))
    else:
        snippet.functions.append(_train_step(config, device))
    if config.cuda_graphs:
        if config.optimizer == "adamw":
            snippet.imports.add("import warnings")
        snippet.functions.append(_graphed_step(config))
    return snippet.text(_header(config, device))


def _header(config: TrainConfig, device: str) -> list[str]:
    """Comment lines: what this is, the config (one entry per non-default field) and usage."""
    lines = [
        "# Training step exported from the PyTorch training workbench. Plain PyTorch: paste",
        f"# it into your training script. Exported for device {q(device)}.",
        "#",
    ]
    changed = TrainConfig().diff(config)
    if not changed:
        lines.append("# Configuration: PyTorch defaults (fp32, eager, AdamW, no loader workers).")
    else:
        lines.append("# Configuration (the fields that differ from PyTorch defaults):")
    for name, (_, value) in changed.items():
        shown = json.dumps(value) if name == "extra" else cli_text(value)
        what = _what(name, value, config)
        if name == "pin_memory" and not device.startswith("cuda"):
            what += "; left out here: it only speeds up copies to a GPU"
        lines += comment(f"{name}={shown}: {what}", indent="#   ", rest="#       ")
    model = "optimize_model(MyModel())"
    if config.activation_checkpointing != "off" and config.checkpoint_target == "auto":
        model = 'optimize_model(MyModel(), checkpoint_target="MyBlock")'
    batch_size = "" if config.batch_size is not None else ", batch_size=32"
    lines += [
        "#",
        "# Usage, with your model, dataset and loss function:",
        f"#     model = {model}",
        "#     optimizer = make_optimizer(model)  # after optimize_model",
        f"#     loader = make_loader(my_dataset{batch_size})",
    ]
    get = "[next(data) for _ in range(GRAD_ACCUMULATION)]"
    step = "train_step(model, optimizer, batches, loss_fn)"
    lines.append("#     # loss_fn(output, batch); leave it out when the model returns its own loss")
    if config.cuda_graphs:
        lines += [
            "#     first = list(itertools.islice(loader, GRAD_ACCUMULATION))",
            "#     graphed_step = make_graphed_step(model, optimizer, first, loss_fn)",
        ]
        step = "graphed_step(batches)"
    lines += [
        "#     for epoch in range(num_epochs):",
        "#         data = iter(loader)",
        "#         for _ in range(len(loader) // GRAD_ACCUMULATION):",
        f"#             batches = {get}",
        f"#             loss = {step}",
    ]
    return lines


def _what(name: str, value: Any, config: TrainConfig) -> str:
    """What a non-default field does, said for its value; the field's docstring otherwise."""
    described: dict[str, Any] = {
        "amp": {"bf16": "bfloat16 autocast, no loss scaling needed", "fp16": "float16 autocast with a GradScaler"},
        "compile": "torch.compile of the model" + ("" if value == "default" else f", mode {value}"),
        "compile_fullgraph": "compile fails on graph breaks instead of running them eagerly",
        "compile_dynamic": {True: "compile for dynamic shapes", False: "compile for static shapes only"},
        "compile_backend": f"compile with the {value} backend"
        + ("" if config.compile == "default" else " (no mode: only inductor takes one)"),
        "activation_checkpointing": {
            "full": "recompute the target modules' activations in backward",
            "selective": "recompute the target modules' cheap ops, keep matmul/conv/attention outputs",
        },
        "checkpoint_target": "the modules to checkpoint (class name or name glob)",
        "cuda_graphs": "capture the whole step as one CUDA graph and replay it",
        "channels_last": "NHWC memory format for 4-D weights and inputs",
        "matmul_precision": f"float32 matmuls may use {'TF32' if value == 'high' else 'bfloat16 kernels'}",
        "cudnn_tf32": {False: "strict fp32 convolutions (cuDNN may not use TF32)"},
        "optimizer": "SGD with momentum 0.9 instead of AdamW",
        "optimizer_impl": {
            "for-loop": "one optimizer kernel per parameter",
            "foreach": "batched (foreach) optimizer kernels",
            "fused": "fused optimizer kernel",
        },
        "lr": "learning rate",
        "attention_backend": "attention through FlexAttention (fused under torch.compile)"
        if value == "flex"
        else f"scaled_dot_product_attention forced to the {value} kernel",
        "batch_size": "samples per micro-batch",
        "grad_accumulation": "micro-batches per optimizer step",
        "num_workers": "DataLoader worker processes",
        "pin_memory": "page-locked batches for asynchronous copies to the GPU",
        "prefetch_factor": "batches each loader worker loads ahead",
        "persistent_workers": "loader workers stay alive between epochs",
        "seed": "seed of the initial weights and the data order",
        "intra_op_threads": f"{value} CPU thread(s) per operator (torch.set_num_threads)",
        "activation_offload": "saved activations of these modules wait in pinned host memory",
        "float8": f"float8 GEMMs ({value} scales) for the nn.Linear layers large enough to gain",
        "compiled_autograd": "each backward's whole autograd graph captured and compiled too",
        "activation_memory_budget": "share of the compiled graph's saved activations kept; the rest recomputed",
        "extra": "options of the workbench's workload; not part of the training step",
    }
    what = described.get(name)
    if isinstance(what, dict):
        what = what.get(value)
    return str(what) if what is not None else field_doc(name)


def _add_statements(snippet: Snippet, config: TrainConfig, device: str) -> None:
    """Module-level statements: the CUDA check, the seed, float32 matmul precision, the scaler."""
    if config.cuda_graphs:
        snippet.statements.append(
            "# CUDA graphs (make_graphed_step) exist only on CUDA devices: fail here, with the\n"
            "# reason, rather than deep inside .to() or the capture.\n"
            "if not torch.cuda.is_available():\n"
            "    raise RuntimeError(\n"
            '        "This training step captures CUDA graphs, which need a CUDA device, but "\n'
            '        "torch.cuda.is_available() is False. Export the configuration with "\n'
            '        "cuda_graphs=false to train on this machine."\n'
            "    )"
        )
    snippet.statements.append(
        "# The measured run's seed: equal initial weights and data order. Keep this line above\n"
        "# the one that builds your model.\n"
        "torch.manual_seed(SEED)"
    )
    # Float32 precision: each flag is written only when it differs from PyTorch's default,
    # which is the same on every device (matmuls 'highest', cuDNN convolutions TF32 allowed).
    if config.matmul_precision != "highest":
        what = "TF32 (10-bit mantissa)" if config.matmul_precision == "high" else "bfloat16-based kernels"
        why = f"float32 matmuls may use {what}: faster, a little less precise (on NVIDIA GPUs from Ampere on)."
        code = f"torch.set_float32_matmul_precision({q(config.matmul_precision)})"
        snippet.statements.append("\n".join([*comment(why, indent="# "), code]))
    if not config.cudnn_tf32:
        why = (
            "Strict fp32 convolutions: cuDNN may not use TF32, which PyTorch allows by default "
            "(on NVIDIA GPUs from Ampere on; CPU convolutions never use it)."
        )
        snippet.statements.append("\n".join([*comment(why, indent="# "), "torch.backends.cudnn.allow_tf32 = False"]))
    if config.intra_op_threads is not None:
        why = (
            "The measured intra-op CPU thread count: with more threads than free cores (other "
            "processes, loader workers) every operator waits for the slowest thread."
        )
        code = f"torch.set_num_threads({config.intra_op_threads})"
        snippet.statements.append("\n".join([*comment(why, indent="# "), code]))
    _add_lever_statements(snippet, config)
    if config.amp == "fp16":
        snippet.statements.append(
            "# fp16 gradients underflow: GradScaler scales the loss up before backward, unscales\n"
            "# the gradients before the step and skips steps whose gradients overflowed.\n"
            "scaler = torch.amp.GradScaler(DEVICE.type)"
        )


def _add_lever_statements(snippet: Snippet, config: TrainConfig) -> None:
    """Compiler settings that must hold before the first compiled call (the memory budget, ...)."""
    if config.activation_memory_budget < 1.0:
        snippet.imports.add("import torch._functorch.config")
        why = (
            f"Activation memory budget: torch.compile's partitioner keeps {config.activation_memory_budget:.0%} "
            "of the activations its fastest plan would save and recomputes the cheapest rest in backward. "
            "A private PyTorch setting: it is read when the first call compiles."
        )
        code = f"torch._functorch.config.activation_memory_budget = {config.activation_memory_budget!r}"
        snippet.statements.append("\n".join([*comment(why, indent="# "), code]))
    if config.compiled_autograd:
        snippet.imports.add("from torch._dynamo import compiled_autograd")
        why = (
            "Compiled autograd: train_step captures each backward's whole autograd graph and compiles it "
            "with this compiler (the forward's backend). A private PyTorch API."
        )
        args = [f"backend={q(config.compile_backend)}"]
        if config.compile_backend == "inductor" and config.compile != "default":
            args.append(f"mode={q(config.compile)}")
        if config.compile_fullgraph:
            args.append("fullgraph=True")
        code = "\n".join(call("BACKWARD_COMPILER = torch.compile", args, indent=0))
        snippet.statements.append("\n".join([*comment(why, indent="# "), code]))


def _add_checkpointing(snippet: Snippet, policy: str) -> None:
    """`checkpoint_modules` and the patched forward; mirrors `levers.checkpointing`."""
    snippet.imports |= {"import fnmatch", "import functools", "from typing import Any"}
    snippet.functions.append(
        "def checkpoint_modules(model: nn.Module, target: str) -> list[str]:\n"
        '    """Recompute in backward the activations of every module matching `target`.\n'
        "\n"
        "    `target` is a module class name or an fnmatch glob over qualified module names.\n"
        "    Each outermost match's forward is patched in place, so the module keeps its type,\n"
        "    name and state_dict keys. Returns the qualified names of the wrapped modules.\n"
        '    """\n'
        "    wrapped: list[str] = []\n"
        "    for name, module in model.named_modules():\n"
        "        # Inside a wrapped module already: wrapping it too would recompute twice.\n"
        '        if any(w == "" or name == w or name.startswith(w + ".") for w in wrapped):\n'
        "            continue\n"
        "        by_class = type(module).__name__ == target\n"
        '        by_name = name != "" and fnmatch.fnmatchcase(name, target)\n'
        "        if by_class or by_name:\n"
        "            module.forward = functools.partial(_checkpointed, module.forward)\n"
        "            wrapped.append(name)\n"
        "    if not wrapped:\n"
        '        raise ValueError(f"checkpoint target {target!r} matches no module of the model")\n'
        "    return wrapped"
    )
    if policy == "full":
        snippet.imports.add("from torch.utils.checkpoint import checkpoint")
        snippet.functions.append(
            "def _checkpointed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:\n"
            "    # Full checkpointing keeps only the module's inputs. Non-reentrant is the mode\n"
            "    # PyTorch recommends: it supports keyword arguments and torch.compile.\n"
            "    return checkpoint(forward, *args, use_reentrant=False, **kwargs)"
        )
        return
    snippet.imports.add(
        "from torch.utils.checkpoint import (\n"
        "    CheckpointPolicy,\n"
        "    checkpoint,\n"
        "    create_selective_checkpoint_contexts,\n"
        ")"
    )
    names = "".join(f"        {q(name)},\n" for name in SAVED_OP_NAMES)
    snippet.constants += [
        "",
        "# Selective checkpointing saves the outputs of these compute-heavy ops and recomputes",
        "# only the cheap (memory-bound) ones in backward. Attention kernels vary by build.",
        "SAVED_OPS = frozenset(\n"
        "    getattr(torch.ops.aten, name).default\n"
        f"    for name in (\n{names}    )\n"
        "    if hasattr(torch.ops.aten, name)\n"
        ")",
    ]
    snippet.functions += [
        "def _save_heavy_ops(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:\n"
        "    if op in SAVED_OPS:\n"
        "        return CheckpointPolicy.MUST_SAVE\n"
        "    return CheckpointPolicy.PREFER_RECOMPUTE",
        "def _checkpointed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:\n"
        "    # Non-reentrant, as PyTorch recommends; context_fn applies the selective policy.\n"
        "    policy = functools.partial(create_selective_checkpoint_contexts, _save_heavy_ops)\n"
        "    return checkpoint(forward, *args, use_reentrant=False, context_fn=policy, **kwargs)",
    ]


def _add_offload(snippet: Snippet) -> None:
    """`offload_modules`; mirrors `levers.offload`."""
    snippet.imports |= {"import fnmatch", "import functools"}
    snippet.functions += [
        "def _pack_to_host(tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:\n"
        "    # Into pinned host memory without making the host wait (torch < 2.13's save_on_cpu\n"
        "    # blocks here); queued on the compute stream, so the GPU pays the copy's time.\n"
        "    if not tensor.is_cuda or tensor.is_sparse:\n"
        "        return tensor.device, tensor.cpu()\n"
        "    packed = torch.empty(\n"
        "        tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=True\n"
        "    )\n"
        "    packed.copy_(tensor, non_blocking=True)\n"
        "    return tensor.device, packed",
        "def _unpack_to_device(packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:\n"
        "    device, tensor = packed\n"
        "    return tensor.to(device, non_blocking=True)",
        "def _offloaded(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:\n"
        "    # What autograd saves in here is copied to pinned host memory and back for backward.\n"
        "    with torch.autograd.graph.saved_tensors_hooks(_pack_to_host, _unpack_to_device):\n"
        "        return forward(*args, **kwargs)",
        "def offload_modules(model: nn.Module, target: str) -> list[str]:\n"
        '    """Keep the activations saved inside every module matching `target` (a class\n'
        "    name or an fnmatch glob over qualified names) in host memory until backward.\n"
        '    """\n'
        "    wrapped: list[str] = []\n"
        "    for name, module in model.named_modules():\n"
        '        if any(w == "" or name == w or name.startswith(w + ".") for w in wrapped):\n'
        "            continue\n"
        "        by_class = type(module).__name__ == target\n"
        '        if by_class or (name != "" and fnmatch.fnmatchcase(name, target)):\n'
        "            module.forward = functools.partial(_offloaded, module.forward)\n"
        "            wrapped.append(name)\n"
        "    if not wrapped:\n"
        '        raise ValueError(f"offload target {target!r} matches no module of the model")\n'
        "    return wrapped",
    ]


def _add_float8(snippet: Snippet, recipe: str) -> None:
    """The per-Linear filter torchao calls; mirrors `levers.float8.float8_worth_converting`."""
    snippet.imports.add("from torchao.float8 import Float8LinearConfig, convert_to_float8_training")
    if recipe == "tensorwise":
        rule = [
            "    # Smaller GEMMs lose: the casts cost more than the float8 GEMM saves (torchao's",
            "    # thresholds for tensorwise scales, measured on H100).",
            "    return in_features > 4096 or out_features > 1024",
        ]
    else:
        rule = [
            "    # Smaller GEMMs lose: the casts cost more than the float8 GEMM saves (torchao's",
            "    # thresholds for rowwise scales, measured on H100).",
            "    if out_features <= 2048 or in_features <= 1024:",
            "        return False",
            "    return out_features > 4096 or in_features > 2048",
        ]
    snippet.functions.append(
        "\n".join(
            [
                "def float8_worth_converting(module: nn.Module, fqn: str) -> bool:",
                '    """Convert an nn.Linear to float8 only where its GEMMs are large enough to gain."""',
                "    if not isinstance(module, nn.Linear):",
                "        return False",
                "    in_features, out_features = module.in_features, module.out_features",
                "    if in_features % 16 or out_features % 16:  # float8 GEMMs need multiples of 16",
                "        return False",
                *rule,
            ]
        )
    )


def _add_flex_attention(snippet: Snippet) -> None:
    """`flex_sdpa` and `use_flex_attention`; mirrors `levers.flex_attention`."""
    snippet.imports.add("from torch.nn.attention.flex_attention import create_block_mask, flex_attention")
    snippet.functions += [
        "def _causal(\n"
        "    batch: Any, head: Any, q_index: torch.Tensor, kv_index: torch.Tensor\n"
        ") -> torch.Tensor:\n"
        "    return q_index >= kv_index",
        "def flex_sdpa(\n"
        "    query: torch.Tensor,\n"
        "    key: torch.Tensor,\n"
        "    value: torch.Tensor,\n"
        "    *,\n"
        "    is_causal: bool = False,\n"
        ") -> torch.Tensor:\n"
        '    """F.scaled_dot_product_attention(q, k, v, is_causal=...) by FlexAttention.\n'
        "\n"
        "    Causal attention is a block mask: the kernel skips the blocks above the diagonal.\n"
        "    Fast only under torch.compile (eagerly it materializes the whole score matrix).\n"
        '    """\n'
        "    block_mask = None\n"
        "    if is_causal:\n"
        "        q_len, kv_len = query.shape[-2], key.shape[-2]\n"
        "        block_mask = create_block_mask(\n"
        "            _causal, None, None, q_len, kv_len, device=query.device\n"
        "        )\n"
        "    return flex_attention(query, key, value, block_mask=block_mask)",
        "def use_flex_attention(model: nn.Module) -> int:\n"
        '    """Give every module that calls attention through an `attention_fn` attribute\n'
        "    (SDPA's signature) flex_sdpa instead. Where your model calls\n"
        "    F.scaled_dot_product_attention directly, call flex_sdpa there instead.\n"
        '    """\n'
        '    modules = [m for m in model.modules() if callable(getattr(m, "attention_fn", None))]\n'
        "    for module in modules:\n"
        "        module.attention_fn = flex_sdpa\n"
        "    if not modules:\n"
        '        raise ValueError("no module of the model has an attention_fn to replace")\n'
        "    return len(modules)",
    ]


def _optimize_model(config: TrainConfig) -> str:
    """`optimize_model`: memory format, then checkpointing, then compile (build()'s order)."""
    auto_target = config.activation_checkpointing != "off" and config.checkpoint_target == "auto"
    signature = "def optimize_model(model: nn.Module) -> nn.Module:"
    doc = ['    """Move `model` to DEVICE and apply the measured model optimizations.', ""]
    if auto_target:
        signature = "def optimize_model(model: nn.Module, checkpoint_target: str) -> nn.Module:"
        doc += [
            "    checkpoint_target: the module class name (or fnmatch glob over qualified names)",
            "    to checkpoint. The workbench ran with checkpoint_target='auto', which meant its",
            "    workload's repeated block: name the repeated block of YOUR model here.",
            "",
        ]
    doc += ["    Call it before make_optimizer: the optimizer must hold the final parameters.", '    """']
    body: list[str] = []
    if config.channels_last:
        body += [
            "    # NHWC weights let convolutions skip layout transposes. First, because it",
            "    # rewrites weight storage that optimizer state and compiled code must see.",
            "    model = model.to(DEVICE, memory_format=torch.channels_last)",
        ]
    else:
        body.append("    model = model.to(DEVICE)")
    if config.float8 != "off":
        body += [
            "    # float8 GEMMs for the Linears large enough to gain (float8_worth_converting).",
            "    # Before checkpointing and compile: they must see the converted modules.",
            *call(
                "convert_to_float8_training",
                [
                    "model",
                    f"config=Float8LinearConfig.from_recipe_name({q(config.float8)})",
                    "module_filter_fn=float8_worth_converting",
                ],
                indent=4,
            ),
        ]
    if config.activation_checkpointing != "off":
        target = "checkpoint_target" if auto_target else "CHECKPOINT_TARGET"
        body += [
            "    # Before compile, so torch.compile traces the checkpointed regions.",
            f"    checkpoint_modules(model, {target})",
        ]
    if config.activation_offload != "off":
        body += [
            "    # After checkpointing (on a checkpointed block only its inputs are saved, so only",
            "    # those move), before compile, which breaks the graph at each offloaded module.",
            "    offload_modules(model, OFFLOAD_TARGET)",
        ]
    if config.attention_backend == "flex":
        body += [
            "    # Before compile, so torch.compile traces flex_attention and fuses it.",
            "    use_flex_attention(model)",
        ]
    if config.compile != "off":
        body += _compile_lines(config)
    elif config.activation_checkpointing != "off" or config.activation_offload != "off":
        body.append("    return model")
    else:  # nothing after the move: return it directly
        body[-1] = body[-1].replace("model = ", "return ", 1)
    return "\n".join([signature, *doc, *body])


def _compile_lines(config: TrainConfig) -> list[str]:
    """The `return torch.compile(...)` lines; mode only for inductor, only when not default."""
    args = ["model"]
    lines = ["    # Compile last: it traces the final forward. Compilation runs on the first call."]
    if config.compile != "default":
        if config.compile_backend == "inductor":
            args.append(f"mode={q(config.compile)}")
        else:
            lines.append(f"    # No mode={q(config.compile)}: only the inductor backend takes a mode.")
    if config.compile_fullgraph:
        args.append("fullgraph=True  # fail on graph breaks instead of running them eagerly")
    if config.compile_dynamic is not None:
        args.append(f"dynamic={config.compile_dynamic}")
    if config.compile_backend != "inductor":
        args.append(f"backend={q(config.compile_backend)}")
    return [*lines, *call("return torch.compile", args, indent=4)]


def _make_optimizer(config: TrainConfig, device: str) -> str:
    """`make_optimizer`: AdamW or SGD(momentum 0.9) with the measured kernel strategy.

    optimizer_impl='default' is written out as what PyTorch picks on `device` (foreach on CUDA,
    the for-loop on CPU): a trial on that device measured exactly that, and the pasted step
    must not depend on where, or with which PyTorch, it later runs.
    """
    impl: str = config.optimizer_impl
    source = ""
    if impl == "default":
        from workbench.levers.optimizer import default_impl_on

        device_type = device.split(":")[0]
        impl = default_impl_on(device_type)
        source = f" (PyTorch's default on {device_type}, written out as measured)"
    flag = {"for-loop": "foreach=False", "foreach": "foreach=True", "fused": "fused=True"}[impl]
    effect = {
        "for-loop": "one kernel per parameter and update op.",
        "foreach": "each update op runs as one batched kernel over all parameters.",
        "fused": "one fused kernel does the whole update for all parameters.",
    }[impl]
    why = f"{flag}{source}: {effect}"
    name = "AdamW" if config.optimizer == "adamw" else "SGD with momentum 0.9"
    args = ["params", f"lr={config.lr!r}"] + (["momentum=0.9"] if config.optimizer == "sgd" else []) + [flag]
    comments = comment(why, indent="    # ")
    if config.cuda_graphs and config.optimizer == "adamw":
        args.append("capturable=True")
        comments.append("    # capturable=True keeps the step count on the GPU, so a CUDA graph can replay it.")
    cls = "torch.optim.AdamW" if config.optimizer == "adamw" else "torch.optim.SGD"
    return "\n".join(
        [
            "def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:",
            f'    """{name} over the model\'s trainable parameters."""',
            "    params = [p for p in model.parameters() if p.requires_grad]",
            *comments,
            *call(f"return {cls}", args, indent=4),
        ]
    )


def _make_loader(config: TrainConfig, device: str) -> str:
    """`make_loader`: DataLoader with the measured batch size and worker settings."""
    default = " = BATCH_SIZE" if config.batch_size is not None else ""
    args = ["dataset", "batch_size=batch_size", "shuffle=True", "collate_fn=collate_fn"]
    if config.compile != "off" or config.cuda_graphs:
        args.append("drop_last=True  # a short last batch would recompile/break the graph")
    if config.num_workers > 0:
        args.append(f"num_workers={config.num_workers}  # load batches in worker processes")
        if config.prefetch_factor is not None:
            args.append(f"prefetch_factor={config.prefetch_factor}  # batches each worker loads ahead")
        if config.persistent_workers:
            args.append("persistent_workers=True  # keep the workers between epochs")
    if config.pin_memory and device.startswith("cuda"):
        args.append("pin_memory=True  # page-locked batches: asynchronous copies to the GPU")
    args.append("generator=torch.Generator().manual_seed(SEED)")
    lines = [
        "def make_loader(",
        "    dataset: Dataset,",
        f"    batch_size: int{default},",
        "    collate_fn: Callable[[list[Any]], Batch] | None = None,",
        ") -> DataLoader:",
        '    """Micro-batches with the measured loader settings, shuffled in SEED\'s order.',
        "",
        "    collate_fn: as your own loader's (e.g. images stacked, per-image labels as a list).",
        '    """',
    ]
    return "\n".join([*lines, *call("return DataLoader", args, indent=4, explode=True)])


def _train_step(config: TrainConfig, device: str) -> str:
    """`train_step`: one optimizer step over the micro-batches (autocast, scaler, SDPA backend)."""
    lines = [
        "def train_step(",
        "    model: nn.Module,",
        "    optimizer: torch.optim.Optimizer,",
        "    batches: Sequence[Batch],",
        "    loss_fn: LossFn = output_loss,",
        "    forward_fn: ForwardFn = forward,",
        ") -> torch.Tensor:",
        '    """One optimizer step over GRAD_ACCUMULATION micro-batches; returns their mean loss.',
        "",
        "    The loss stays on the device: reading it (.item()) makes the host wait for it.",
        '    """',
        "    optimizer.zero_grad(set_to_none=True)",
        "    losses = []",
        "    for batch in batches:",
    ]
    if config.pin_memory and device.startswith("cuda"):
        lines += [
            "        # From pinned memory the copies run asynchronously, overlapping compute.",
            "        batch = to_device(batch, non_blocking=True)",
        ]
    else:
        lines.append("        batch = to_device(batch)")
    if config.channels_last:
        lines.append("        batch = map_tensors(batch, images_channels_last)")
    indent = "        "
    if config.attention_backend not in ("auto", "flex"):
        lines += [
            "        # The SDPA backend holds for backward too: its backward kernel must match.",
            f"        with sdpa_kernel(SDPBackend.{_SDPA_BACKENDS[config.attention_backend]}):",
        ]
        indent += "    "
    forward = f"{indent}loss = loss_fn(forward_fn(model, batch), batch)"
    if config.amp != "fp32":
        autocast = f"torch.autocast(DEVICE.type, dtype={_DTYPES[config.amp]}"
        if config.cuda_graphs:
            lines.append(f"{indent}# No cast cache: it would keep tensors made during graph capture.")
            autocast += ", cache_enabled=False"
        lines += [f"{indent}with {autocast}):", "    " + forward]
    else:
        lines.append(forward)
    backward = "(loss / len(batches)).backward()"
    if config.amp == "fp16":
        backward = "scaler.scale(loss / len(batches)).backward()"
    lines += [
        f"{indent}# Dividing by the micro-batch count makes the accumulated gradient the mean",
        f"{indent}# over all micro-batches, as one big batch would give.",
    ]
    if config.compiled_autograd:
        lines += [f"{indent}with compiled_autograd._enable(BACKWARD_COMPILER):", f"{indent}    {backward}"]
    else:
        lines.append(f"{indent}{backward}")
    lines.append("        losses.append(loss.detach())")
    if config.amp == "fp16":
        lines += ["    scaler.step(optimizer)  # skipped if the gradients overflowed", "    scaler.update()"]
    else:
        lines.append("    optimizer.step()")
    lines.append("    return torch.stack(losses).mean()")
    return "\n".join(lines)


def _graphed_step(config: TrainConfig) -> str:
    """`make_graphed_step`: PyTorch's whole-network CUDA-graph capture of `train_step`."""
    warm_up = [
        "    with torch.cuda.stream(side_stream):",
        f"        for _ in range({_WARMUP_ITERS}):",
        "            train_step(model, optimizer, static_batches, loss_fn, forward_fn)",
    ]
    if config.optimizer == "adamw":
        warm_up = [
            "    with torch.cuda.stream(side_stream), warnings.catch_warnings():",
            "        # capturable=True optimizers warn when stepped outside a graph; intended here.",
            '        warnings.filterwarnings("ignore", message=".*capturable=True.*")',
            *warm_up[1:],
        ]
    lines = [
        "def make_graphed_step(",
        "    model: nn.Module,",
        "    optimizer: torch.optim.Optimizer,",
        "    example_batches: Sequence[Batch],",
        "    loss_fn: LossFn = output_loss,",
        "    forward_fn: ForwardFn = forward,",
        ") -> Callable[[Sequence[Batch]], torch.Tensor]:",
        '    """Capture train_step once as a CUDA graph; the returned step(batches) replays it.',
        "",
        "    PyTorch's whole-network capture: static inputs, warm-up on a side stream, capture",
        "    of forward, backward and optimizer step, then per step a copy of the new batches",
        "    into the static inputs and one replay. Later batches need the example batches'",
        "    shapes, and the step must not synchronize with the host (.item(), print).",
        '    """',
        "    static_batches = [to_device(batch, copy=True) for batch in example_batches]",
        "    # Lazy initialisation (optimizer state, cuBLAS handles, compilation) cannot be",
        "    # captured: run a few steps first. As in PyTorch's recipe, they really train.",
        "    side_stream = torch.cuda.Stream(DEVICE)",
        "    side_stream.wait_stream(torch.cuda.current_stream(DEVICE))",
        *warm_up,
        "    torch.cuda.current_stream(DEVICE).wait_stream(side_stream)",
        "    # train_step begins with zero_grad(set_to_none=True): backward then allocates the",
        "    # gradients from the graph's private memory pool, where replays find them.",
        "    graph = torch.cuda.CUDAGraph()",
        "    # thread_local: a DataLoader's pin-memory thread may pin memory meanwhile.",
        '    with torch.cuda.graph(graph, capture_error_mode="thread_local"):',
        "        static_loss = train_step(model, optimizer, static_batches, loss_fn, forward_fn)",
        "",
        "    def graphed_step(batches: Sequence[Batch]) -> torch.Tensor:",
        "        for static, batch in zip(static_batches, batches, strict=True):",
        "            pairs = zip(tensors_of(static), tensors_of(batch), strict=True)",
        "            for static_tensor, tensor in pairs:",
        "                if tensor.shape != static_tensor.shape:",
        "                    raise ValueError(",
        '                        f"CUDA graph replay needs the captured shape "',
        '                        f"{tuple(static_tensor.shape)}, got {tuple(tensor.shape)}"',
        "                    )",
        "                static_tensor.copy_(tensor, non_blocking=True)",
        "        graph.replay()",
        "        return static_loss.clone()  # the next replay overwrites static_loss",
        "",
        "    return graphed_step",
    ]
    return "\n".join(lines)


#: The batch conventions of `workbench.workloads.base`, in plain PyTorch: nested batches, the
#: default forward (a dict batch is the model's keyword arguments) and the model's own loss.
_BATCH_HELPERS = [
    """def map_tensors(batch: Batch, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    \"\"\"Apply fn to every tensor of a nested batch (tensors, tuples, lists, dicts).\"\"\"
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {key: map_tensors(value, fn) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        items = [map_tensors(value, fn) for value in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch""",
    """def tensors_of(batch: Batch) -> list[torch.Tensor]:
    \"\"\"The tensors of a nested batch, in a fixed order.\"\"\"
    found: list[torch.Tensor] = []
    map_tensors(batch, lambda tensor: found.append(tensor) or tensor)
    return found""",
    """def to_device(batch: Batch, non_blocking: bool = False, copy: bool = False) -> Batch:
    \"\"\"Every tensor of a nested batch on DEVICE.\"\"\"
    return map_tensors(
        batch, lambda tensor: tensor.to(DEVICE, non_blocking=non_blocking, copy=copy)
    )""",
    """def forward(model: nn.Module, batch: Batch) -> Any:
    \"\"\"model(**batch) for a dict, model(batch[0]) for an (inputs, targets, ...)
    tuple, model(batch) for a tensor. For anything else, pass your own forward_fn.\"\"\"
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(batch[0])
    return model(batch)""",
    """def output_loss(output: Any, batch: Batch) -> torch.Tensor:
    \"\"\"The model's own loss, output.loss or output["loss"]: the default loss_fn (Hugging
    Face models given labels return one).\"\"\"
    if isinstance(output, Mapping):
        loss = output.get("loss")
    else:
        loss = getattr(output, "loss", None)
    if loss is None:
        raise ValueError("the model returned no loss: pass loss_fn(output, batch)")
    return loss""",
]

_IMAGES_CHANNELS_LAST = """def images_channels_last(tensor: torch.Tensor) -> torch.Tensor:
    \"\"\"4-D floating tensors (images) in the weights' NHWC layout; others unchanged.\"\"\"
    if tensor.dim() == 4 and tensor.is_floating_point():
        return tensor.contiguous(memory_format=torch.channels_last)
    return tensor"""
