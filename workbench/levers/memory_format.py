"""channels_last: NHWC layout for 4-D weights and inputs, so convolutions skip layout transposes.

Applied first, before the optimizer exists and before compile traces strides, so every later
step (optimizer state created `zeros_like` the parameters, compiled kernels) sees the final layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.levers.base import Lever, Space, SpaceContext, always
from workbench.levers.fragment import Snippet
from workbench.levers.record import Applied
from workbench.workloads.base import map_tensors

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep


def apply_channels_last(model: nn.Module) -> Applied:
    """Convert the model's 4-D parameters and buffers to channels_last, in place."""
    model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    four_d = [name for name, p in model.named_parameters() if p.dim() == 4]
    converted = [
        name
        for name, p in model.named_parameters()
        if p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last)
    ]
    if not four_d:
        detail = "no 4-D parameters: the model has no convolutions to benefit (inputs are still converted)"
    else:
        detail = (
            f"{len(converted)}/{len(four_d)} 4-D parameters are channels_last; 4-D floating inputs converted per batch"
        )
    return Applied("channels_last", True, detail)


def to_channels_last(batch: Any) -> Any:
    """Every 4-D floating tensor of a (nested) batch in channels_last; other tensors untouched."""

    def convert(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 4 and tensor.is_floating_point():
            return tensor.contiguous(memory_format=torch.channels_last)
        return tensor

    return map_tensors(batch, convert)


IMAGES_CHANNELS_LAST = """def images_channels_last(tensor: torch.Tensor) -> torch.Tensor:
    \"\"\"4-D floating tensors (images) in the weights' NHWC layout; others unchanged.\"\"\"
    if tensor.dim() == 4 and tensor.is_floating_point():
        return tensor.contiguous(memory_format=torch.channels_last)
    return tensor"""


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    if not config.channels_last:
        return
    snippet.model_move = [
        "    # NHWC weights let convolutions skip layout transposes. First, because it",
        "    # rewrites weight storage that optimizer state and compiled code must see.",
        "    model = model.to(DEVICE, memory_format=torch.channels_last)",
    ]
    snippet.batch_lines.append("batch = map_tensors(batch, images_channels_last)")
    snippet.helpers.append(IMAGES_CHANNELS_LAST)


def _space(ctx: SpaceContext) -> Space:
    return {"channels_last": (False, True)}


def _apply(step: TrainStep) -> None:
    if step.config.channels_last:
        step.applied.append(apply_channels_last(step.base_model))


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    return "NHWC memory format for 4-D weights and inputs"


LEVER = Lever(
    name="channels_last",
    fields=("channels_last",),
    summary="NHWC weights and images: convolutions skip layout transposes (conv nets, mostly with AMP)",
    availability=always("channels_last"),
    snippet=_snippet,
    space=_space,
    apply=_apply,
    describe=_describe,
)
