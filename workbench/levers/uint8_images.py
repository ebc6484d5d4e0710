"""uint8 images over the copy: the loader ships pixels, the device scales and normalizes them.

A float32 image is four bytes a channel where the decoded pixel was one; shipping the uint8 pixels
copies a quarter of the bytes from the loader to the device (and through its workers' shared
memory), and the device does the cheap scale and normalize after the copy. The cost: the resized
pixels are rounded to whole levels before the copy (at most half a level off the float path).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.config import TrainConfig
from workbench.levers.base import Lever, always
from workbench.levers.record import Applied
from workbench.workloads.base import WorkloadError
from workbench.workloads.camera_files import MEAN, STD

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep
    from workbench.levers.fragment import Snippet

_NORMALIZE_IMAGES = """def normalize_images(batch: Batch) -> Batch:
    \"\"\"batch[IMAGES] as uint8 pixels on the device -> floats scaled to [0, 1], normalized.

    Float images pass unchanged: only the uint8 ones are the loader's to finish here.
    \"\"\"
    images = batch[IMAGES]
    if images.dtype != torch.uint8:
        return batch
    mean = torch.tensor(IMAGE_MEAN, device=images.device).view(3, 1, 1)
    std = torch.tensor(IMAGE_STD, device=images.device).view(3, 1, 1)
    return {**batch, IMAGES: (images.float() / 255.0 - mean) / std}"""


def apply_uint8_images(step: TrainStep) -> None:
    """Normalize each batch's uint8 images on the device (its loader already ships them as uint8)."""
    if not step.config.uint8_images:
        return
    path = step.workload.uint8_images
    if path is None:
        raise WorkloadError(
            f"workload '{step.workload.name}' has no uint8 path for its images; drop uint8_images "
            "(bev-perception with extra.camera_files=true has one)"
        )
    step.on_device.append(path.normalize)
    step.applied.append(
        Applied("uint8_images", True, f"images copied as uint8, scaled and normalized on {step.device.type}")
    )


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    """The normalization after the copy; the Dataset's side (uint8 pixels out) is the user's to write."""
    if not config.uint8_images:
        return
    snippet.constants += [
        "# uint8 images: your Dataset returns batch[IMAGES] as resized uint8 pixels (0-255),",
        "# a quarter of float32's bytes to copy; train_step normalizes them on the device.",
        'IMAGES = "images"  # the batch key of the images',
        f"IMAGE_MEAN = {MEAN}  # per channel, of pixels scaled to [0, 1]",
        f"IMAGE_STD = {STD}",
    ]
    snippet.helpers.append(_NORMALIZE_IMAGES)
    # First of the batch lines: every later line (channels_last) sees the float images.
    snippet.batch_lines.insert(0, "batch = normalize_images(batch)")


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    return "images copied to the device as uint8 and normalized there: a quarter of the bytes"


LEVER = Lever(
    name="uint8_images",
    fields=("uint8_images",),
    summary="copy images to the device as uint8 and normalize them there: a quarter of float32's bytes",
    availability=always("uint8_images"),
    apply=apply_uint8_images,
    snippet=_snippet,
    describe=_describe,
    not_searched="only a workload with a uint8 path for its images can take it (bev-perception with camera_files)",
)
