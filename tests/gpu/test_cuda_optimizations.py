"""CUDA tests of `workbench.levers`: CUDA-graph capture and replay, fp16 GradScaler, SDPA
kernels, TF32 scoping. They skip themselves without a GPU and run on a lent GPU machine
(`scripts/gpu-check`); no mock stands in for the device."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import islice
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from workbench.config import ConfigError, TrainConfig
from workbench.levers import TrainStep, build
from workbench.workloads.base import Workload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class GpuToyNet(nn.Module):
    """Conv stem with BatchNorm (buffers mutate in the graph) and one attention block."""

    def __init__(self, c: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.GELU())
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.qkv, self.proj, self.head = nn.Linear(c, 3 * c), nn.Linear(c, c), nn.Linear(c, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.conv(self.stem(x)).flatten(2).transpose(1, 2)
        b, n, c = f.shape
        q, k, v = self.qkv(f).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        f = f + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))
        return self.head(f.mean(1))


def _batch(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 16, 16, generator=generator), torch.randn(n, 4, generator=generator)


def _loss(output: torch.Tensor, batch: Any) -> torch.Tensor:
    return F.mse_loss(output.float(), batch[1])


WORKLOAD = Workload.from_callables(GpuToyNet, _loss, batch_fn=_batch, batch_size=8, name="gpu-toy")


def _steps(step: TrainStep, config: TrainConfig, count: int) -> list[list[Any]]:
    batches = [step.prepare_batch(b) for b in islice(WORKLOAD.batches(config), count * config.grad_accumulation)]
    return [batches[i : i + config.grad_accumulation] for i in range(0, len(batches), config.grad_accumulation)]


class OpNames(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"grad_accumulation": 2, "amp": "bf16", "channels_last": True, "optimizer_impl": "fused"},
        {"optimizer": "sgd", "optimizer_impl": "foreach"},
        {"compile": "default", "compile_backend": "aot_eager"},
    ],
    ids=["fp32", "bf16-accum-channels_last-fused", "sgd", "aot_eager"],
)
def test_cuda_graph_step_follows_the_eager_trajectory(changes: dict[str, Any]) -> None:
    config = TrainConfig(lr=3e-3, **changes)
    eager = build(WORKLOAD, config, "cuda")
    graphed = build(WORKLOAD, config.replace(cuda_graphs=True), "cuda")
    assert graphed.graphed is not None and graphed.applied[-1].toggle == "cuda_graphs"
    if config.optimizer == "adamw":
        assert graphed.optimizer.param_groups[0]["capturable"] is True
    steps = _steps(graphed, config, 6)
    marks: list[str] = []
    graphed_losses = torch.stack([graphed(s, marks.append) for s in steps])
    eager_losses = torch.stack([eager(s) for s in steps])
    assert marks == ["step"] * 6 and graphed.graphed.replays == 6
    tolerance = {"rtol": 2e-2, "atol": 2e-3} if config.amp == "bf16" else {"rtol": 1e-3, "atol": 1e-4}
    torch.testing.assert_close(graphed_losses, eager_losses, **tolerance)
    # Warm-up was undone: parameters and BatchNorm statistics match the eager run's.
    for p, q in zip(eager.base_model.state_dict().values(), graphed.base_model.state_dict().values()):
        torch.testing.assert_close(q.float(), p.float(), **tolerance)
    # Replays train: the loss on one repeated step falls.
    first = graphed(steps[0])
    for _ in range(30):
        last = graphed(steps[0])
    assert float(last) < float(first)
    assert graphed.graphed.replays == 37


def test_cuda_graphs_refuse_new_shapes_and_checkpointing() -> None:
    config = TrainConfig(cuda_graphs=True)
    step = build(WORKLOAD, config, "cuda")
    (batch,) = _steps(step, config, 1)[0]
    step([batch])
    with pytest.raises(ValueError, match="fixed batch shapes"):
        step([(batch[0][:4], batch[1][:4])])
    with pytest.raises(ConfigError, match="activation checkpointing"):
        build(WORKLOAD, config.replace(activation_checkpointing="full", checkpoint_target="stem"), "cuda")


def test_capture_survives_another_thread_pinning_host_memory() -> None:
    """A DataLoader with num_workers > 0 and pin_memory=true has a pin-memory thread that allocates
    pinned host memory (cuMemHostAlloc) whenever it stages a batch. Under the default "global"
    capture mode such a call on any thread fails the capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
    Here a thread allocates and frees pinned blocks throughout warm-up and capture."""
    import sys
    import threading

    from workbench.trials import run_trial

    config = TrainConfig(cuda_graphs=True)
    step = build(WORKLOAD, config, "cuda")
    (batch,) = _steps(step, config, 1)[0]
    stop, started, errors = threading.Event(), threading.Event(), []
    empty_host_cache = getattr(torch._C, "_host_emptyCache", lambda: None)  # else the allocator reuses blocks

    def pin() -> None:
        try:
            while not stop.is_set():
                torch.randn(1 << 14).pin_memory()
                empty_host_cache()
                started.set()
        except Exception as exc:  # the error the pinning thread would meet
            errors.append(exc)
            started.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave the threads finely, as a busy loader thread would
    thread = threading.Thread(target=pin, daemon=True)
    thread.start()
    try:
        assert started.wait(10)
        loss = step([batch])  # warm-up on a side stream, then capture, then the first replay
    finally:
        stop.set()
        thread.join(10)
        sys.setswitchinterval(interval)
    assert not errors, errors
    assert step.graphed is not None and step.graphed.replays == 1 and torch.isfinite(loss)
    # And the configuration the tuner offers: a real DataLoader with workers and pinned batches.
    result = run_trial(WORKLOAD, TrainConfig(cuda_graphs=True, num_workers=2, pin_memory=True), steps=5, warmup=2,
                       device="cuda", track_memory=False, isolation="inline")  # fmt: skip
    assert result.ok, result.message


@pytest.mark.parametrize("impl", ["for-loop", "fused"])
def test_fp16_grad_scaler_step(impl: str) -> None:
    config = TrainConfig(amp="fp16", optimizer_impl=impl, lr=3e-3)
    step = build(WORKLOAD, config, "cuda")
    assert isinstance(step.scaler, torch.amp.GradScaler)
    seen: list[torch.dtype] = []
    step.base_model.head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    steps = _steps(step, config, 1)
    losses = [step(steps[0]) for _ in range(15)]
    assert seen[0] == torch.float16
    assert all(torch.isfinite(loss) for loss in losses) and float(losses[-1]) < float(losses[0])
    assert step.scaler.get_scale() > 0


def test_flash_attention_backend_runs_the_flash_kernel() -> None:
    if torch.cuda.get_device_capability() < (8, 0) or not torch.backends.cuda.is_flash_attention_available():
        pytest.skip("flash SDPA needs compute capability 8.0+ and a build with flash attention")
    names: dict[str, set[str]] = {}
    for backend in ("flash", "math"):
        config = TrainConfig(amp="bf16", attention_backend=backend)  # flash takes fp16/bf16 only
        step = build(WORKLOAD, config, "cuda")
        recorder = OpNames()
        with recorder:
            loss = step(_steps(step, config, 1)[0])
        assert torch.isfinite(loss)
        names[backend] = recorder.names
    assert "_scaled_dot_product_flash_attention" in names["flash"]
    assert "_scaled_dot_product_flash_attention_backward" in names["flash"]
    assert not any("flash" in n for n in names["math"])


#: Run in a fresh interpreter: what PyTorch does on CUDA when nobody touched anything.
PYTORCH_UNTOUCHED = """
import json, torch
from torch.utils._python_dispatch import TorchDispatchMode

