"""Scaled-dot-product-attention backend: force one SDPA kernel instead of PyTorch's choice.

The context covers forward *and* backward: the backward kernel of the chosen backend must
match its forward, and a forced kernel that cannot run raises instead of silently falling
back, so a measurement never credits a backend that did not run.
"""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from workbench.config import ConfigError, TrainConfig
from workbench.device import ALWAYS, Availability, cuda_capability, native_half_dtype
from workbench.levers.amp import ContextFactory
from workbench.levers.base import Lever, Space, SpaceContext, first_line, probed
from workbench.levers.fragment import Snippet
from workbench.levers.record import Applied

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep

BACKENDS = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def apply_attention_backend(backend: str) -> tuple[ContextFactory | None, Applied | None]:
    """A `sdpa_kernel` context factory, or (None, None) for 'auto' and for 'flex' (which replaces
    the attention call in the model itself: `levers.flex_attention`)."""
    if backend in ("auto", "flex"):
        return None, None
    if backend not in BACKENDS:
        raise ConfigError(f"attention_backend={backend!r} is not valid; choose one of: auto, {', '.join(BACKENDS)}")
    chosen = BACKENDS[backend]

    def context() -> AbstractContextManager[None]:
        return sdpa_kernel(chosen)

    detail = f"sdpa_kernel({chosen.name}) around forward and backward; other SDPA kernels disabled"
    return context, Applied("attention_backend", backend, detail)


def attention_availability(value: str, dev: torch.device) -> Availability:
    if value == "auto":
        return ALWAYS
    if value == "flex":
        from workbench.levers.flex_attention import flex_availability

        return flex_availability(dev)
    # Probed in a dtype the device runs natively: emulated bf16 on a pre-Ampere GPU would mark
    # backends unavailable that run in fp16 there.
    dtype = native_half_dtype(cuda_capability(dev)) if dev.type == "cuda" else torch.float32
    q = torch.randn(1, 2, 16, 64, device=dev, dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(BACKENDS[value]):
                F.scaled_dot_product_attention(q, q, q)
        except RuntimeError:
            why = "; ".join(first_line(w.message) for w in caught) or "PyTorch has no such kernel for this device"
            dtype_name = str(dtype).removeprefix("torch.")
            return Availability(False, f"the {value} SDPA kernel cannot run on {dev.type} in {dtype_name}: {why}")
    return ALWAYS


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    if config.attention_backend == "flex":
        from workbench.levers.flex_attention import flex_snippet

        flex_snippet(snippet)
        snippet.model_steps += [
            "    # Before compile, so torch.compile traces flex_attention and fuses it.",
            "    use_flex_attention(model)",
        ]
    elif config.attention_backend != "auto":
        snippet.imports.add("from torch.nn.attention import SDPBackend, sdpa_kernel")
        comment = ["# The SDPA backend holds for backward too: its backward kernel must match."]
        snippet.micro_contexts.append((comment, f"sdpa_kernel(SDPBackend.{BACKENDS[config.attention_backend].name})"))


def _space(ctx: SpaceContext) -> Space:
    return {"attention_backend": ctx.available("attention_backend")}


def _apply(step: TrainStep) -> None:
    """FlexAttention replaces the model's attention call (a module change, before the wrappers and
    compile); a forced SDPA kernel is a context around forward and backward instead."""
    if step.config.attention_backend == "flex":
        from workbench.levers.flex_attention import apply_flex_attention

        step.applied.append(apply_flex_attention(step.base_model))
        return
    step.attention, record = apply_attention_backend(step.config.attention_backend)
    if record is not None:
        step.applied.append(record)


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    if value == "flex":
        return "attention through FlexAttention (fused under torch.compile)"
    return f"scaled_dot_product_attention forced to the {value} kernel"


LEVER = Lever(
    name="attention_backend",
    fields=("attention_backend",),
    summary="force one SDPA kernel (flash, efficient, cuDNN, math) or FlexAttention instead of PyTorch's pick",
    availability=probed(attention_backend=attention_availability),
    snippet=_snippet,
    space=_space,
    apply=_apply,
    describe=_describe,
)
