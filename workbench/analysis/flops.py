"""FLOPs of a training step (PyTorch's FlopCounterMode) and MFU against the peak table.

Counted on fake tensors (no arithmetic runs, any batch size takes seconds) and on the eager
model without activation checkpointing: MFU counts *model* FLOPs — recomputation and
compile do not change the work the model needs, only how fast it is done. Only matmul,
convolution and attention ops carry FLOPs in PyTorch's counter; element-wise work counts
as zero, as in every MFU figure.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from workbench.config import TrainConfig
from workbench.peak_specs import lookup_spec
from workbench.workloads import Workload

_REGISTERED = False


@dataclass
class FlopCount:
    total: int
    """FLOPs of one optimizer step (forward + backward of every micro-batch)."""
    by_op: dict[str, int] = field(default_factory=dict)
    batch_size: int = 0


@dataclass
class Mfu:
    """Model FLOPs utilization, or why there is none."""

    flops_per_step: int | None
    achieved_flops: float | None
    """FLOP/s at the median step time."""
    peak_flops: float | None
    peak_source: str
    """Which table entry and dtype the peak came from, or why there is no peak."""
    mfu: float | None


def register_cpu_attention_formulas() -> None:
    """Teach the counter the CPU flash-attention kernel (CUDA's kernels are registered upstream).

    Without this, attention on CPU counts as zero FLOPs; the formulas are PyTorch's own SDPA ones.
    """
    global _REGISTERED
    if _REGISTERED:
        return
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is not None and forward not in fc.flop_registry:

        @fc.register_flop_formula(forward, get_raw=True)
        def _forward(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
            return int(fc.sdpa_flop_count(query.shape, key.shape, value.shape))

    if backward is not None and backward not in fc.flop_registry:

        @fc.register_flop_formula(backward, get_raw=True)
        def _backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
            return int(fc.sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape))

    _REGISTERED = True


def count_flops(fn: Any) -> FlopCount:
    """FLOPs of whatever `fn()` runs (real or fake tensors)."""
    from torch.utils.flop_counter import FlopCounterMode

    register_cpu_attention_formulas()
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return FlopCount(total=int(counter.get_total_flops()), by_op=by_op)


def step_flops(
    workload: Workload | str, config: TrainConfig | None = None, batch_size: int | None = None, *, preset: str = "tiny"
) -> FlopCount:
    """Model FLOPs of one optimizer step of `workload` under `config`, counted on fake tensors.

    A model that reads tensor values in its forward (`.item()`, data-dependent shapes) cannot
    run on fake tensors; it is counted on one real CPU step instead (slower, same count).
    """
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    from workbench.estimate import cpu_equivalent, fake_train_step

    config = config or TrainConfig()
    plain = dataclasses.replace(config, activation_checkpointing="off", checkpoint_target="auto")
    try:
        with fake_train_step(workload, plain, preset=preset) as fake:
            size = batch_size or fake.default_batch_size
            with fake.fake_mode:
                count = count_flops(lambda: fake.run(size))
    except (DataDependentOutputException, DynamicOutputShapeException):
        size, count = _real_step_flops(workload, cpu_equivalent(plain)[0], batch_size, preset)
    count.batch_size = size
    return count


def _real_step_flops(
    workload: Workload | str, config: TrainConfig, batch_size: int | None, preset: str
) -> tuple[int, FlopCount]:
    from workbench.levers.build import build
    from workbench.workloads import load_workload

    wl = load_workload(workload, preset=preset, **config.extra) if isinstance(workload, str) else workload
    if batch_size is not None:
        config = config.replace(batch_size=batch_size)
    step = build(wl, config, "cpu")
    batches = wl.batches(config)
    micro = [step.prepare_batch(next(batches)) for _ in range(config.grad_accumulation)]
    return wl.effective_batch_size(config), count_flops(lambda: step(micro))


def peak_flops_for(device_name: str, config: TrainConfig | dict[str, Any]) -> tuple[float | None, str]:
    """The table's peak FLOP/s for the dtype this config's matmuls run in, and where it came from."""
    cfg = config if isinstance(config, TrainConfig) else TrainConfig.from_dict(config)
    spec = lookup_spec(device_name)
    if spec is None:
        return None, f"no peak FLOP/s for '{device_name}' in workbench/peak_specs.py (CPUs are not in the table)"
    # Autocast decides the matmul dtype; in fp32, matmul_precision 'high'/'medium' allows TF32.
    dtype: str = cfg.amp if cfg.amp != "fp32" else ("tf32" if cfg.matmul_precision != "highest" else "fp32")
    peak = spec.peak_flops(dtype)
    if peak is None:
        return None, f"{spec.name} has no {dtype} peak in the table"
    return peak, f"{spec.name} dense {dtype} peak {peak / 1e12:.1f} TFLOP/s"


def model_flops_utilization(
    flops_per_step: int | None, median_step_ms: float | None, device_name: str, config: TrainConfig | dict[str, Any]
) -> Mfu:
    """MFU = FLOPs per step ÷ median step time ÷ the device's peak for the step's dtype."""
    peak, source = peak_flops_for(device_name, config)
    if not flops_per_step or not median_step_ms:
        return Mfu(flops_per_step, None, peak, source, None)
    achieved = flops_per_step / (median_step_ms / 1000.0)
    return Mfu(flops_per_step, achieved, peak, source, achieved / peak if peak else None)
