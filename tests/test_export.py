"""Tests of `workbench.export`.

The snippet is executed on a model of the user's own (not a workbench workload) and each
toggle is checked on the user's objects: wrapped modules and recomputation counts, weight
layout, the dtype convolutions see, optimizer flags, loader settings, the SDPA kernel that
ran. Every valid combination of the enumerated fields must compile and pass ruff; the
command line is checked by parsing it with the CLI's own parser.
"""

from __future__ import annotations

import ast
import functools
import itertools
import shlex
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from export_matrix import valid_configs
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import TensorDataset
from torchao_float8 import torchao_verdicts

from workbench.cli import build_parser
from workbench.config import CheckpointPolicy, ConfigError, TrainConfig
from workbench.export import FORMATS, export_config, to_command, to_json, to_snippet
from workbench.levers import build
from workbench.levers.checkpointing import SAVED_OPS
from workbench.workloads import Workload

RUFF = Path(sys.executable).parent / "ruff"


class Block(nn.Module):
    """The user's repeated block; counts forward calls so recomputation is visible."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x + self.conv2(F.gelu(self.conv1(x)))


class UserNet(nn.Module):
    """Conv stem, two Blocks, optional self-attention over pixels, linear head."""

    def __init__(self, attention: bool = False, c: int = 8) -> None:
        super().__init__()
        self.attention = attention
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(Block(c), Block(c))
        self.qkv = nn.Linear(c, 3 * c)
        self.head = nn.Linear(c, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.blocks(self.stem(x)).flatten(2).transpose(1, 2)  # (batch, pixels, channels)
        if self.attention:  # two heads: 4-D inputs, which CPU flash attention takes
            b, n, c = f.shape
            q, k, v = self.qkv(f).view(b, n, 3, 2, c // 2).permute(2, 0, 3, 1, 4)
            f = f + F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c)
        return self.head(f.mean(1))


def mse_on_targets(output: torch.Tensor, batch: Any) -> torch.Tensor:
    """loss_fn(output, batch), the workloads' convention, for an (inputs, targets) batch."""
    return F.mse_loss(output, batch[1])


def make_dataset(n: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, 3, 8, 8, generator=generator)
    mix = torch.randn(3, 4, generator=generator)
    return TensorDataset(x, x.mean((2, 3)) @ mix)  # a target the net can learn


DATASET = make_dataset()


class OpRecorder(TorchDispatchMode):
    """Counts aten ops and records the dtype and layout of every convolution's input."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.conv_inputs: list[tuple[torch.dtype, bool]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[func.overloadpacket.__name__] += 1
        if func is torch.ops.aten.convolution.default:
            x = args[0]
            self.conv_inputs.append((x.dtype, x.is_contiguous(memory_format=torch.channels_last)))
        return func(*args, **(kwargs or {}))


@pytest.fixture(autouse=True)
def _restore_global_torch_state() -> Iterator[None]:
    """Snippets set process-wide state (matmul precision, seed) as a user's script would.

    One intra-op thread: these models are tiny, and with other processes on the 2 cores,
    two threads made some backward kernels (math SDPA) 100x slower, not faster.
    """
    precision, rng, threads = torch.get_float32_matmul_precision(), torch.get_rng_state(), torch.get_num_threads()
    cudnn_tf32 = torch.backends.cudnn.allow_tf32
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision(precision)
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    torch.set_rng_state(rng)


def load(config: TrainConfig, tmp_path: Path, device: str = "cpu") -> dict[str, Any]:
    """Execute the snippet as a file of the user's in a fresh namespace; return that namespace."""
    code = to_snippet(config, device=device)
    path = tmp_path / "user_snippet.py"
    path.write_text(code)
    namespace: dict[str, Any] = {"__name__": "user_snippet"}
    exec(compile(code, str(path), "exec"), namespace)
    return namespace


