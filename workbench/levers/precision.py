"""float32 precision of matmuls and of cuDNN convolutions: two PyTorch flags, scoped to the step.

`torch.set_float32_matmul_precision` (matmuls; TF32 on NVIDIA Ampere+ at 'high') and
`torch.backends.cudnn.allow_tf32` (convolutions) are separate switches with separate defaults:
PyTorch keeps matmuls at 'highest' but lets cuDNN convolve in TF32. Both are process-global,
so setting them for good would leak one trial's choice into the next trial run in the same
process (inline mode, tests). The context sets both on entry, every step and at their defaults
too (a caller's own global setting must not change what a trial measures), and restores them
on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import torch

from workbench.config import ConfigError, TrainConfig
from workbench.device import ALWAYS, Availability
from workbench.levers.amp import ContextFactory
from workbench.levers.base import Lever, Space, SpaceContext, probed
from workbench.levers.fragment import Snippet, comment, q
from workbench.levers.record import Applied

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep

PRECISIONS = ("highest", "high", "medium")


@contextmanager
def fp32_precision(matmul: str, cudnn_tf32: bool) -> Iterator[None]:
    """Set float32 matmul precision and cuDNN's TF32 switch until the block exits."""
    previous = torch.get_float32_matmul_precision()
    previous_cudnn = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)
        torch.backends.cudnn.allow_tf32 = previous_cudnn


def apply_fp32_precision(matmul: str, cudnn_tf32: bool, device: torch.device) -> tuple[ContextFactory, list[Applied]]:
    """A context factory for the step, and one record per flag with the value it runs with."""
    if matmul not in PRECISIONS:
        raise ConfigError(f"matmul_precision={matmul!r} is not valid; choose one of: {', '.join(PRECISIONS)}")
    if not isinstance(cudnn_tf32, bool):
        raise ConfigError(f"cudnn_tf32 must be true or false, got {cudnn_tf32!r}")

    def context() -> AbstractContextManager[None]:
        return fp32_precision(matmul, cudnn_tf32)

    what = {"highest": "full fp32", "high": "TF32 allowed", "medium": "bfloat16-based kernels allowed"}[matmul]
    matmul_detail = f"float32 matmuls: {what}; torch.set_float32_matmul_precision('{matmul}') for the step"
    conv = "TF32 allowed" if cudnn_tf32 else "strict fp32"
    cudnn_detail = f"cuDNN convolutions: {conv}; torch.backends.cudnn.allow_tf32={cudnn_tf32} for the step"
    if matmul == "highest":
        matmul_detail += " (PyTorch's default)"
    if cudnn_tf32:
        cudnn_detail += " (PyTorch's default)"
    if device.type != "cuda":
        cudnn_detail += f"; no effect on {device.type}, whose convolutions do not use cuDNN"
    return context, [
        Applied("matmul_precision", matmul, matmul_detail),
        Applied("cudnn_tf32", cudnn_tf32, cudnn_detail),
    ]


def matmul_precision_availability(value: str, dev: torch.device) -> Availability:
    if value == "highest":
        return ALWAYS
    if dev.type != "cuda":
        return Availability(False, "TF32 is an NVIDIA Ampere+ tensor-core mode; on CPU this setting changes nothing")
    major, _ = torch.cuda.get_device_capability(dev)
    if major < 8:
        return Availability(False, f"TF32 needs compute capability 8.0+, this GPU is {major}.x")
    return ALWAYS


def cudnn_tf32_availability(value: bool, dev: torch.device) -> Availability:
    """On is PyTorch's default everywhere (the flag is set, harmlessly, on CPU too); off is
    refused where it would change nothing, as matmul_precision's TF32 values are."""
    if value:
        return ALWAYS
    if dev.type != "cuda":
        return Availability(
            False, "cuDNN TF32 is an NVIDIA Ampere+ convolution mode; on CPU turning it off changes nothing"
        )
    if not torch.backends.cudnn.is_available():
        return Availability(False, "this PyTorch build has no cuDNN, so no convolution uses TF32 to turn off")
    major, _ = torch.cuda.get_device_capability(dev)
    if major < 8:
        return Availability(
            False, f"TF32 needs compute capability 8.0+, this GPU is {major}.x: its convolutions are fp32"
        )
    return ALWAYS


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    """Each flag is written only when it differs from PyTorch's default, which is the same on
    every device (matmuls 'highest', cuDNN convolutions TF32 allowed)."""
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


def _space(ctx: SpaceContext) -> Space:
    """Matmul precision only: cuDNN TF32 is on by default and turning it off is never faster."""
    return {"matmul_precision": ctx.available("matmul_precision")}


def _apply(step: TrainStep) -> None:
    """Always recorded: a result must say which precision its kernels ran with, defaults included."""
    step.precision, records = apply_fp32_precision(step.config.matmul_precision, step.config.cudnn_tf32, step.device)
    step.applied.extend(records)


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    if name == "matmul_precision":
        return f"float32 matmuls may use {'TF32' if value == 'high' else 'bfloat16 kernels'}"
    return "strict fp32 convolutions (cuDNN may not use TF32)" if value is False else None


LEVER = Lever(
    name="fp32_precision",
    fields=("matmul_precision", "cudnn_tf32"),
    summary="let float32 matmuls/convolutions use TF32 or bf16 kernels: faster fp32 on Ampere+ GPUs",
    availability=probed(matmul_precision=matmul_precision_availability, cudnn_tf32=cudnn_tf32_availability),
    snippet=_snippet,
    space=_space,
    apply=_apply,
    describe=_describe,
)
