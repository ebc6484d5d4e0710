"""`bev-perception`: multi-camera 3-D detection in bird's-eye view (BEVDet / Lift-Splat-Shoot style).

Six cameras share a ResNet-style backbone; each image column is lifted into a depth
distribution × context features and splatted onto a BEV grid through a fixed geometry
precomputed once (an index per frustum point, no data-dependent control flow, so it
compiles and checkpoints). A conv + attention BEV encoder feeds CenterPoint-style heads.
The synthetic scenes render the objects into the cameras with that same geometry, so
the targets are learnable from the images and the loss really falls.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from workbench.workloads.base import Uint8Images, Workload, WorkloadError
from workbench.workloads.camera_files import CameraFileDataset, check_decoder, normalize_on_device
from workbench.workloads.catalog import register
from workbench.workloads.layers import ConvBNAct, GridAttention, res_stage
from workbench.workloads.synthetic import Sample, SyntheticDataset, check_sample_cost, choose_preset

NAME = "bev-perception"
BOX_FIELDS = 6
"""Box regression channels: x/y offset inside the cell, log width, log length, sin yaw, cos yaw."""


@dataclass(frozen=True)
class CameraRig:
    """Where the cameras look and what the BEV grid covers; shared by the renderer and the model."""

    cameras: int = 6
    fov: float = math.radians(80.0)
    """Horizontal field of view; wider than 360°/cameras so neighbouring views overlap."""
    min_range: float = 4.0
    max_range: float = 38.0
    bev_range: float = 40.0
    """The grid spans [-bev_range, bev_range] metres on both axes around the ego car."""

    def yaws(self) -> torch.Tensor:
        """Camera headings (radians, float64, on the CPU even inside a `torch.device('meta')` block)."""
        return torch.arange(self.cameras, dtype=torch.float64, device="cpu") * (2 * math.pi / self.cameras)


@dataclass(frozen=True)
class BevSize:
    """One preset: image size, backbone widths and BEV resolution."""

    image: tuple[int, int]
    widths: tuple[int, int, int]
    """Stem, stage-1 and stage-2 channels; the backbone has stride 8."""
    blocks: int
    """ResBlocks per backbone stage."""
    depth_bins: int
    bev_channels: int
    grid: int
    """BEV cells per side."""
    bev_blocks: int
    attention_depth: int
    heads: int
    objects: int
    batch_size: int

    def __post_init__(self) -> None:
        if self.image[0] % 8 or self.image[1] % 8:
            raise ValueError(f"camera images must be multiples of 8 pixels (the backbone's stride), got {self.image}")


PRESETS = {
    "tiny": BevSize(
        image=(64, 96),
        widths=(32, 64, 96),
        blocks=1,
        depth_bins=16,
        bev_channels=64,
        grid=16,
        bev_blocks=2,
        attention_depth=1,
        heads=2,
        objects=3,
        batch_size=4,
    ),
    "base": BevSize(
        image=(256, 448),
        widths=(64, 256, 512),
        blocks=4,
        depth_bins=48,
        bev_channels=256,
        grid=64,
        bev_blocks=4,
        attention_depth=2,
        heads=8,
        objects=8,
        batch_size=8,
    ),
    "large": BevSize(
        image=(384, 672),
        widths=(96, 384, 768),
        blocks=6,
        depth_bins=64,
        bev_channels=384,
        grid=96,
        bev_blocks=6,
        attention_depth=4,
        heads=12,
        objects=12,
        batch_size=4,
    ),
}


def splat_geometry(rig: CameraRig, columns: int, depth_bins: int, grid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each frustum point (camera, column, depth bin), its flat BEV cell, and 1/points per cell.

    Points outside the grid go to a spare cell `grid * grid` that the model drops. Cell
    (ix, iy) is `ix * grid + iy`, ix along x (forward), iy along y (left). Built on the
    CPU in float64 once, at model construction.
    """
    cpu = torch.device("cpu")
    yaw = rig.yaws()[:, None, None]
    column = (torch.arange(columns, dtype=torch.float64, device=cpu) + 0.5) / columns
    azimuth = yaw + ((column - 0.5) * rig.fov)[None, :, None]
    step = (rig.max_range - rig.min_range) / depth_bins
    ranges = rig.min_range + (torch.arange(depth_bins, dtype=torch.float64, device=cpu) + 0.5) * step
    x = ranges[None, None, :] * torch.cos(azimuth)
    y = ranges[None, None, :] * torch.sin(azimuth)
    cell = 2 * rig.bev_range / grid
    ix = torch.floor((x + rig.bev_range) / cell).long()
    iy = torch.floor((y + rig.bev_range) / cell).long()
    inside = (ix >= 0) & (ix < grid) & (iy >= 0) & (iy < grid)
    index = torch.where(inside, ix * grid + iy, torch.full_like(ix, grid * grid)).flatten()
    counts = torch.zeros(grid * grid + 1, dtype=torch.float64, device=cpu).index_add(
        0, index, torch.ones(index.numel(), dtype=torch.float64, device=cpu)
    )
    return index, (1.0 / counts.clamp(min=1.0)).float()


