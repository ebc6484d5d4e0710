"""Activation offload: tensors that autograd saves inside chosen modules wait in host memory.

Trades PCIe time for device memory: each saved activation is copied to pinned host memory
during forward and back to the GPU when backward needs it (`torch.autograd.graph.save_on_cpu`).
Targets are chosen as for activation checkpointing (a class name, a name glob or the workload's
block), and the patch is the same kind: the target's own `forward` is wrapped in place, so
names, types and `state_dict` keys are unchanged. Under torch.compile dynamo does not trace the
hook context: each offloaded module ends a graph (a graph break), which the step's time shows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from workbench.config import ConfigError
from workbench.optimizations.checkpointing import _no_match_message, find_targets, resolve_target
from workbench.optimizations.record import Applied, name_list

_MARK = "_workbench_offload"
"""Attribute set on a wrapped module, so offloading is never applied twice."""


def _offloaded_forward(forward: Callable[..., Any], pin_memory: bool, *args: Any, **kwargs: Any) -> Any:
    """The patched `forward`: what autograd saves inside it is packed into host memory."""
    with torch.autograd.graph.save_on_cpu(pin_memory=pin_memory):
        return forward(*args, **kwargs)


def offloaded_modules(model: nn.Module) -> list[str]:
    """Qualified names of the modules currently offloading (for tests and reports)."""
    return [name for name, module in model.named_modules() if getattr(module, _MARK, False)]


def apply_activation_offload(
    model: nn.Module,
    target: str,
    workload_target: str | None = None,
    workload_name: str = "workload",
    *,
    pin_memory: bool = True,
) -> Applied:
    """Wrap every outermost module matching `target` so its saved activations go to host memory.

    Pinned memory (the default) lets the copies run asynchronously; it needs CUDA.
    """
    try:
        resolved = resolve_target(target, workload_target, workload_name)
    except ConfigError as exc:  # its message names checkpointing's field; this is offload's
        raise ConfigError(str(exc).replace("checkpoint_target", "activation_offload")) from None
    names = find_targets(model, resolved)
    if not names:
        raise ConfigError(_no_match_message(model, resolved).replace("checkpoint_target", "activation_offload"))
    modules = dict(model.named_modules())
    for name in names:
        module = modules[name]
        if getattr(module, _MARK, False):
            continue
        module.forward = functools.partial(_offloaded_forward, module.forward, pin_memory)  # type: ignore[method-assign]
        setattr(module, _MARK, True)
    classes = "/".join(sorted({type(modules[n]).__name__ for n in names}))
    where = "pinned host memory" if pin_memory else "host memory"
    detail = f"saved activations of {len(names)} {classes} module(s) kept in {where}: {name_list([n or '<root>' for n in names])}"
    return Applied("activation_offload", target, detail)
