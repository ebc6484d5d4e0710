"""Scaled-dot-product-attention backend: force one SDPA kernel instead of PyTorch's choice.

The context covers forward *and* backward: the backward kernel of the chosen backend must
match its forward, and a forced kernel that cannot run raises instead of silently falling
back, so a measurement never credits a backend that did not run.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from torch.nn.attention import SDPBackend, sdpa_kernel

from workbench.config import ConfigError
from workbench.levers.amp import ContextFactory
from workbench.levers.record import Applied

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