class SceneObjects(NamedTuple):
    """Objects on the ground, one entry per object: polar position around the ego car, size and heading."""

    azimuth: torch.Tensor
    distance: torch.Tensor
    width: torch.Tensor
    length: torch.Tensor
    heading: torch.Tensor


def render_cameras(rig: CameraRig, image: tuple[int, int], objects: SceneObjects) -> torch.Tensor:
    """Noise-free camera images (cameras, 3, H, W): each object a blob whose colour encodes its size and heading.

    The column follows the azimuth inside the camera's field of view (the same mapping the
    model's splat geometry assumes); the row and blob size follow the range, as a ground
    contact point does below the horizon.
    """
    height, width = image
    yaws = rig.yaws().float()[:, None]
    relative = torch.remainder(objects.azimuth[None, :] - yaws + math.pi, 2 * math.pi) - math.pi
    visible = (relative.abs() < rig.fov / 2).float()  # (cameras, objects)
    u = (0.5 + relative / rig.fov) * width
    horizon = 0.35 * height
    v = horizon + (height - horizon) * rig.min_range / objects.distance  # nearer is lower in the image
    radius = (0.5 * (width / rig.fov) * objects.width / objects.distance).clamp(1.0, height / 4)
    rows = torch.arange(height, dtype=torch.float32, device="cpu")
    cols = torch.arange(width, dtype=torch.float32, device="cpu")
    # A Gaussian blob is separable: (row profile) × (column profile), summed over objects by one
    # batched matmul instead of a (cameras, objects, H, W) tensor; large presets stay cheap to render.
    column_profile = _gaussian((cols - u[..., None]) / radius[..., None]) * visible[..., None]
    row_profile = _gaussian((rows - (v - radius)[..., None]) / radius[..., None])
    colour = torch.stack(
        [(objects.length - 3.5) / 2, (objects.width - 1.6) / 0.8, 0.5 + 0.5 * torch.cos(objects.heading)]
    )
    rows_by_colour = ((0.3 + 0.7 * colour)[:, :, None] * row_profile).transpose(1, 2).reshape(3 * height, -1)
    return torch.matmul(rows_by_colour, column_profile).view(-1, 3, height, width)


def _gaussian(z: torch.Tensor) -> torch.Tensor:
    """exp(-z²/2), cut to exactly 0 beyond 4σ.

    Beyond 4σ nothing is visible anyway, and the far tails would underflow into denormal
    floats, which are slow on CPUs and would leak tiny non-zeros into every pixel.
    """
    return torch.where(z.abs() < 4.0, torch.exp(-0.5 * z * z), torch.zeros_like(z))


def bev_targets(rig: CameraRig, grid: int, objects: SceneObjects) -> dict[str, torch.Tensor]:
    """CenterPoint targets: Gaussian centre heatmap (peak exactly 1 on each object's cell), box fields, box mask."""
    cell = 2 * rig.bev_range / grid
    gx = (objects.distance * torch.cos(objects.azimuth) + rig.bev_range) / cell
    gy = (objects.distance * torch.sin(objects.azimuth) + rig.bev_range) / cell
    ix, iy = gx.floor().long(), gy.floor().long()
    cells = torch.arange(grid, dtype=torch.float32, device="cpu")
    d2 = (cells[None, :, None] - ix[:, None, None]) ** 2 + (cells[None, None, :] - iy[:, None, None]) ** 2
    heatmap = _gaussian(d2.sqrt()).amax(dim=0)[None]
    fields = [gx - ix, gy - iy, objects.width.log(), objects.length.log()]
    fields += [torch.sin(objects.heading), torch.cos(objects.heading)]
    boxes = torch.zeros(BOX_FIELDS, grid * grid)
    mask = torch.zeros(1, grid * grid)
    flat = ix * grid + iy
    boxes[:, flat] = torch.stack(fields)
    mask[:, flat] = 1.0
    return {"heatmap": heatmap, "boxes": boxes.view(BOX_FIELDS, grid, grid), "box_mask": mask.view(1, grid, grid)}


