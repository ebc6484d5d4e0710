"""Automatic mixed precision: autocast around forward and loss, plus a GradScaler for fp16.

bf16 has fp32's exponent range and needs no scaler; fp16 underflows small gradients, so its
loss is scaled up before backward and the gradients unscaled before the step. The scaler's
inf/NaN check reads a device flag on the host once per step (PyTorch's design) unless the
optimizer is fused, which consumes the flag on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch

from workbench.config import ConfigError, TrainConfig
from workbench.device import ALWAYS, Availability, bf16_availability, cpu_bf16_native, cpu_bf16_speedup, cuda_capability
from workbench.levers.base import Lever, Space, SpaceContext, probed
from workbench.levers.fragment import Snippet
from workbench.levers.record import Applied

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

ContextFactory = Callable[[], AbstractContextManager[object]]


def apply_amp(
    amp: str, device: torch.device, *, cache_enabled: bool = True
) -> tuple[ContextFactory | None, torch.amp.GradScaler | None, Applied | None]:
    """Autocast context factory, GradScaler (fp16 only) and record; all None for fp32.

    `cache_enabled=False` is required under CUDA graphs: autocast's cast cache would hold
    tensors created during capture (PyTorch's CUDA graphs notes, "Usage with torch.cuda.amp").
    """
    if amp == "fp32":
        return None, None, None
    if amp not in DTYPES:
        raise ConfigError(f"amp={amp!r} is not valid; choose one of: fp32, bf16, fp16")
    dtype = DTYPES[amp]

    def autocast() -> AbstractContextManager[object]:
        return torch.autocast(device.type, dtype=dtype, cache_enabled=cache_enabled)

    scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None
    detail = f"torch.autocast('{device.type}', {dtype}) around forward and loss"
    if scaler is not None:
        detail += "; GradScaler scales the loss and skips steps with inf/NaN gradients"
    if not cache_enabled:
        detail += "; cast cache disabled for CUDA-graph capture"
    return autocast, scaler, Applied("amp", amp, detail)


def amp_availability(value: str, dev: torch.device) -> Availability:
    if value == "fp32":
        return ALWAYS
    if dev.type == "cuda":
        return bf16_availability(cuda_capability(dev)) if value == "bf16" else ALWAYS
    if value == "fp16":
        return Availability(True, "runs on CPU, but CPUs without fp16 matrix units (no AMX-FP16) are slower than fp32")
    return ALWAYS


SNIPPET_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    if config.amp == "fp32":
        return
    autocast = f"torch.autocast(DEVICE.type, dtype={SNIPPET_DTYPES[config.amp]}"
    comments = []
    if config.cuda_graphs:
        comments.append("# No cast cache: it would keep tensors made during graph capture.")
        autocast += ", cache_enabled=False"
    snippet.forward_contexts.append((comments, autocast + ")"))
    if config.amp == "fp16":
        snippet.statements.append(
            "# fp16 gradients underflow: GradScaler scales the loss up before backward, unscales\n"
            "# the gradients before the step and skips steps whose gradients overflowed.\n"
            "scaler = torch.amp.GradScaler(DEVICE.type)"
        )
        snippet.backward = "scaler.scale(loss / len(batches)).backward()"
        snippet.optimizer_step = ["scaler.step(optimizer)  # skipped if the gradients overflowed", "scaler.update()"]


def _space(ctx: SpaceContext) -> Space:
    """What this device runs natively: on a CPU no fp16 (its convolutions are emulated: a 3x3 conv ran
    over 100x slower than fp32 here) and bf16 where the CPU has bf16 instructions, or else where a
    quick measurement shows it faster than fp32. A space file may still name either."""
    values = ctx.available("amp")
    if ctx.device_type == "cpu":
        keep_bf16 = cpu_bf16_native() or cpu_bf16_speedup() > 1.0
        values = tuple(v for v in values if v != "fp16" and (v != "bf16" or keep_bf16))
    return {"amp": values}


def _apply(step: TrainStep) -> None:
    """Autocast's cast cache must be off under CUDA-graph capture."""
    step.autocast, step.scaler, record = apply_amp(
        step.config.amp, step.device, cache_enabled=not step.config.cuda_graphs
    )
    if record is not None:
        step.applied.append(record)


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    return {"bf16": "bfloat16 autocast, no loss scaling needed", "fp16": "float16 autocast with a GradScaler"}.get(
        value
    )


LEVER = Lever(
    name="amp",
    fields=("amp",),
    summary="autocast forward and loss to bf16/fp16: tensor-core matmuls and half the activation bytes",
    availability=probed(amp=amp_availability),
    snippet=_snippet,
    space=_space,
    apply=_apply,
    describe=_describe,
)
