"""`e2e-planner`: an end-to-end driving planner over camera tokens, ego state and route (UniAD / VAD style, reduced).

Camera feature tokens, one ego-state token and the route polyline's points are embedded
into one token sequence; a transformer encoder mixes them, and learned trajectory
queries (one per future waypoint) read out the plan. An auxiliary head predicts which
camera tokens are occupied, as perception-aware planners do. In the synthetic scenes the
plan follows the ego kinematics and the route and brakes for occupied tokens ahead, so
every target is a function of the inputs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workbench.workloads.base import Workload
from workbench.workloads.catalog import register
from workbench.workloads.layers import TransformerBlock, init_transformer_weights, transformer_tp_plan
from workbench.workloads.synthetic import Sample, SyntheticDataset, check_sample_cost, choose_preset

NAME = "e2e-planner"
EGO_FIELDS = 6
"""Ego state: speed, acceleration, yaw rate, steering, and the route's curvature and heading error."""
HORIZON_S = 4.0
"""Seconds of future covered by the waypoints."""
METRES_PER_UNIT = 20.0
"""Waypoints are regressed in units of 20 m, so the L1/L2 terms start near 1."""
OCCUPANCY_KEY_SEED = 1234
"""Seed of the fixed projection that decides which camera tokens are occupied (same for every sample)."""


@dataclass(frozen=True)
class PlannerSize:
    """One preset: token counts and transformer width/depth."""

    cameras: int
    tokens_per_camera: int
    feature_dim: int
    """Width of the incoming camera feature tokens (a frozen image backbone's output)."""
    route_points: int
    waypoints: int
    dim: int
    depth: int
    heads: int
    batch_size: int


PRESETS = {
    "tiny": PlannerSize(
        cameras=6,
        tokens_per_camera=16,
        feature_dim=64,
        route_points=16,
        waypoints=8,
        dim=128,
        depth=4,
        heads=4,
        batch_size=16,
    ),
    "base": PlannerSize(
        cameras=6,
        tokens_per_camera=256,
        feature_dim=512,
        route_points=32,
        waypoints=12,
        dim=768,
        depth=12,
        heads=12,
        batch_size=16,
    ),
    "large": PlannerSize(
        cameras=6,
        tokens_per_camera=384,
        feature_dim=1024,
        route_points=64,
        waypoints=16,
        dim=1280,
        depth=24,
        heads=20,
        batch_size=8,
    ),
}


def occupancy_key(feature_dim: int) -> torch.Tensor:
    """The fixed unit vector whose sign of projection marks a camera token as occupied."""
    key = torch.randn(feature_dim, generator=torch.Generator().manual_seed(OCCUPANCY_KEY_SEED), device="cpu")
    return key / key.norm()


@dataclass(frozen=True)
class PlannerSceneSampler:
    """One synthetic driving moment: camera tokens, ego state, route, and the plan they imply."""

    size: PlannerSize

    def __call__(self, generator: torch.Generator) -> Sample:
        size = self.size
        tokens = torch.randn(size.cameras, size.tokens_per_camera, size.feature_dim, generator=generator)
        occupancy = (tokens @ occupancy_key(size.feature_dim) > 0.5).float()  # about 30% of tokens
        # The front camera (index 0) decides how hard to brake: more occupied tokens ahead, lower speed.
        blocked = occupancy[0].mean()
        speed = 3.0 + 12.0 * torch.rand((), generator=generator)
        accel = (torch.rand((), generator=generator) - 0.5) * 2.0 - 4.0 * blocked
        curvature = (torch.rand((), generator=generator) - 0.5) * 0.06  # 1/m, up to ±33 m radius
        heading_error = (torch.rand((), generator=generator) - 0.5) * 0.2
        steer = torch.rand((), generator=generator) - 0.5
        yaw_rate = speed * curvature
        ego = torch.stack([speed / 10, accel / 4, yaw_rate, steer, curvature * 30, heading_error * 5])
        route = _arc(curvature, heading_error, torch.linspace(0.0, 60.0, size.route_points))
        times = torch.linspace(HORIZON_S / size.waypoints, HORIZON_S, size.waypoints)
        moving = torch.minimum(times, speed / (-accel).clamp(min=1e-6))  # braking ends in a stop, not reversing
        travelled = speed * moving + 0.5 * accel * moving**2
        waypoints = _arc(curvature, heading_error, travelled)
        return {
            "cam_tokens": tokens,
            "ego": ego,
            "route": route / METRES_PER_UNIT,
            "waypoints": waypoints / METRES_PER_UNIT,
            "occupancy": occupancy,
        }


