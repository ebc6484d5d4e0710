"""The optimizer and its kernel strategy: PyTorch's own choice, one kernel per parameter, batched
(foreach), or fused.

Created only after the model is final (moved, converted to channels_last, checkpoint-wrapped)
so it holds the parameters that will really train. Under CUDA graphs Adam(W) needs
`capturable=True`: its step counter then lives on the device, so no host value is baked
into the captured graph.

`optimizer_impl='default'` passes neither `foreach` nor `fused`, exactly as a script that never
chose would, and records what PyTorch picks for these parameters. PyTorch makes that choice
inside each `step()` with a private helper; we ask the same helper, and tests pin its answer
against the kernels that really run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workbench.config import ConfigError, TrainConfig
from workbench.device import ALWAYS, Availability
from workbench.levers.base import Lever, Space, SpaceContext, Table, first_line
from workbench.levers.fragment import Snippet, call, comment
from workbench.levers.record import Applied

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep

SGD_MOMENTUM = 0.9

_IMPL_FLAGS: dict[str, dict[str, bool]] = {
    "default": {},
    "for-loop": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def pytorch_default_impl(params: Iterable[torch.Tensor]) -> str:
    """'foreach' or 'for-loop': what torch.optim's Adam(W) and SGD run with neither flag given.

    Both call `_default_to_fused_or_foreach(params, differentiable=False, use_fused=False)` in
    `step()`: foreach when every parameter is a supported tensor type on a foreach device (CUDA,
    not the CPU).
    """
    from torch.optim.optimizer import _default_to_fused_or_foreach

    _, foreach = _default_to_fused_or_foreach(list(params), False, use_fused=False)
    return "foreach" if foreach else "for-loop"


def default_impl_on(device_type: str) -> str:
    """`pytorch_default_impl` for plain parameters on a device type, without needing that device."""
    from torch.optim.optimizer import _get_foreach_kernels_supported_devices

    return "foreach" if device_type in _get_foreach_kernels_supported_devices() else "for-loop"


def apply_optimizer(
    params: Iterable[nn.Parameter] | nn.Module, name: str, impl: str, lr: float, *, capturable: bool = False
) -> tuple[torch.optim.Optimizer, Applied]:
    """Build `name` ('adamw' | 'sgd') with the `impl` kernel strategy; always recorded, with the
    strategy that really runs ('default' resolved to PyTorch's choice)."""
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
    resolved = impl
    if impl == "default":
        resolved = pytorch_default_impl(trainable)
        flag_text = ", ".join(filter(None, [f"PyTorch's default for these parameters: {resolved}", flag_text]))
    detail = f"{what} lr={lr} over {len(trainable)} tensors ({count:,} parameters), {flag_text}"
    return optimizer, Applied("optimizer", f"{name}/{resolved}", detail)


def optimizer_impl_availability(value: str, dev: torch.device) -> Availability:
    if value == "default":
        return Availability(True, f"PyTorch's choice on {dev.type}: {default_impl_on(dev.type)}")
    if value != "fused":
        return ALWAYS
    param = torch.zeros(4, device=dev, requires_grad=True)
    param.grad = torch.ones_like(param)
    try:
        torch.optim.AdamW([param], fused=True).step()
    except (RuntimeError, ValueError) as exc:
        return Availability(False, f"fused AdamW is not supported here: {first_line(exc)}")
    return ALWAYS


def _availability(dev: torch.device) -> Table:
    from workbench.config import field_choices

    return {
        "optimizer_impl": {v: optimizer_impl_availability(v, dev) for v in field_choices("optimizer_impl") or ()},
        "optimizer": dict.fromkeys(field_choices("optimizer") or (), ALWAYS),
    }


def make_optimizer_source(config: TrainConfig, device: str) -> str:
    """`make_optimizer`: AdamW or SGD(momentum 0.9) with the measured kernel strategy.

    optimizer_impl='default' is written out as what PyTorch picks on `device` (foreach on CUDA,
    the for-loop on CPU): a trial on that device measured exactly that, and the pasted step
    must not depend on where, or with which PyTorch, it later runs.
    """
    impl: str = config.optimizer_impl
    source = ""
    if impl == "default":
        device_type = device.split(":")[0]
        impl = default_impl_on(device_type)
        source = f" (PyTorch's default on {device_type}, written out as measured)"
    flag = {"for-loop": "foreach=False", "foreach": "foreach=True", "fused": "fused=True"}[impl]
    effect = {
        "for-loop": "one kernel per parameter and update op.",
        "foreach": "each update op runs as one batched kernel over all parameters.",
        "fused": "one fused kernel does the whole update for all parameters.",
    }[impl]
    why = f"{flag}{source}: {effect}"
    name = "AdamW" if config.optimizer == "adamw" else "SGD with momentum 0.9"
    args = ["params", f"lr={config.lr!r}"] + (["momentum=0.9"] if config.optimizer == "sgd" else []) + [flag]
    comments = comment(why, indent="    # ")
    if config.cuda_graphs and config.optimizer == "adamw":
        args.append("capturable=True")
        comments.append("    # capturable=True keeps the step count on the GPU, so a CUDA graph can replay it.")
    cls = "torch.optim.AdamW" if config.optimizer == "adamw" else "torch.optim.SGD"
    return "\n".join(
        [
            "def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:",
            f'    """{name} over the model\'s trainable parameters."""',
            "    params = [p for p in model.parameters() if p.requires_grad]",
            *comments,
            *call(f"return {cls}", args, indent=4),
        ]
    )


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    snippet.make_optimizer = make_optimizer_source(config, snippet.device)


def _space(ctx: SpaceContext) -> Space:
    """The kernel strategy only: another algorithm (`optimizer`) trains a different model."""
    return {"optimizer_impl": ctx.available("optimizer_impl")}


def _apply(step: TrainStep) -> None:
    """Once the model is final, so the optimizer holds the parameters that train; CUDA graphs need
    capturable Adam(W) (the step counter on the device), so that is decided here already."""
    config = step.config
    step.optimizer, record = apply_optimizer(
        step.base_model, config.optimizer, config.optimizer_impl, config.lr, capturable=config.cuda_graphs
    )
    step.applied.append(record)


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    if name == "optimizer":
        return "SGD with momentum 0.9 instead of AdamW"
    return {
        "for-loop": "one optimizer kernel per parameter",
        "foreach": "batched (foreach) optimizer kernels",
        "fused": "fused optimizer kernel",
    }.get(value)


LEVER = Lever(
    name="optimizer",
    fields=("optimizer", "optimizer_impl"),
    summary="the optimizer's kernels: foreach or fused updates cut launches on models with many parameters",
    availability=_availability,
    snippet=_snippet,
    space=_space,
    fixed={"optimizer": "another algorithm trains a different model"},
    apply=_apply,
    describe=_describe,
)