class Run:
    """The user's loop over the snippet's functions: model, optimizer, loader, losses."""

    def __init__(self, ns: dict[str, Any], model: nn.Module, **optimize: Any) -> None:
        self.ns = ns
        self.model = ns["optimize_model"](model, **optimize)
        self.optimizer = ns["make_optimizer"](self.model)
        self.loader = ns["make_loader"](DATASET, batch_size=8)
        self.losses: list[float] = []
        self._data = self._endless()

    def _endless(self) -> Iterator[Any]:
        while True:
            yield from self.loader

    def next_batches(self) -> list[Any]:
        return [next(self._data) for _ in range(self.ns["GRAD_ACCUMULATION"])]

    def step(self, batches: list[Any] | None = None) -> torch.Tensor:
        loss = self.ns["train_step"](self.model, self.optimizer, batches or self.next_batches(), mse_on_targets)
        self.losses.append(float(loss))
        return loss

    def train(self, steps: int = 15) -> Run:
        for _ in range(steps):
            self.step()
        return self

    def assert_learns(self) -> None:
        assert all(torch.isfinite(torch.tensor(self.losses)))
        first, last = sum(self.losses[:3]) / 3, sum(self.losses[-3:]) / 3
        assert last < 0.8 * first, self.losses


def recorded_step(run: Run) -> OpRecorder:
    recorder = OpRecorder()
    with recorder:
        run.step()
    return recorder


# --- the snippet on the user's model ------------------------------------------------


def test_defaults_give_a_plain_fp32_loop(tmp_path: Path) -> None:
    code = to_snippet(TrainConfig(), device="cpu")
    for absent in ("autocast", "compile(", "checkpoint", "sdpa_kernel", "GradScaler", "num_workers", "cuda"):
        assert absent not in code
    run = Run(load(TrainConfig(lr=1e-2), tmp_path), UserNet())
    recorder = recorded_step(run)
    assert {dtype for dtype, _ in recorder.conv_inputs} == {torch.float32}
    assert not any(cl for _, cl in recorder.conv_inputs)  # the control for the channels_last test
    assert type(run.optimizer) is torch.optim.AdamW and run.optimizer.param_groups[0]["foreach"] is False
    assert run.loader.num_workers == 0
    run.train().assert_learns()


def test_the_default_snippet_keeps_pytorchs_defaults_and_writes_out_the_device_dependent_one(
    tmp_path: Path,
) -> None:
    code = to_snippet(TrainConfig())  # for a GPU, the export's default device
    assert "foreach=False" not in code and "allow_tf32 = False" not in code
    assert "foreach=True" in code  # what PyTorch picks on CUDA, so the pasted step cannot pick otherwise
    assert "set_float32_matmul_precision" not in code and "allow_tf32" not in code
    # On this CPU: the snippet's optimizer runs the implementation a default trial measured here.
    user_workload = Workload.from_callables(
        UserNet, lambda out, batch: out.sum(), batch_fn=lambda n, g: (torch.randn(n, 3, 8, 8, generator=g),)
    )
    measured = build(user_workload, TrainConfig(), "cpu")
    ran = next(a.value for a in measured.applied if a.toggle == "optimizer").split("/")[1]
    run = Run(load(TrainConfig(), tmp_path), UserNet())
    assert run.optimizer.param_groups[0]["foreach"] is (ran == "foreach")
    flags = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32, torch.get_num_threads())
    assert {a.toggle: a.value for a in measured.applied if a.toggle != "optimizer"} == dict(
        zip(("matmul_precision", "cudnn_tf32", "intra_op_threads"), flags)
    )


@pytest.mark.parametrize(
    ("changes", "line", "flags"),
    [
        ({"cudnn_tf32": False}, "torch.backends.cudnn.allow_tf32 = False", ("highest", False)),
        ({"matmul_precision": "high"}, 'torch.set_float32_matmul_precision("high")', ("high", True)),
    ],
)
def test_each_precision_toggle_writes_only_its_own_flag(
    changes: dict[str, Any], line: str, flags: tuple[str, bool], tmp_path: Path
) -> None:
    code = to_snippet(TrainConfig(**changes))
    assert code.count("allow_tf32") + code.count("set_float32_matmul_precision") == 1 and line in code
    load(TrainConfig(**changes), tmp_path)
    assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == flags


def test_bf16_channels_last_fused_and_tf32(tmp_path: Path) -> None:
    config = TrainConfig(amp="bf16", channels_last=True, optimizer_impl="fused", matmul_precision="high", lr=1e-2)
    run = Run(load(config, tmp_path), UserNet())
    assert torch.get_float32_matmul_precision() == "high"
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in run.model.parameters() if p.dim() == 4)
    recorder = recorded_step(run)
    assert len(recorder.conv_inputs) >= 5
    assert all(dtype == torch.bfloat16 and channels_last for dtype, channels_last in recorder.conv_inputs)
    assert run.optimizer.param_groups[0]["fused"] is True
    run.train().assert_learns()