def _arc(curvature: torch.Tensor, heading: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
    """Points `distance` metres along a constant-curvature arc from the origin: (len(distance), 2)."""
    # x = ∫cos, y = ∫sin along the arc; the chord/sinc form stays finite as the curvature goes to zero.
    half = 0.5 * curvature * distance
    chord = distance * torch.sinc(half / torch.pi)
    return torch.stack([chord * torch.cos(heading + half), chord * torch.sin(heading + half)], dim=-1)


class PlannerModel(nn.Module):
    """Tokens [plan queries; ego; route; cameras] → TransformerBlocks → waypoints and per-token occupancy."""

    def __init__(self, size: PlannerSize) -> None:
        super().__init__()
        dim = size.dim
        self.size = size
        self.camera_proj = nn.Linear(size.feature_dim, dim)
        self.camera_pos = nn.Parameter(torch.zeros(1, size.cameras * size.tokens_per_camera, dim))
        self.ego_embed = nn.Sequential(nn.Linear(EGO_FIELDS, dim), nn.GELU(), nn.Linear(dim, dim))
        self.route_embed = nn.Linear(2, dim)
        self.route_pos = nn.Parameter(torch.zeros(1, size.route_points, dim))
        self.queries = nn.Parameter(torch.zeros(1, size.waypoints, dim))
        self.blocks = nn.Sequential(*[TransformerBlock(dim, size.heads) for _ in range(size.depth)])
        self.norm = nn.LayerNorm(dim)
        self.waypoint_head = nn.Linear(dim, 2)
        self.occupancy_head = nn.Linear(dim, 1)
        self.apply(init_transformer_weights)
        for param in (self.camera_pos, self.route_pos, self.queries):
            nn.init.normal_(param, std=0.02)

    def forward(self, cam_tokens: torch.Tensor, ego: torch.Tensor, route: torch.Tensor) -> dict[str, torch.Tensor]:
        batch = cam_tokens.shape[0]
        cams = self.camera_proj(cam_tokens.flatten(1, 2)) + self.camera_pos
        ego_token = self.ego_embed(ego)[:, None]
        route_tokens = self.route_embed(route) + self.route_pos
        queries = self.queries.expand(batch, -1, -1)
        x = self.norm(self.blocks(torch.cat([queries, ego_token, route_tokens, cams], dim=1)))
        plan, cam_out = x[:, : self.size.waypoints], x[:, -cams.shape[1] :]
        return {
            "waypoints": self.waypoint_head(plan),
            "occupancy": self.occupancy_head(cam_out).squeeze(-1).unflatten(1, cam_tokens.shape[1:3]),
        }


def planner_forward(model: nn.Module, batch: Sample) -> dict[str, torch.Tensor]:
    return model(batch["cam_tokens"], batch["ego"], batch["route"])


def planner_loss(output: dict[str, torch.Tensor], batch: Sample) -> torch.Tensor:
    """L1 + L2 on the waypoints (the usual imitation losses), plus 0.5 × occupancy BCE as the auxiliary task."""
    error = output["waypoints"].float() - batch["waypoints"]
    plan_loss = error.abs().mean() + error.pow(2).sum(-1).mean()
    occupancy_loss = F.binary_cross_entropy_with_logits(output["occupancy"].float(), batch["occupancy"])
    return plan_loss + 0.5 * occupancy_loss


@register(NAME, "end-to-end planner: camera tokens + ego state + route through a transformer to future waypoints")
def build_e2e_planner(preset: str = "tiny", sample_cost_ms: float = 0.0) -> Workload:
    """The `e2e-planner` workload at a size preset; `sample_cost_ms` simulates per-sample decoding."""
    size = choose_preset(NAME, preset, PRESETS)
    cost = check_sample_cost(NAME, sample_cost_ms)
    return Workload(
        name=NAME,
        model_fn=functools.partial(PlannerModel, size),
        loss_fn=planner_loss,
        batch_size=size.batch_size,
        dataset_fn=functools.partial(_dataset, size, cost),
        forward_fn=planner_forward,
        checkpoint_target="TransformerBlock",
        tp_plan=transformer_tp_plan("blocks"),
        preset=preset,
        description="end-to-end planner (camera tokens, ego state and route → transformer → waypoints + occupancy)",
        options={"sample_cost_ms": cost},
    )


def _dataset(size: PlannerSize, sample_cost_ms: float, seed: int) -> SyntheticDataset:
    return SyntheticDataset(PlannerSceneSampler(size), seed, sample_cost_ms)
