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
from torchao_float8 import torchao_verdicts

from workbench.config import ConfigError, TrainConfig
from workbench.levers import TrainStep, build
from workbench.measure.memory import saved_for_backward_bytes
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
        (
            {"activation_memory_budget": 0.5, "compile": "default", "compile_backend": "aot_eager_default_partitioner"},
            "min-cut",
        ),
    ],
)
def test_memory_budget_validation_says_how_to_fix_it(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**changes)


def test_memory_budget_capabilities_on_cpu_and_override_parsing() -> None:
    from workbench.levers import capabilities

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
    from workbench.levers import capabilities

    table = capabilities("cpu")["compiled_autograd"]
    assert table[False].available and table[True].available and "compile" in table[True].reason


# --- FlexAttention ------------------------------------------------------------------------------


#: Eagerly FlexAttention runs its unfused reference and says so, once per process: intended here.
EAGER_FLEX = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")


@EAGER_FLEX
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_flex_attention_matches_sdpa_within_dtype_tolerance(dtype: torch.dtype, tolerance: float, causal: bool) -> None:
    """Forward only: torch 2.13 has no FlexAttention backward on CPU (the capability says so)."""
    from workbench.levers.flex_attention import flex_sdpa

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 48, 16, generator=generator).to(dtype) for _ in range(3))
    out = flex_sdpa(q, k, v, is_causal=causal)
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), reference, rtol=tolerance, atol=tolerance)


@EAGER_FLEX
def test_flex_attention_replaces_the_workloads_attention_calls() -> None:
    from workbench.levers.flex_attention import apply_flex_attention, attention_modules, flex_sdpa
    from workbench.workloads import load_workload
    from workbench.workloads.layers import SelfAttention

    workload = load_workload("driving-vlm", "tiny")
    torch.manual_seed(0)
    model = workload.model_fn().eval()
    reference_model = workload.model_fn().eval()
    reference_model.load_state_dict(model.state_dict())
    expected = [name for name, m in model.named_modules() if isinstance(m, SelfAttention)]
    record = apply_flex_attention(model)
    assert attention_modules(model) == expected and f"{len(expected)} attention module(s)" in record.detail
    assert all(m.attention_fn is flex_sdpa for m in model.modules() if isinstance(m, SelfAttention))
    batch = next(iter(workload.batches(TrainConfig())))
    with torch.no_grad():
        out = workload.forward_fn(model, batch)
    with torch.no_grad():
        reference = workload.forward_fn(reference_model, batch)
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-5)  # causal text and bidirectional vision
    with pytest.raises(ConfigError, match="no module of TokenMLP calls attention"):
        apply_flex_attention(TokenMLP())


def test_flex_attention_is_refused_on_cpu_with_the_reason_and_needs_compile() -> None:
    from workbench.levers import capabilities

    flex = capabilities("cpu")["attention_backend"]["flex"]
    assert not flex.available and "cannot train on cpu" in flex.reason and "backward" in flex.reason
    with pytest.raises(ConfigError, match="attention_backend=flex is not available on cpu"):
        build(mlp_workload(), TrainConfig(attention_backend="flex", compile="default"), "cpu")
    with pytest.raises(ConfigError, match="needs compile on"):
        TrainConfig(attention_backend="flex")


# --- float8: the per-Linear shape check --------------------------------------------------------


@pytest.mark.parametrize(
    ("in_features", "out_features", "recipe", "convert"),
    [
        # torchao reads N, K = weight.shape: N is out_features, K is in_features.
        (4096, 4096, "tensorwise", True),  # a 4096-wide transformer's projection
        (4096, 16, "tensorwise", False),  # K <= 4096 and N <= 1024: a small head
        (8192, 16, "tensorwise", True),  # K > 4096
        (1024, 2048, "tensorwise", True),  # N > 1024
        (4096, 4096, "rowwise", True),
        (4096, 2048, "rowwise", False),  # torchao's own test case: "N exactly 2048" is rejected
        (8192, 1024, "rowwise", False),  # N <= 2048
        (1024, 8192, "rowwise", False),  # K <= 1024
        (2048, 4096, "rowwise", False),  # N <= 4096 and K <= 2048
        (2048, 8192, "rowwise", True),  # N > 4096
        (4100, 8192, "tensorwise", False),  # 4100 is not a multiple of 16
        (256, 1024, "rowwise", False),  # the tiny presets' widths: nothing to gain
    ],
)
def test_float8_shape_check_classifies_analytic_examples(
    in_features: int, out_features: int, recipe: str, convert: bool
) -> None:
    from workbench.levers.float8 import float8_worth_converting

    verdict, reason = float8_worth_converting(in_features, out_features, recipe)
    assert verdict is convert, reason
    assert f"{in_features}->{out_features}" in reason


FLOAT8_SIZES = (16, 1000, 1024, 1040, 2048, 2064, 4096, 4112, 8192)
"""Every threshold of both recipes, one multiple of 16 past it, and a width that is not one."""


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_shape_check_is_torchaos_own_filter(recipe: str) -> None:
    """The truth is torchao's `_auto_filter_for_recipe`, the filter its own recipes use."""
    import itertools

    from workbench.levers.float8 import float8_worth_converting

    shapes = list(itertools.product(FLOAT8_SIZES, FLOAT8_SIZES))
    truth = torchao_verdicts(shapes, recipe)
    ours = [float8_worth_converting(i, o, recipe)[0] for i, o in shapes]
    wrong = [(shape, mine) for shape, mine, theirs in zip(shapes, ours, truth, strict=True) if mine != theirs]
    assert not wrong, f"(in, out) where our verdict differs from torchao's: {wrong}"
    assert any(truth) and not all(truth)  # the grid straddles the thresholds


