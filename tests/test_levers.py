"""CPU tests of the compiler- and hardware-level levers: activation memory budget, compiled autograd,
FlexAttention, float8's shape check and activation offload. Each is checked against an independent
observation of the step (bytes autograd holds for backward, dynamo's capture counters, SDPA's
output, hand-computed GEMM shapes), never against the lever's own record."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import ConfigError, TrainConfig
from workbench.measure.memory import saved_for_backward_bytes
from workbench.optimizations import TrainStep, build
from workbench.workloads.base import Workload

# --- a token MLP: linear layers with pointwise ops between, what the partitioner can recompute ---


class TokenMLP(nn.Module):
    def __init__(self, width: int = 32, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            *(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)) for _ in range(depth))
        )
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.blocks(x)))


def mlp_batch(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 64, 32, generator=generator), torch.randn(n, 64, 1, generator=generator)


def mlp_workload() -> Workload:
    return Workload.from_callables(
        TokenMLP, lambda out, batch: F.mse_loss(out, batch[1]), batch_fn=mlp_batch, batch_size=4, name="token-mlp"
    )


def fresh_build(config: TrainConfig) -> TrainStep:
    """build() as a fresh trial worker runs it: dynamo's code cache is keyed on the forward's code
    and guarded on tensors, not on compiler settings, so a second model of the same class in one
    process would reuse the first one's compiled graph (and its partitioning)."""
    torch._dynamo.reset()
    return build(mlp_workload(), config, "cpu")


def first_batch(step: TrainStep) -> Any:
    return step.prepare_batch(next(iter(step.workload.batches(step.config))))


def held_activation_bytes(step: TrainStep) -> int:
    """Bytes autograd holds for backward after one forward of the step, parameters left out."""
    loss = step.forward_loss(first_batch(step))
    return saved_for_backward_bytes(loss, exclude=list(step.base_model.parameters()))


# --- activation memory budget ----------------------------------------------------------------


def test_a_lower_memory_budget_holds_fewer_activations_and_keeps_the_numbers() -> None:
    """The min-cut partitioner (aot_eager_decomp_partition: inductor's partitioner without codegen)
    keeps less for backward as the budget falls; recomputation gives the same loss and gradients."""
    held, losses, grads = {}, {}, {}
    for budget in (1.0, 0.5, 0.0):
        config = TrainConfig(
            compile="default", compile_backend="aot_eager_decomp_partition", activation_memory_budget=budget
        )
        step = fresh_build(config)
        held[budget] = held_activation_bytes(step)
        loss = step.forward_loss(first_batch(step))
        loss.backward()
        losses[budget] = loss.detach()
        grads[budget] = torch.cat([p.grad.flatten() for p in step.base_model.parameters()])
        records = {a.toggle: a for a in step.applied}
        assert ("activation_memory_budget" in records) == (budget < 1.0)
    assert held[1.0] > held[0.5] > held[0.0] > 0, held
    # Budget 0 keeps what checkpointing the whole graph would: its input, nothing per layer.
    assert held[0.0] <= 4 * 64 * 32 * 4 * 2, held
    for budget in (0.5, 0.0):
        torch.testing.assert_close(losses[budget], losses[1.0])
        torch.testing.assert_close(grads[budget], grads[1.0], rtol=1e-5, atol=1e-6)


def test_the_memory_budget_reaches_inductor_too() -> None:
    """The real compiler: inductor's compiled forward saves less at budget 0 than at 1."""
    held = {}
    for budget in (1.0, 0.0):
        step = fresh_build(TrainConfig(compile="default", activation_memory_budget=budget))
        held[budget] = held_activation_bytes(step)
    assert held[0.0] < held[1.0] / 2, held


def test_the_budget_is_scoped_to_the_step() -> None:
    import torch._functorch.config as functorch_config

    step = fresh_build(
        TrainConfig(compile="default", compile_backend="aot_eager_decomp_partition", activation_memory_budget=0.25)
    )
    step.forward_loss(first_batch(step))
    assert functorch_config.activation_memory_budget == 1.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"activation_memory_budget": 1.5}, "from 0 to 1"),
        ({"activation_memory_budget": -0.1}, "from 0 to 1"),
        ({"activation_memory_budget": "half"}, "from 0 to 1"),
        ({"activation_memory_budget": True}, "from 0 to 1"),
        ({"activation_memory_budget": 0.5}, "compile=off; set compile=default"),
        ({"activation_memory_budget": 0.5, "compile": "default", "compile_backend": "eager"}, "use compile_backend="),
        ({"activation_memory_budget": 0.5, "compile": "default", "compile_backend": "aot_eager"}, "min-cut"),
    ],
)
def test_memory_budget_validation_says_how_to_fix_it(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**changes)


def test_memory_budget_capabilities_on_cpu_and_override_parsing() -> None:
    from workbench.device import capabilities

    table = capabilities("cpu")["activation_memory_budget"]
    assert table[1.0].available and "off" in table[1.0].reason
    assert table[0.5].available and "compile" in table[0.5].reason
    config = TrainConfig().with_overrides("compile=default,activation_memory_budget=0.3")
    assert config.activation_memory_budget == 0.3


# --- compiled autograd -------------------------------------------------------------------------


def backward_captures(config: TrainConfig, steps: int = 2) -> tuple[int, torch.Tensor]:
    """Compiled-autograd captures dynamo counted over a few steps, and the first step's gradients."""
    from torch._dynamo.utils import counters

    step = fresh_build(config)
    counters.clear()
    batches = iter(step.workload.batches(config))
    grads = None
    for _ in range(steps):
        step([step.prepare_batch(next(batches))])
        if grads is None:
            grads = torch.cat([p.grad.flatten() for p in step.base_model.parameters()])
    assert grads is not None
    return counters["compiled_autograd"]["captures"], grads


def test_compiled_autograd_captures_and_compiles_the_backward() -> None:
    plain = TrainConfig(compile="default", compile_backend="aot_eager", lr=0.05)
    captures_off, grads_off = backward_captures(plain)
    captures_on, grads_on = backward_captures(plain.replace(compiled_autograd=True))
    assert captures_off == 0
    assert captures_on >= 1  # the backward went through dynamo: a compiled backward graph
    torch.testing.assert_close(grads_on, grads_off, rtol=1e-5, atol=1e-6)
    step = fresh_build(plain.replace(compiled_autograd=True))
    assert any(a.toggle == "compiled_autograd" for a in step.applied)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"compiled_autograd": True}, "compile=off; set compile=default"),
        ({"compiled_autograd": "yes"}, "true or false"),
        ({"compiled_autograd": True, "compile": "default", "strategy": "ddp"}, "Python reducer"),
    ],
)
def test_compiled_autograd_validation_says_how_to_fix_it(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**changes)


def test_compiled_autograd_capability_on_cpu() -> None:
    from workbench.device import capabilities

    table = capabilities("cpu")["compiled_autograd"]
    assert table[False].available and table[True].available and "compile" in table[True].reason
