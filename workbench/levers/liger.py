"""Liger's fused Triton kernels for Hugging Face models: RMSNorm, RoPE, SwiGLU and the fused
linear + cross-entropy, which computes the loss chunk by chunk without materializing the logits
(at a 32k-150k vocabulary, the largest activation of a language model's step).

Liger patches a model by its Hugging Face model type, so it applies to those models only; a
module change, so before tensor parallelism and everything after it. liger-kernel is an
optional dependency (`pip install 'training-workbench[liger]'`) and runs on CUDA GPUs only.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import torch

from workbench.config import ConfigError
from workbench.device import ALWAYS, Availability
from workbench.levers.base import Lever, probed
from workbench.levers.record import Applied

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep

INSTALL_HINT = "pip install 'training-workbench[liger]' (or pip install liger-kernel)"


def liger_availability(value: bool, dev: torch.device) -> Availability:
    if not value:
        return ALWAYS
    if dev.type != "cuda":
        return Availability(False, f"Liger's kernels are Triton kernels for CUDA GPUs; this device is {dev.type}")
    if importlib.util.find_spec("liger_kernel") is None:
        return Availability(False, f"liger-kernel is not installed: {INSTALL_HINT}")
    return ALWAYS


def _apply(step: TrainStep) -> None:
    """Patch the Hugging Face model instance with Liger's kernels for its model type."""
    if not step.config.liger_kernels:
        return
    model = step.base_model
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type is None:
        raise ConfigError(
            f"liger_kernels patches Hugging Face models by their model type; workload '{step.workload.name}' "
            "has no config.model_type: set liger_kernels=false, or swap in Liger's modules in your model_fn"
        )
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(model=model)
    step.applied.append(Applied("liger_kernels", True, f"Liger kernels for model type {model_type!r}"))


LEVER = Lever(
    name="liger_kernels",
    fields=("liger_kernels",),
    summary="Liger's fused kernels on a Hugging Face model (RMSNorm, RoPE, SwiGLU, fused linear + cross-entropy)",
    availability=probed(liger_kernels=liger_availability),
    apply=_apply,
    not_exported="Liger patches the model in place by its type; the snippet does not write that patch yet",
    not_searched="GPU only, and not among the tuner's levers yet",
    fixed={"liger_kernels": "GPU only, and not among the tuner's levers yet"},
)