def test_fp16_uses_the_grad_scaler(tmp_path: Path) -> None:
    run = Run(load(TrainConfig(amp="fp16", lr=1e-2), tmp_path), UserNet())
    recorder = recorded_step(run)
    assert {dtype for dtype, _ in recorder.conv_inputs} == {torch.float16}
    scaler = run.ns["scaler"]
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() > 0
    assert scaler._scale is not None  # the step went through the scaler, not around it
    run.train().assert_learns()


@pytest.mark.parametrize(("policy", "target"), [("full", "Block"), ("selective", "blocks.*")])
def test_activation_checkpointing_wraps_and_recomputes_the_target(
    policy: CheckpointPolicy, target: str, tmp_path: Path
) -> None:
    baseline = recorded_step(Run(load(TrainConfig(), tmp_path), UserNet()))
    ns = load(TrainConfig(activation_checkpointing=policy, checkpoint_target=target, lr=1e-2), tmp_path)
    run = Run(ns, UserNet())
    for name, module in run.model.named_modules():
        wrapped = isinstance(module.forward, functools.partial) and module.forward.func is ns["_checkpointed"]
        assert wrapped == (name in ("blocks.0", "blocks.1")), name
    recorder = recorded_step(run)
    assert run.model.blocks[0].calls == 2  # forward, then again in backward
    if policy == "full":
        assert recorder.ops["convolution"] > baseline.ops["convolution"]
    else:  # convolution outputs are saved: only the cheap ops run again
        assert recorder.ops["convolution"] == baseline.ops["convolution"]
        assert recorder.ops["gelu"] > baseline.ops["gelu"]
        assert ns["SAVED_OPS"] == SAVED_OPS  # the same policy as the workbench's
    run.train().assert_learns()


def test_checkpoint_target_auto_makes_the_user_name_the_block(tmp_path: Path) -> None:
    code = to_snippet(TrainConfig(activation_checkpointing="full"), device="cpu")
    assert "checkpoint_target='auto'" in code and "YOUR model" in code
    ns = load(TrainConfig(activation_checkpointing="full"), tmp_path)
    with pytest.raises(TypeError, match="checkpoint_target"):
        ns["optimize_model"](UserNet())
    model = ns["optimize_model"](UserNet(), checkpoint_target="blocks.1")
    assert isinstance(model.blocks[1].forward, functools.partial)
    assert not isinstance(model.blocks[0].forward, functools.partial)
    with pytest.raises(ValueError, match="matches no module"):
        ns["optimize_model"](UserNet(), checkpoint_target="NoSuchBlock")


def test_grad_accumulation_equals_one_big_batch(tmp_path: Path) -> None:
    micro = [(x, y) for x, y in zip(DATASET.tensors[0][:8].split(4), DATASET.tensors[1][:8].split(4))]
    runs = {}
    for n, batches in ((2, micro), (1, [(DATASET.tensors[0][:8], DATASET.tensors[1][:8])])):
        run = Run(load(TrainConfig(grad_accumulation=n, optimizer="sgd"), tmp_path), UserNet())
        run.step(batches)
        runs[n] = run
    for p, q in zip(runs[1].model.parameters(), runs[2].model.parameters()):
        torch.testing.assert_close(p, q)
    Run(load(TrainConfig(grad_accumulation=2, lr=1e-2), tmp_path), UserNet()).train().assert_learns()


def test_loader_settings_reach_the_data_loader(tmp_path: Path) -> None:
    config = TrainConfig(num_workers=2, prefetch_factor=4, persistent_workers=True, lr=1e-2)
    run = Run(load(config, tmp_path), UserNet())
    assert (run.loader.num_workers, run.loader.prefetch_factor, run.loader.persistent_workers) == (2, 4, True)
    assert run.loader.batch_size == 8 and run.loader.pin_memory is False  # pin_memory is CUDA-only
    run.train().assert_learns()


def test_compile_with_a_cheap_backend(tmp_path: Path) -> None:
    config = TrainConfig(compile="max-autotune", compile_backend="eager", compile_dynamic=False, lr=1e-2)
    code = to_snippet(config, device="cpu")
    assert 'torch.compile(model, dynamic=False, backend="eager")' in code  # inductor-only mode left out
    torch._dynamo.reset()
    run = Run(load(config, tmp_path), UserNet())
    assert isinstance(run.model, torch._dynamo.eval_frame.OptimizedModule)
    run.train().assert_learns()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # dynamo really traced it
    torch._dynamo.reset()