def test_float8_plan_and_module_filter_agree_and_skip_by_name() -> None:
    from workbench.levers.float8 import float8_module_filter, float8_plan

    model = nn.ModuleDict(
        {
            "up": nn.Linear(4096, 16384),
            "down": nn.Linear(16384, 4096),
            "head": nn.Linear(4096, 32),
            "norm": nn.LayerNorm(8),
        }
    )
    plan = {v.name: v for v in float8_plan(model, "rowwise", skip=("down",))}
    assert set(plan) == {"up", "down", "head"}  # nn.Linear only
    assert plan["up"].convert and not plan["head"].convert
    assert not plan["down"].convert and plan["down"].reason == "skipped by the module filter"
    keep = float8_module_filter("rowwise", skip=("down",))
    assert {name for name, m in model.named_modules() if keep(m, name)} == {"up"}
    with pytest.raises(ConfigError, match="tensorwise' or 'rowwise"):
        float8_plan(model, "delayed")


def test_float8_is_unavailable_on_cpu_and_refused_without_compile() -> None:
    from workbench.levers import capabilities

    table = capabilities("cpu")["float8"]
    assert table["off"].available
    for recipe in ("tensorwise", "rowwise"):
        assert not table[recipe].available and "compute capability 8.9+" in table[recipe].reason
    with pytest.raises(ConfigError, match="float8=rowwise is not available on cpu"):
        build(mlp_workload(), TrainConfig(float8="rowwise", compile="default"), "cpu")
    with pytest.raises(ConfigError, match="needs compile on"):
        TrainConfig(float8="tensorwise")
    with pytest.raises(ConfigError, match="float8='fp8' is not valid"):
        TrainConfig(float8="fp8")


def test_float8_refuses_a_model_with_nothing_worth_converting_and_names_the_extra() -> None:
    import importlib.util

    from workbench.levers.float8 import apply_float8

    with pytest.raises(ConfigError, match=r"no nn\.Linear of TokenMLP is large enough"):
        apply_float8(TokenMLP(), "rowwise")
    if importlib.util.find_spec("torchao") is None:  # the core's own environment: no torchao
        with pytest.raises(ConfigError, match=r"training-workbench\[float8\]"):
            apply_float8(nn.Sequential(nn.Linear(8192, 8192)), "rowwise")


def test_the_core_imports_without_torchao() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torchao'] = None\n"  # an import of torchao now fails
        "import workbench.levers, workbench.device, workbench.export, workbench.tune\n"
        "from workbench.levers import capabilities; capabilities('cpu')\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


# --- activation offload (CPU: which modules, validation, refusal; the memory effect is a GPU test) ---


def test_offload_wraps_the_matching_modules_and_keeps_gradients() -> None:
    from workbench.levers.offload import apply_activation_offload, offloaded_modules

    torch.manual_seed(0)
    model, reference = TokenMLP(), TokenMLP()
    reference.load_state_dict(model.state_dict())
    record = apply_activation_offload(model, "blocks.*", pin_memory=False)  # pinned memory needs CUDA
    assert offloaded_modules(model) == ["blocks.0", "blocks.1", "blocks.2"] and "3 Sequential" in record.detail
    apply_activation_offload(model, "blocks.*", pin_memory=False)  # twice: still wrapped once
    assert offloaded_modules(model) == ["blocks.0", "blocks.1", "blocks.2"]
    packed = []
    x = torch.randn(2, 8, 32)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        model(x).sum().backward()  # the module's own (inner) hooks take over inside the blocks
    reference(x).sum().backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    assert packed, "the head, outside the offloaded blocks, still saves through the outer hooks"
    assert apply_activation_offload(TokenMLP(), "auto", "Sequential").detail.startswith("saved activations of 1")
    with pytest.raises(ConfigError, match="activation_offload 'Blok' matches no module of TokenMLP"):
        apply_activation_offload(TokenMLP(), "Blok")
    with pytest.raises(ConfigError, match="activation_offload=auto, but"):
        apply_activation_offload(TokenMLP(), "auto", None, "token-mlp")


def test_offload_is_unavailable_on_cpu_with_the_reason_and_refused_with_cuda_graphs() -> None:
    from workbench.levers import capabilities, check_config

    offload = capabilities("cpu")["activation_offload"]["auto"]
    assert not offload.available and "already live in host memory" in offload.reason
    with pytest.raises(ConfigError, match=r"activation_offload=encoder\.\* is not available on cpu"):
        check_config(TrainConfig(activation_offload="encoder.*"), "cpu")
    with pytest.raises(ConfigError, match="CUDA graph cannot capture"):
        TrainConfig(activation_offload="auto", cuda_graphs=True)
    with pytest.raises(ConfigError, match="activation_offload must be 'off', 'auto'"):
        TrainConfig(activation_offload=" ")
    assert TrainConfig().with_overrides("activation_offload=TransformerBlock").activation_offload == "TransformerBlock"
