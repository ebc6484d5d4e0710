"""FLOPs against hand counts for Linear and Conv stacks; MFU against the peak table."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workbench.analysis.flops import count_flops, model_flops_utilization, peak_flops_for, step_flops
from workbench.config import TrainConfig
from workbench.peak_specs import lookup_spec
from workbench.workloads import Workload

BATCH = 8
WIDTHS = [32, 64, 48, 16]
CHANNELS, SIZE, KERNEL = [3, 16, 24], 20, 3


def mlp() -> nn.Module:
    return nn.Sequential(*[nn.Linear(a, b) for a, b in itertools.pairwise(WIDTHS)])


def convnet() -> nn.Module:
    return nn.Sequential(*[nn.Conv2d(a, b, KERNEL, padding=1) for a, b in itertools.pairwise(CHANNELS)])


def linear_step_flops() -> int:
    """Forward 2·B·in·out per layer; backward the same twice (input and weight gradients),
    except that the first layer needs no input gradient (the batch does not require grad)."""
    layers = list(itertools.pairwise(WIDTHS))
    forward = sum(2 * BATCH * a * b for a, b in layers)
    backward = sum(2 * 2 * BATCH * a * b for a, b in layers) - 2 * BATCH * layers[0][0] * layers[0][1]
    return forward + backward


def conv_step_flops() -> int:
    """Forward 2·B·Cout·H·W·Cin·k² per conv (same padding keeps H×W); backward as for Linear."""
    layers = list(itertools.pairwise(CHANNELS))
    per = [2 * BATCH * b * SIZE * SIZE * a * KERNEL * KERNEL for a, b in layers]
    return sum(per) + 2 * sum(per) - per[0]


def test_linear_stack_flops_equal_the_hand_count() -> None:
    model, x = mlp(), torch.randn(BATCH, WIDTHS[0])
    assert count_flops(lambda: model(x).sum().backward()).total == linear_step_flops()


def test_conv_stack_flops_equal_the_hand_count() -> None:
    model, x = convnet(), torch.randn(BATCH, CHANNELS[0], SIZE, SIZE)
    count = count_flops(lambda: model(x).sum().backward())
    assert count.total == conv_step_flops()
    assert set(count.by_op) == {"aten.convolution", "aten.convolution_backward"}


@pytest.mark.parametrize(("make", "shape", "expected"), [(mlp, (WIDTHS[0],), linear_step_flops),
                                                         (convnet, (CHANNELS[0], SIZE, SIZE), conv_step_flops)])  # fmt: skip
def test_a_workloads_step_is_counted_on_fake_tensors(make, shape, expected) -> None:  # type: ignore[no-untyped-def]
    workload = Workload.from_callables(model_fn=make, batch_fn=lambda n, g: (torch.randn(n, *shape, generator=g),),
                                       loss_fn=lambda out, batch: out.sum(), batch_size=BATCH)  # fmt: skip
    count = step_flops(workload, TrainConfig())
    assert count.total == expected() and count.batch_size == BATCH
    # Checkpointing recomputes the forward but does not change the model's FLOPs (MFU counts model FLOPs).
    assert step_flops(workload, TrainConfig(activation_checkpointing="full", checkpoint_target="*")).total == expected()
    # Gradient accumulation runs the micro-batch twice per optimizer step.
    assert step_flops(workload, TrainConfig(grad_accumulation=2)).total == 2 * expected()


class ReadsHost(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return out * 0 if out.mean().item() > 1e9 else out  # cannot run on fake tensors


def test_a_model_that_reads_values_is_counted_on_a_real_step() -> None:
    workload = Workload.from_callables(model_fn=ReadsHost, batch_fn=lambda n, g: (torch.randn(n, WIDTHS[0], generator=g),),
                                       loss_fn=lambda out, batch: out.sum(), batch_size=BATCH)  # fmt: skip
    assert step_flops(workload).total == linear_step_flops()


def test_cpu_attention_is_counted_like_cuda_attention() -> None:
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q = torch.randn(2, 4, 16, 8, requires_grad=True)
    count = count_flops(lambda: F.scaled_dot_product_attention(q, q, q).sum().backward())
    shape = q.shape
    assert count.total == sdpa_flop_count(shape, shape, shape) + sdpa_backward_flop_count(shape, shape, shape, shape)
    assert count.total == 4 * 2 * 4 * 16 * 16 * 8 * (1 + 2.5)  # 4·B·H·L·S·E forward, 2.5× that backward


def test_mfu_divides_by_the_tables_peak_for_the_step_dtype() -> None:
    h100 = lookup_spec("H100 SXM")
    assert h100 is not None
    bf16 = model_flops_utilization(10**12, 10.0, "NVIDIA H100 80GB HBM3", TrainConfig(amp="bf16"))
    assert bf16.peak_flops == h100.bf16_flops and bf16.achieved_flops == pytest.approx(1e14)
    assert bf16.mfu == pytest.approx(1e14 / h100.bf16_flops)  # type: ignore[operator]
    assert peak_flops_for("NVIDIA H100 80GB HBM3", TrainConfig())[0] == h100.fp32_flops
    assert peak_flops_for("NVIDIA H100 80GB HBM3", TrainConfig(matmul_precision="high"))[0] == h100.tf32_flops
    assert peak_flops_for("Tesla V100-SXM2-32GB", TrainConfig(amp="bf16"))[0] is None  # no bf16 on Volta
    cpu = model_flops_utilization(10**12, 10.0, "cpu", TrainConfig())
    assert cpu.mfu is None and cpu.achieved_flops == pytest.approx(1e14) and "not in the table" in cpu.peak_source