def test_attention_backend_holds_in_forward_and_backward(tmp_path: Path) -> None:
    ops = {}
    for backend in ("auto", "math"):
        run = Run(load(TrainConfig(attention_backend=backend, lr=1e-2), tmp_path), UserNet(attention=True))
        ops[backend] = recorded_step(run).ops
        run.train().assert_learns()
    # The control: on CPU, PyTorch's own choice is the flash kernel (forward and backward).
    flash = "_scaled_dot_product_flash_attention_for_cpu"
    assert ops["auto"][flash] == 1 and ops["auto"][f"{flash}_backward"] == 1
    assert not any("flash" in name for name in ops["math"]) and ops["math"]["bmm"] > ops["auto"]["bmm"]


@pytest.mark.parametrize(
    "config",
    [TrainConfig(), TrainConfig(grad_accumulation=2, activation_checkpointing="full"), TrainConfig(batch_size=4)],
    ids=["defaults", "accumulation-auto-target", "batch_size"],
)
def test_the_usage_example_runs_as_written(config: TrainConfig, tmp_path: Path) -> None:
    code = to_snippet(config, device="cpu")
    usage = code.split("# Usage, with your model, dataset and loss function:\n")[1].split("\n\n")[0]
    example = textwrap.dedent("\n".join(line[1:] for line in usage.splitlines()))
    ns = load(config, tmp_path)
    ns.update(MyModel=UserNet, my_dataset=DATASET, loss_fn=mse_on_targets, num_epochs=2)
    exec(example.replace('"MyBlock"', '"Block"'), ns)
    assert torch.isfinite(ns["loss"]) and isinstance(ns["model"], UserNet)


def test_cuda_graphs_snippet_fails_clearly_without_cuda(tmp_path: Path) -> None:
    config = TrainConfig(cuda_graphs=True, amp="bf16")
    code = to_snippet(config)
    # thread_local: the default "global" mode fails if a DataLoader's pin-memory thread allocates mid-capture.
    assert 'torch.cuda.graph(graph, capture_error_mode="thread_local")' in code and "capturable=True" in code
    with pytest.raises(ConfigError, match="CUDA device"):
        to_snippet(config, device="cpu")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; tests/gpu/test_export_cuda.py runs the snippet")
    with pytest.raises(RuntimeError, match=r"CUDA graphs, which need a CUDA device"):
        load(config, tmp_path, device="cuda")


@pytest.mark.parametrize("device", ["cuda'); import os; ('", "", "CUDA"])
def test_bad_device_strings_are_refused(device: str) -> None:
    with pytest.raises(ConfigError, match="device"):
        to_snippet(TrainConfig(), device=device)


# --- every valid combination --------------------------------------------------------


def imported_modules(tree: ast.Module) -> list[str]:
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    return names + [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]


