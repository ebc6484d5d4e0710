"""The optimizer and its kernel strategy: one kernel per parameter, batched (foreach), or fused.

Created only after the model is final (moved, converted to channels_last, checkpoint-wrapped)
so it holds the parameters that will really train. Under CUDA graphs Adam(W) needs
`capturable=True`: its step counter then lives on the device, so no host value is baked
into the captured graph.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from workbench.config import ConfigError
from workbench.optimizations.record import Applied

SGD_MOMENTUM = 0.9

_IMPL_FLAGS: dict[str, dict[str, bool]] = {
    "for-loop": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def apply_optimizer(
    params: Iterable[nn.Parameter] | nn.Module, name: str, impl: str, lr: float, *, capturable: bool = False
) -> tuple[torch.optim.Optimizer, Applied]:
    """Build `name` ('adamw' | 'sgd') with the `impl` kernel strategy; always recorded."""
    if impl not in _IMPL_FLAGS:
        raise ConfigError(f"optimizer_impl={impl!r} is not valid; choose one of: {', '.join(_IMPL_FLAGS)}")
    if isinstance(params, nn.Module):
        params = params.parameters()
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ConfigError("the model has no trainable parameters (requires_grad=True); nothing to optimize")
    flags: dict[str, Any] = dict(_IMPL_FLAGS[impl])
    optimizer: torch.optim.Optimizer
    if name == "adamw":
        if capturable:
            flags["capturable"] = True
        optimizer = torch.optim.AdamW(trainable, lr=lr, **flags)
        what = "AdamW"
    elif name == "sgd":
        # SGD keeps no host-side step counter, so it is graph-safe without a capturable flag.
        optimizer = torch.optim.SGD(trainable, lr=lr, momentum=SGD_MOMENTUM, **flags)
        what = f"SGD(momentum={SGD_MOMENTUM})"
    else:
        raise ConfigError(f"optimizer={name!r} is not valid; choose one of: adamw, sgd")
    count = sum(p.numel() for p in trainable)
    flag_text = ", ".join(f"{k}={v}" for k, v in flags.items())
    detail = f"{what} lr={lr} over {len(trainable)} tensors ({count:,} parameters), {flag_text}"
    return optimizer, Applied("optimizer", f"{name}/{impl}", detail)