class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))

param = torch.nn.Parameter(torch.randn(8, device="cuda"))
param.grad = torch.ones_like(param)
optimizer = torch.optim.AdamW([param])
with Ops() as ops:
    optimizer.step()
print(json.dumps({
    "matmul_precision": torch.get_float32_matmul_precision(),
    "cudnn_tf32": torch.backends.cudnn.allow_tf32,
    "foreach": any(name.startswith("_foreach_") for name in ops.names),
}))
"""


def _flags() -> tuple[str, bool, bool]:
    """float32 matmul precision, cuDNN's TF32 switch, and the cuBLAS TF32 switch it implies."""
    return torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32


def test_defaults_run_what_pytorch_runs_untouched_on_cuda() -> None:
    proc = subprocess.run([sys.executable, "-c", PYTORCH_UNTOUCHED], capture_output=True, text=True, check=True)
    expected = json.loads(proc.stdout)
    # What the issue promises, as a fresh PyTorch reports it: foreach optimizer, cuDNN TF32 on, matmuls 'highest'.
    assert (expected["foreach"], expected["cudnn_tf32"], expected["matmul_precision"]) == (True, True, "highest")
    config = TrainConfig()
    step = build(WORKLOAD, config, "cuda")
    seen: list[tuple[str, bool, bool]] = []
    step.base_model.register_forward_pre_hook(lambda module, args: seen.append(_flags()))
    ops = OpNames()
    with ops:
        step(_steps(step, config, 1)[0])
    assert seen == [(expected["matmul_precision"], expected["cudnn_tf32"], False)]
    assert any(name.startswith("_foreach_") for name in ops.names) == expected["foreach"]
    records = {a.toggle: a.value for a in step.applied}
    assert records["optimizer"] == "adamw/foreach"
    assert (records["matmul_precision"], records["cudnn_tf32"]) == (
        expected["matmul_precision"],
        expected["cudnn_tf32"],
    )


@pytest.mark.parametrize(
    ("changes", "inside"),
    [({"matmul_precision": "high"}, ("high", True, True)), ({"cudnn_tf32": False}, ("highest", False, False))],
    ids=["matmul-high", "cudnn-tf32-off"],
)
def test_each_tf32_toggle_sets_only_its_flag_scoped_to_the_step(
    changes: dict[str, Any], inside: tuple[str, bool, bool]
) -> None:
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 needs compute capability 8.0+")
    config = TrainConfig(**changes)
    step = build(WORKLOAD, config, "cuda")
    seen: list[tuple[str, bool, bool]] = []
    step.base_model.register_forward_pre_hook(lambda module, args: seen.append(_flags()))
    before = _flags()
    step(_steps(step, config, 1)[0])
    assert seen == [inside]
    assert _flags() == before
