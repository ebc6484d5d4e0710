"""CUDA tests of the levers that need a GPU: float8 training (torchao, compute capability 8.9+)
and activation offload to pinned host memory. They skip themselves without CUDA (and float8
without torchao or a float8-capable GPU); `scripts/gpu-check` runs them."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import TrainConfig
from workbench.levers import TrainStep, build
from workbench.workloads.base import Workload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class WideMLP(nn.Module):
    """Two 4096-wide projections (worth float8) and a small head (not worth it)."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.head = nn.Linear(4096, 8192), nn.Linear(8192, 4096), nn.Linear(4096, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.down(F.gelu(self.up(x))))


def wide_batch(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 512, 4096, generator=generator), torch.randn(n, 512, 16, generator=generator)


def wide_workload() -> Workload:
    return Workload.from_callables(
        WideMLP, lambda out, b: F.mse_loss(out.float(), b[1]), batch_fn=wide_batch, batch_size=4, name="wide-mlp"
    )


def losses(step: TrainStep, steps: int = 3) -> list[float]:
    batches = iter(step.workload.batches(step.config))
    return [float(step([step.prepare_batch(next(batches))])) for _ in range(steps)]


def _float8_ready() -> bool:
    return (
        torch.cuda.is_available()
        and torch.cuda.get_device_capability() >= (8, 9)
        and importlib.util.find_spec("torchao") is not None
    )


@pytest.mark.skipif(not _float8_ready(), reason="needs compute capability 8.9+ and torchao")
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_converts_the_linears_torchao_would_and_trains_like_bf16(recipe: str) -> None:
    """Which Linears convert is checked against torchao's own filter, not the workbench's plan."""
    from torchao.float8.float8_linear import Float8Linear
    from torchao.float8.float8_linear_utils import _auto_filter_for_recipe

    base = TrainConfig(amp="bf16", compile="default", lr=1e-4)
    float8 = build(wide_workload(), base.replace(float8=recipe), "cuda")
    keep = _auto_filter_for_recipe(recipe, filter_fqns=[])
    torchao_picks = {name for name, m in WideMLP().named_modules() if name and keep(m, name)}
    converted = {name for name, m in float8.base_model.named_modules() if isinstance(m, Float8Linear)}
    assert converted == torchao_picks == {"up", "down"}
    reference = losses(build(wide_workload(), base, "cuda"))
    measured = losses(float8)
    assert all(torch.isfinite(torch.tensor(measured)))
    torch.testing.assert_close(torch.tensor(measured), torch.tensor(reference), rtol=0.05, atol=1e-3)


def _torchao_trains_in_float8_here(recipe: str) -> tuple[bool, str]:
    """Without the workbench: can torchao convert a Linear and run forward and backward on this GPU?"""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:
        return False, f"torchao is not importable: {exc}"
    model = nn.Sequential(nn.Linear(4096, 4096, bias=False)).cuda()
    try:
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(torch.randn(256, 4096, device="cuda")).float().square().mean()
        loss.backward()
        torch.cuda.synchronize()
    except Exception as exc:  # any failure to run (no float8 GEMM on this GPU, a torch/torchao mismatch)
        return False, f"{type(exc).__name__}: {exc}"
    return bool(torch.isfinite(loss)), f"one float8 step ran, loss {float(loss):.4g}"


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_capability_matches_whether_torchao_can_train_here(recipe: str) -> None:
    """The truth is a float8 step run with torchao directly: claimed available means it runs."""
    from workbench.levers import capabilities

    runs, how = _torchao_trains_in_float8_here(recipe)
    claimed = capabilities("cuda")["float8"][recipe]
    assert claimed.available == runs, f"capability says {claimed.reason!r}; torchao directly: {how}"
    if runs:  # and the workbench's own path trains too
        step = build(wide_workload(), TrainConfig(amp="bf16", compile="default", float8=recipe), "cuda")
        assert all(torch.isfinite(torch.tensor(losses(step, steps=1))))


class Blocks(nn.Module):
    """Four wide MLP blocks: their saved activations dominate the step's memory."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            *(nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)) for _ in range(4))
        )
        self.head = nn.Linear(1024, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def blocks_batch(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 1024, 1024, generator=generator), torch.randn(n, 1024, 16, generator=generator)


def test_offload_moves_saved_activations_off_the_gpu_and_keeps_gradients() -> None:
    workload = Workload.from_callables(
        Blocks, lambda out, b: F.mse_loss(out, b[1]), batch_fn=blocks_batch, batch_size=8, name="blocks"
    )
    held, grads = {}, {}
    for offload in ("off", "blocks.*"):
        step = build(workload, TrainConfig(activation_offload=offload), "cuda")
        batch = step.prepare_batch(next(iter(workload.batches(step.config))))
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        loss = step.forward_loss(batch)
        torch.cuda.synchronize()
        held[offload] = torch.cuda.memory_allocated() - before
        loss.backward()
        grads[offload] = torch.cat([p.grad.flatten() for p in step.base_model.parameters()])
        del step, loss, batch
    # Four blocks of 8x1024x4096 fp32 GELU inputs/outputs stay on the GPU without offload.
    assert held["blocks.*"] < held["off"] / 4, held
    torch.testing.assert_close(grads["blocks.*"], grads["off"], rtol=1e-4, atol=1e-5)


def test_offloaded_forward_and_backward_never_make_the_host_wait() -> None:
    """The copies to pinned host memory and back are non-blocking: under CUDA's sync debug mode
    "error" any synchronizing call (a blocking copy, a stream sync) raises. Gradients are checked
    against the same model without offload."""
    from workbench.levers.offload import apply_activation_offload

    torch.manual_seed(0)
    model, reference = Blocks().cuda(), Blocks().cuda()
    reference.load_state_dict(model.state_dict())
    apply_activation_offload(model, "blocks.*")
    x, y = (t.cuda() for t in blocks_batch(2, torch.Generator().manual_seed(0)))
    F.mse_loss(model(x), y).backward()  # first pass: pinned host blocks are allocated, kernels load
    model.zero_grad()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        F.mse_loss(model(x), y).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    F.mse_loss(reference(x), y).backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_flex_attention_trains_like_sdpa_on_the_vlm() -> None:
    """FlexAttention, compiled, in the VLM's causal text and bidirectional vision blocks: same losses."""
    from workbench.levers import capabilities
    from workbench.workloads import load_workload

    assert capabilities("cuda")["attention_backend"]["flex"].available
    workload = load_workload("driving-vlm", "tiny")
    base = TrainConfig(compile="default", lr=1e-3)
    flex = build(workload, base.replace(attention_backend="flex"), "cuda")
    assert any(a.toggle == "attention_backend" and a.value == "flex" for a in flex.applied)
    torch._dynamo.reset()
    reference = losses(build(workload, base, "cuda"))
    torch._dynamo.reset()
    measured = losses(flex)
    torch.testing.assert_close(torch.tensor(measured), torch.tensor(reference), rtol=2e-3, atol=1e-4)