def test_every_valid_combination_compiles_and_imports_no_workbench(tmp_path: Path) -> None:
    configs = valid_configs()
    assert len(configs) > 500
    for i, config in enumerate(configs):
        code = to_snippet(config, device="cuda")
        tree = ast.parse(code)  # SyntaxError names the line
        compile(tree, f"snippet_{i}.py", "exec")
        imported = imported_modules(tree)
        assert "torch" in imported and not any(name.split(".")[0] == "workbench" for name in imported), config
        (tmp_path / f"snippet_{i}.py").write_text(code)
    if not RUFF.exists():
        pytest.skip("ruff is not installed in this environment (pip install -e .[dev])")
    # --isolated: judged by ruff's defaults (88 columns), as a user's project would, not by ours.
    check = subprocess.run(
        [str(RUFF), "check", "--isolated", "--select", "E,F,W,I,B", "--no-cache", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout[-3000:]
    formatted = subprocess.run(
        [str(RUFF), "format", "--isolated", "--check", "--no-cache", str(tmp_path)], capture_output=True, text=True
    )
    assert formatted.returncode == 0, formatted.stdout[-3000:]


@pytest.mark.parametrize(
    "config",
    [
        TrainConfig(),
        TrainConfig(amp="bf16", channels_last=True, activation_checkpointing="full", checkpoint_target="Block"),
        TrainConfig(amp="fp16", activation_checkpointing="selective", num_workers=2, prefetch_factor=4),
        TrainConfig(cuda_graphs=True, compile="default", attention_backend="flash", matmul_precision="high"),
        TrainConfig(compile="default", activation_memory_budget=0.5),
        TrainConfig(compile="max-autotune", compile_fullgraph=True, compiled_autograd=True, amp="fp16"),
        TrainConfig(
            compile="default", float8="rowwise", amp="bf16", activation_checkpointing="full", channels_last=True
        ),
        TrainConfig(compile="default", float8="tensorwise", attention_backend="flex"),
        TrainConfig(activation_offload="auto", activation_checkpointing="full"),
        TrainConfig(activation_offload="encoder.*", compile="default", activation_memory_budget=0.5),
    ],
    ids=[
        "defaults",
        "bf16-ckpt",
        "fp16-selective-loader",
        "cuda-graphs",
        "memory-budget",
        "compiled-autograd",
        "float8-rowwise",
        "float8-tensorwise-flex",
        "offload-auto-ckpt",
        "offload-glob-compile",
    ],
)
def test_representative_snippets_pass_ruff_from_stdin(config: TrainConfig) -> None:
    if not RUFF.exists():
        pytest.skip("ruff is not installed in this environment (pip install -e .[dev])")
    result = subprocess.run(
        [str(RUFF), "check", "--select", "E,F,W", "--stdin-filename", "snippet.py", "-"],
        input=to_snippet(config),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout


# --- JSON, command line, dispatch ---------------------------------------------------

CONFIGS = [
    TrainConfig(),
    TrainConfig(amp="bf16", channels_last=True, lr=3e-4, seed=7, extra={"sample_cost_ms": 5, "name": "x y"}),
    TrainConfig(
        compile="max-autotune-no-cudagraphs",
        compile_fullgraph=True,
        compile_dynamic=False,
        compile_backend="aot_eager",
        cuda_graphs=True,
        num_workers=2,
        prefetch_factor=4,
        persistent_workers=True,
        pin_memory=True,
        batch_size=3,
    ),
    TrainConfig(activation_checkpointing="selective", checkpoint_target="encoder.*", grad_accumulation=4),
    TrainConfig(extra={"flag": True, "ratio": 0.5, "label": "7", "none": None}),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_json_round_trips(config: TrainConfig) -> None:
    text = to_json(config)
    assert text.count("\n") > len(TrainConfig().to_dict())  # indented, one field a line
    assert TrainConfig.from_json(text) == config


@pytest.mark.parametrize("config", CONFIGS)
def test_command_parses_back_to_the_same_config(config: TrainConfig) -> None:
    argv = shlex.split(to_command(config, workload="planner", preset="base", steps=7, warmup=1))
    assert argv[0] == "workbench"
    args = build_parser().parse_args(argv[1:])
    rebuilt = TrainConfig()
    for text in args.overrides:
        rebuilt = rebuilt.with_overrides(text)
    assert rebuilt == config
    assert (args.command, args.workload, args.preset, args.steps, args.warmup) == ("run", "planner", "base", 7, 1)
    assert len(args.overrides) == len(TrainConfig().diff(config))  # only non-default fields


def test_torchrun_command_form() -> None:
    config = TrainConfig(amp="bf16")
    argv = shlex.split(to_command(config, nproc_per_node=2))
    assert argv[:4] == ["torchrun", "--nproc_per_node=2", "-m", "workbench.cli"]
    args = build_parser().parse_args(argv[4:])
    assert args.overrides == ["amp=bf16"] and args.workload == "bev-perception"
    with pytest.raises(ConfigError, match="nproc_per_node"):
        to_command(config, nproc_per_node=0)


def test_values_the_command_line_cannot_carry_are_refused() -> None:
    with pytest.raises(ConfigError, match="--set"):
        to_command(TrainConfig(extra={"sizes": [1, 2]}))  # the comma would split the override


def test_export_config_dispatches_and_names_the_formats() -> None:
    config = TrainConfig(amp="bf16")
    assert export_config(config, "snippet", device="cpu") == to_snippet(config, device="cpu")
    assert export_config(config, "json") == to_json(config)
    assert export_config(config, "command", steps=5) == to_command(config, steps=5)
    with pytest.raises(ConfigError, match="snippet, json, command"):
        export_config(config, "yaml")
    assert FORMATS == ("snippet", "json", "command")


# --- batches that are not (inputs, targets): Hugging Face dicts, DETR's per-image labels --------------


class DictBatchLM(nn.Module):
    """Shaped like a Hugging Face model: keyword inputs, labels in, an output object with .loss."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(30, 16), nn.Linear(16, 30)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> Any:
        logits = self.head(self.embed(input_ids) * attention_mask.unsqueeze(-1))
        return type("Output", (), {"loss": F.cross_entropy(logits.flatten(0, 1), labels.flatten()), "logits": logits})


class TokenDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = (torch.arange(8) * (index + 1)) % 30
        return {"input_ids": ids, "attention_mask": torch.ones(8), "labels": ids}


@pytest.mark.parametrize("config", [TrainConfig(), TrainConfig(amp="bf16", grad_accumulation=2)], ids=str)
def test_a_dict_batch_model_with_its_own_loss_runs_as_pasted(config: TrainConfig, tmp_path: Path) -> None:
    ns = load(config, tmp_path)
    model = ns["optimize_model"](DictBatchLM())
    optimizer = ns["make_optimizer"](model)
    data = itertools.cycle(ns["make_loader"](TokenDataset(), batch_size=4))
    losses = [
        float(ns["train_step"](model, optimizer, [next(data) for _ in range(ns["GRAD_ACCUMULATION"])]))
        for _ in range(12)
    ]
    assert losses[0] == pytest.approx(float(torch.log(torch.tensor(30.0))), abs=0.6)  # the model's own loss
    assert sum(losses[-3:]) < sum(losses[:3])


class BoxNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.boxes = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 4 * 3)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.boxes(self.conv(images).mean((2, 3))).view(-1, 3, 4)  # 3 box queries per image


class DetectionDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        generator = torch.Generator().manual_seed(index)
        count = 1 + index % 3  # a different number of objects per image
        return torch.randn(3, 8, 8, generator=generator), {"boxes": torch.rand(count, 4, generator=generator)}


def detection_collate(samples: list[Any]) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    return torch.stack([image for image, _ in samples]), [labels for _, labels in samples]


def matched_box_loss(output: torch.Tensor, batch: Any) -> torch.Tensor:
    """DETR-style: match each target to its nearest query by reading the cost matrix back."""
    total = output.new_zeros(())
    for queries, labels in zip(output, batch[1], strict=True):
        cost = torch.cdist(labels["boxes"], queries.detach())
        picked = cost.argmin(dim=1).tolist()
        total = total + F.l1_loss(queries[picked], labels["boxes"])
    return total / len(batch[1])


def test_a_detection_batch_with_per_image_labels_runs_as_pasted(tmp_path: Path) -> None:
    ns = load(TrainConfig(channels_last=True), tmp_path)
    model = ns["optimize_model"](BoxNet())
    optimizer = ns["make_optimizer"](model)
    loader = ns["make_loader"](DetectionDataset(), batch_size=4, collate_fn=detection_collate)
    losses = [float(ns["train_step"](model, optimizer, [batch], matched_box_loss)) for batch in loader]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))


def test_the_snippet_sets_the_measured_intra_op_threads(tmp_path: Path) -> None:
    assert "set_num_threads" not in to_snippet(TrainConfig(), device="cpu")
    load(TrainConfig(intra_op_threads=2), tmp_path)
    assert torch.get_num_threads() == 2  # the autouse fixture restores the count afterwards


# --- the compiler-level levers ----------------------------------------------------------------


def test_the_memory_budget_is_set_before_the_first_compiled_call(tmp_path: Path) -> None:
    import torch._functorch.config as functorch_config

    config = TrainConfig(
        compile="default", compile_backend="aot_eager_decomp_partition", activation_memory_budget=0.4, lr=1e-2
    )
    torch._dynamo.reset()
    with functorch_config.patch(activation_memory_budget=1.0):  # the snippet sets a process global
        run = Run(load(config, tmp_path), UserNet())
        assert functorch_config.activation_memory_budget == 0.4
        run.train(steps=6).assert_learns()
    torch._dynamo.reset()


# Compiled autograd reads `.grad` of its own fake non-leaf tensors while capturing, and torch 2.13
# warns about it; the pasted snippet keeps plain PyTorch's behaviour (the warning is shown).
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_compiled_autograd_compiles_the_pasted_backward(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    config = TrainConfig(compile="default", compile_backend="aot_eager", compiled_autograd=True, lr=1e-2)
    code = to_snippet(config, device="cpu")
    assert 'BACKWARD_COMPILER = torch.compile(backend="aot_eager")' in code
    torch._dynamo.reset()
    counters.clear()
    run = Run(load(config, tmp_path), UserNet())
    run.train(steps=6).assert_learns()
    assert counters["compiled_autograd"]["captures"] >= 1
    torch._dynamo.reset()


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
def test_flex_attention_snippet_routes_attention_fn_modules(tmp_path: Path) -> None:
    """Forward only on CPU: torch 2.13 has no FlexAttention backward there."""
    from workbench.workloads.layers import SelfAttention

    config = TrainConfig(attention_backend="flex", compile="default")
    ns = load(config, tmp_path)
    assert "    use_flex_attention(model)\n    # Compile last" in to_snippet(config)
    torch.manual_seed(0)
    model = nn.Sequential(SelfAttention(16, 2, causal=True), SelfAttention(16, 2))
    x = torch.randn(2, 24, 16)
    with torch.no_grad():
        reference = model(x)
        assert ns["use_flex_attention"](model) == 2
        torch.testing.assert_close(model(x), reference, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="no module of the model has an attention_fn"):
        ns["use_flex_attention"](UserNet())


def snippet_float8_filter(recipe: str) -> Any:
    """The snippet's `float8_worth_converting`, run on its own (the snippet itself imports torchao)."""
    code = to_snippet(TrainConfig(float8=recipe, compile="default", amp="bf16"))
    assert f'Float8LinearConfig.from_recipe_name("{recipe}")' in code
    tree = ast.parse(code)
    (function,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "float8_worth_converting"]
    ns: dict[str, Any] = {"nn": nn}
    exec(compile(ast.Module([function], type_ignores=[]), "snippet", "exec"), ns)
    return ns["float8_worth_converting"]


FLOAT8_SIZES = (16, 1000, 1024, 1040, 2048, 2064, 4096, 4112, 8192)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_float8_filter_in_the_snippet_agrees_with_the_shape_check(recipe: str) -> None:
    from workbench.levers.float8 import float8_worth_converting

    keep = snippet_float8_filter(recipe)
    for in_features, out_features in itertools.product(FLOAT8_SIZES, FLOAT8_SIZES):
        linear = nn.Linear(in_features, out_features, device="meta")
        expected = float8_worth_converting(in_features, out_features, recipe)[0]
        assert keep(linear, "layer") is expected, (in_features, out_features)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_float8_filter_in_the_snippet_is_torchaos_filter(recipe: str) -> None:
    """The truth is torchao's own `_auto_filter_for_recipe`, not the workbench's copy of its rule."""
    keep = snippet_float8_filter(recipe)
    shapes = list(itertools.product(FLOAT8_SIZES, FLOAT8_SIZES))
    truth = torchao_verdicts(shapes, recipe)
    ours = [keep(nn.Linear(i, o, device="meta"), "layer") for i, o in shapes]
    wrong = [shape for shape, mine, theirs in zip(shapes, ours, truth, strict=True) if mine != theirs]
    assert not wrong, f"(in, out) where the snippet's filter differs from torchao's: {wrong}"


def test_the_offload_snippet_wraps_the_named_modules_after_checkpointing(tmp_path: Path) -> None:
    """Pinned host memory needs CUDA, so on CPU the wrapping is checked, not a forward (tests/gpu)."""
    config = TrainConfig(activation_offload="Block", activation_checkpointing="full", checkpoint_target="Block")
    code = to_snippet(config, device="cuda")
    assert code.index("checkpoint_modules(model, CHECKPOINT_TARGET)") < code.index(
        "offload_modules(model, OFFLOAD_TARGET)"
    )
    assert 'OFFLOAD_TARGET = "Block"' in code
    ns = load(config, tmp_path)
    model = UserNet()
    blocks = [name for name, m in model.named_modules() if type(m).__name__ == "Block"]
    assert ns["offload_modules"](model, "Block") == blocks and len(blocks) == 2
    auto = to_snippet(TrainConfig(activation_offload="auto"))
    assert "OFFLOAD_TARGET = \"MyBlock\"  # the workbench's 'auto'" in auto and "    return model" in auto
