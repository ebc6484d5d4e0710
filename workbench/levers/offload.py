"""Activation offload: tensors that autograd saves inside chosen modules wait in host memory.

Trades PCIe time for device memory: each saved activation is copied into pinned host memory during
forward and back to the GPU when backward needs it. Both copies are `non_blocking` (the host never
waits for them) and run on the compute stream, so the GPU does not overlap them with kernels: the
step pays their transfer time in full; what offload buys is device memory. Targets are chosen as
for activation checkpointing (a class name, a name glob or the workload's block), and the patch is
the same kind: the target's own `forward` is wrapped in place, so names, types and `state_dict`
keys are unchanged. Under torch.compile dynamo does not trace the hook context: each offloaded
module ends a graph (a graph break), which the step's time shows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workbench.config import ConfigError, TrainConfig
from workbench.device import ALWAYS, Availability
from workbench.levers.base import Lever, Space, SpaceContext, Table
from workbench.levers.checkpointing import _no_match_message, find_targets, resolve_target
from workbench.levers.fragment import Snippet, q
from workbench.levers.record import Applied, name_list

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep

_MARK = "_workbench_offload"
"""Attribute set on a wrapped module, so offloading is never applied twice."""


def _pack_to_host(pin_memory: bool, tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
    """Copy a saved CUDA tensor into pinned host memory without making the host wait.

    Not `torch.autograd.graph.save_on_cpu`: before torch 2.13 (pytorch/pytorch#175421) its pack is
    a plain `copy_`, one host synchronization per saved tensor. The copy is queued on the current
    stream, so the caching allocator cannot hand the source's memory to a later kernel before the
    copy has read it, and the copy back in backward is queued after it on the same stream.
    """
    if not (pin_memory and tensor.is_cuda and not tensor.is_sparse):
        return tensor.device, tensor.cpu()
    packed = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=True)
    packed.copy_(tensor, non_blocking=True)
    return tensor.device, packed


def _unpack_to_device(pin_memory: bool, packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
    device, tensor = packed
    return tensor.to(device, non_blocking=pin_memory)


def _offloaded_forward(forward: Callable[..., Any], pin_memory: bool, *args: Any, **kwargs: Any) -> Any:
    """The patched `forward`: what autograd saves inside it is packed into host memory."""
    pack = functools.partial(_pack_to_host, pin_memory)
    unpack = functools.partial(_unpack_to_device, pin_memory)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
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

    Pinned memory (the default; it needs CUDA) lets the copies leave the host free; without it each
    copy to the host waits for the GPU.
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


def offload_availability(dev: torch.device) -> Availability:
    """The same for every module pattern: whether saved activations can move to the host at all."""
    if dev.type != "cuda":
        return Availability(
            False,
            f"offload moves saved activations from GPU memory to host memory; on a {dev.type} device they "
            "already live in host memory, so there is nothing to gain",
        )
    return Availability(True, "trades PCIe copy time for GPU memory; under compile a graph break per module")


def _availability(dev: torch.device) -> Table:
    # Any module pattern is valid; 'auto' stands for them all (the check judges any value).
    return {"activation_offload": {"off": ALWAYS, "auto": offload_availability(dev)}}


def _check(config: TrainConfig, dev: torch.device) -> None:
    if config.activation_offload != "off":
        offload = offload_availability(dev)
        if not offload.available:
            raise ConfigError(
                f"activation_offload={config.activation_offload} is not available on {dev}: {offload.reason}"
            )


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    if config.activation_offload == "off":
        return
    target = config.activation_offload
    note = "  # the workbench's 'auto': its workload's block; name yours" if target == "auto" else ""
    snippet.constants += [
        "# Modules whose saved activations wait in host memory: a class name or fnmatch glob.",
        f"OFFLOAD_TARGET = {q('MyBlock' if target == 'auto' else target)}{note}",
    ]
    _offload_helpers(snippet)
    snippet.model_steps += [
        "    # After checkpointing (on a checkpointed block only its inputs are saved, so only",
        "    # those move), before compile, which breaks the graph at each offloaded module.",
        "    offload_modules(model, OFFLOAD_TARGET)",
    ]


def _offload_helpers(snippet: Snippet) -> None:
    """`offload_modules`: this module's hooks, in plain PyTorch."""
    snippet.imports |= {"import fnmatch", "import functools"}
    snippet.helpers += [
        "def _pack_to_host(tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:\n"
        "    # Into pinned host memory without making the host wait (torch < 2.13's save_on_cpu\n"
        "    # blocks here); queued on the compute stream, so the GPU pays the copy's time.\n"
        "    if not tensor.is_cuda or tensor.is_sparse:\n"
        "        return tensor.device, tensor.cpu()\n"
        "    packed = torch.empty(\n"
        "        tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=True\n"
        "    )\n"
        "    packed.copy_(tensor, non_blocking=True)\n"
        "    return tensor.device, packed",
        "def _unpack_to_device(packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:\n"
        "    device, tensor = packed\n"
        "    return tensor.to(device, non_blocking=True)",
        "def _offloaded(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:\n"
        "    # What autograd saves in here is copied to pinned host memory and back for backward.\n"
        "    with torch.autograd.graph.saved_tensors_hooks(_pack_to_host, _unpack_to_device):\n"
        "        return forward(*args, **kwargs)",
        "def offload_modules(model: nn.Module, target: str) -> list[str]:\n"
        '    """Keep the activations saved inside every module matching `target` (a class\n'
        "    name or an fnmatch glob over qualified names) in host memory until backward.\n"
        '    """\n'
        "    wrapped: list[str] = []\n"
        "    for name, module in model.named_modules():\n"
        '        if any(w == "" or name == w or name.startswith(w + ".") for w in wrapped):\n'
        "            continue\n"
        "        by_class = type(module).__name__ == target\n"
        '        if by_class or (name != "" and fnmatch.fnmatchcase(name, target)):\n'
        "            module.forward = functools.partial(_offloaded, module.forward)\n"
        "            wrapped.append(name)\n"
        "    if not wrapped:\n"
        '        raise ValueError(f"offload target {target!r} matches no module of the model")\n'
        "    return wrapped",
    ]


def _space(ctx: SpaceContext) -> Space:
    """Offload of the workload's block ('auto') where this device can offload at all."""
    return {"activation_offload": ctx.available("activation_offload")}


def _apply(step: TrainStep) -> None:
    config, workload = step.config, step.workload
    if config.activation_offload != "off":
        step.applied.append(
            apply_activation_offload(
                step.base_model, config.activation_offload, workload.checkpoint_target, workload.name
            )
        )


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    return "saved activations of these modules wait in pinned host memory"


LEVER = Lever(
    name="activation_offload",
    fields=("activation_offload",),
    summary="keep chosen modules' saved activations in pinned host memory: GPU memory for PCIe time",
    availability=_availability,
    check=_check,
    snippet=_snippet,
    space=_space,
    apply=_apply,
    describe=_describe,
)