@dataclass(frozen=True)
class BevSceneSampler:
    """One synthetic scene: a few objects around the ego car, seen by every camera that covers them, plus targets."""

    size: BevSize
    rig: CameraRig = CameraRig()

    def __call__(self, generator: torch.Generator) -> Sample:
        return self.scene(generator, self.size.image)

    def scene(self, generator: torch.Generator, image: tuple[int, int] | None) -> Sample:
        """The scene's targets, and its camera images at `image` (height, width) unless None."""
        rig, k = self.rig, self.size.objects

        def uniform(low: float, high: float) -> torch.Tensor:
            return low + (high - low) * torch.rand(k, generator=generator)

        # Stratified azimuths keep the objects apart, so two rarely share a cell.
        azimuth = (torch.arange(k) + torch.rand(k, generator=generator)) * (2 * math.pi / k)
        objects = SceneObjects(
            azimuth,
            uniform(rig.min_range, rig.max_range),
            uniform(1.6, 2.4),
            uniform(3.5, 5.5),
            uniform(-math.pi, math.pi),
        )
        targets = bev_targets(rig, self.size.grid, objects)
        if image is None:
            return targets
        # Noise in 4×4-pixel blocks, added in place through a broadcast view: a sixteenth of the
        # random numbers and no extra full-size tensor (fresh pages cost more than the arithmetic),
        # so even the large preset's six 384×672 images take only milliseconds.
        height, width = image
        images = render_cameras(rig, image, objects)
        noise = 0.1 * torch.randn(rig.cameras, 3, height // 4, 1, width // 4, 1, generator=generator)
        images.view(rig.cameras, 3, height // 4, 4, width // 4, 4).add_(noise)
        return {"images": images, **targets}


class BevPerceptionModel(nn.Module):
    """Backbone per camera → lift (depth softmax × features per image column) → splat → BEV encoder → heads."""

    splat_index: torch.Tensor
    splat_scale: torch.Tensor

    def __init__(self, size: BevSize, rig: CameraRig = CameraRig()) -> None:
        super().__init__()
        stem, mid, out = size.widths
        self.size = size
        self.backbone = nn.Sequential(
            ConvBNAct(3, stem, stride=2),
            res_stage(stem, mid, size.blocks, stride=2),
            res_stage(mid, out, size.blocks, stride=2),
        )
        feat_h, columns = size.image[0] // 8, size.image[1] // 8
        # Collapsing a column with a learned map over (channels × rows) keeps the row a blob
        # sits on, which is what tells its range (as in OFT / PON column encoders).
        self.lift = nn.Linear(out * feat_h, size.depth_bins + size.bev_channels)
        # Geometry is computed on the CPU, then placed like the parameters: built inside
        # `with torch.device("cuda"):` the buffers must be on the GPU too.
        index, inverse_counts = splat_geometry(rig, columns, size.depth_bins, size.grid)
        device = torch.get_default_device()
        self.register_buffer("splat_index", index.to(device), persistent=False)
        self.register_buffer("splat_scale", inverse_counts.to(device), persistent=False)
        channels = size.bev_channels
        self.bev_encoder = nn.Sequential(
            res_stage(channels, channels, size.bev_blocks // 2, stride=1),
            GridAttention(channels, size.grid, size.grid, size.heads, size.attention_depth),
            res_stage(channels, channels, size.bev_blocks - size.bev_blocks // 2, stride=1),
        )
        # CenterNet's prior: start predicting "no object" (p ≈ 0.1) so the focal loss starts sane.
        self.heatmap_head = _head(channels, 1, bias=-2.19)
        self.box_head = _head(channels, BOX_FIELDS)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        batch, cameras, channels, height, width = images.shape
        feats = self.backbone(images.reshape(batch * cameras, channels, height, width))
        columns = feats.permute(0, 3, 1, 2).flatten(2)  # (B·N, W', C·H')
        lifted = self.lift(columns)
        depth = lifted[..., : self.size.depth_bins].softmax(dim=-1)
        context = lifted[..., self.size.depth_bins :]
        frustum = depth[..., :, None] * context[..., None, :]  # (B·N, W', D, C)
        frustum = frustum.reshape(batch, -1, frustum.shape[-1])  # points ordered (camera, column, depth)
        grid = self.size.grid
        # Sum in fp32 even under autocast: a cell gathers many points, and bf16 sums lose them.
        bev = frustum.new_zeros(batch, grid * grid + 1, frustum.shape[-1], dtype=torch.float32)
        bev = bev.index_add(1, self.splat_index, frustum.float()) * self.splat_scale[None, :, None]
        bev = bev[:, : grid * grid].transpose(1, 2).reshape(batch, -1, grid, grid)
        bev = self.bev_encoder(bev)
        return {"heatmap": self.heatmap_head(bev), "boxes": self.box_head(bev)}


def _head(channels: int, outputs: int, bias: float = 0.0) -> nn.Sequential:
    out = nn.Conv2d(channels, outputs, 1)
    assert out.bias is not None  # Conv2d has a bias unless told otherwise
    nn.init.constant_(out.bias, bias)
    return nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(), out)


def bev_forward(model: nn.Module, batch: Sample) -> dict[str, torch.Tensor]:
    return model(batch["images"])


def bev_loss(output: dict[str, torch.Tensor], batch: Sample) -> torch.Tensor:
    """CenterNet focal loss on the heatmap plus L1 on the box fields of the cells that hold an object."""
    logits, target = output["heatmap"].float(), batch["heatmap"]
    positive = (target >= 1.0).float()  # exact 1.0 at each object's own cell
    objects = positive.sum().clamp(min=1.0)
    prob = torch.sigmoid(logits)
    pos_loss = (1 - prob) ** 2 * F.logsigmoid(logits) * positive
    neg_loss = (1 - target) ** 4 * prob**2 * F.logsigmoid(-logits) * (1 - positive)
    heatmap_loss = -(pos_loss.sum() + neg_loss.sum()) / objects
    mask = batch["box_mask"]
    box_error = (output["boxes"].float() - batch["boxes"]).abs() * mask
    box_loss = box_error.sum() / (mask.sum() * BOX_FIELDS).clamp(min=1.0)
    return heatmap_loss + box_loss


@register(NAME, "six-camera 3-D detection: shared ResNet backbone, Lift-Splat to BEV, conv+attention encoder")
def build_bev_perception(
    preset: str = "tiny",
    sample_cost_ms: float = 0.0,
    camera_files: bool = False,
    decoder: str = "pillow",
    cache_dir: str = "",
) -> Workload:
    """The `bev-perception` workload at a size preset; `sample_cost_ms` simulates per-sample decoding.

    `camera_files=True`: every sample reads its cameras' JPEG files (written once into `cache_dir`,
    default ~/.cache/workbench), decodes them with `decoder` ('pillow' or 'simplejpeg'), resizes
    and normalizes them: a real decode stall instead of the busy loop.
    """
    size = choose_preset(NAME, preset, PRESETS)
    cost = check_sample_cost(NAME, sample_cost_ms)
    options: dict[str, Any] = {"sample_cost_ms": cost}
    if not isinstance(camera_files, bool):
        raise WorkloadError(f"workload '{NAME}': camera_files must be true or false, got {camera_files!r}")
    uint8_images = None
    if camera_files:
        options.update(camera_files=True, decoder=check_decoder(NAME, decoder), cache_dir=str(cache_dir))
        uint8_dataset = functools.partial(_dataset, size, {**options, "uint8": True})
        uint8_images = Uint8Images(dataset_fn=uint8_dataset, normalize=normalize_on_device)
    return Workload(
        name=NAME,
        model_fn=functools.partial(BevPerceptionModel, size),
        loss_fn=bev_loss,
        batch_size=size.batch_size,
        dataset_fn=functools.partial(_dataset, size, options),
        forward_fn=bev_forward,
        checkpoint_target="ResBlock",
        preset=preset,
        description="six-camera BEV detection (ResNet backbone, Lift-Splat, conv+attention BEV encoder)",
        options=options,
        uint8_images=uint8_images,
    )


def _dataset(size: BevSize, options: dict[str, Any], seed: int) -> Dataset[Sample]:
    sampler = BevSceneSampler(size)
    cost = options["sample_cost_ms"]
    if not options.get("camera_files"):
        return SyntheticDataset(sampler, seed, cost)
    return CameraFileDataset(
        sampler.scene,
        size.image,
        sampler.rig.cameras,
        seed,
        cache_dir=options["cache_dir"],
        decoder=options["decoder"],
        sample_cost_ms=cost,
        uint8=bool(options.get("uint8")),
    )
