"""Built-in workloads: they learn, their data are deterministic and consistent, and every toggle's path runs.

Everything trains the `tiny` presets on the CPU; `base`/`large` are only built on the
meta device and counted. The whole file should stay well under a minute on 2 cores.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, default_collate

from workbench.workloads import Workload, WorkloadError, bev, builtin_workloads, load_workload, planner, vlm
from workbench.workloads.layers import TransformerBlock
from workbench.workloads.synthetic import SyntheticDataset, sample_seed

BUILTINS = ("bev-perception", "e2e-planner", "driving-vlm")


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread() -> Iterator[None]:
    """Train on one thread: when other jobs share these 2 cores, two OpenMP threads wait on each
    other and a 0.1 s step was seen taking 1.3 s; one thread degrades gracefully instead."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _dataset(workload: Workload, seed: int = 0) -> Any:
    assert workload.dataset_fn is not None
    return workload.dataset_fn(seed)


def _batch(workload: Workload, seed: int = 0, start: int = 0) -> dict[str, torch.Tensor]:
    dataset = _dataset(workload, seed)
    return default_collate([dataset[i] for i in range(start, start + workload.batch_size)])


def _model(workload: Workload) -> nn.Module:
    torch.manual_seed(0)
    return workload.model_fn()


def _loss(workload: Workload, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return workload.loss_fn(workload.forward_fn(model, batch), batch)


def _train_step(workload: Workload, model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> float:
    loss = _loss(workload, model, batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- registry ---------------------------------------------------------------------------


def test_registry_lists_the_three_builtins_and_loads_one() -> None:
    assert set(BUILTINS) <= set(builtin_workloads())
    workload = load_workload("bev-perception", preset="tiny")
    assert (workload.name, workload.preset, workload.checkpoint_target) == ("bev-perception", "tiny", "ResBlock")
    assert workload.options == {"sample_cost_ms": 0.0}
    assert workload.source == {"kind": "builtin", "name": "bev-perception", "preset": "tiny", "options": {}}


def test_unknown_workload_or_preset_names_the_valid_choices() -> None:
    with pytest.raises(WorkloadError, match=r"bev-perception.*driving-vlm.*e2e-planner"):
        load_workload("bev-perceptoin")
    with pytest.raises(WorkloadError, match="tiny, base, large"):
        load_workload("e2e-planner", preset="huge")
    with pytest.raises(WorkloadError, match="tiny, base, large"):
        vlm.build_driving_vlm("huge")  # the builder checks too, when called directly
    with pytest.raises(WorkloadError, match="sample_cost_ms"):
        load_workload("driving-vlm", sample_cost_ms=-1)
    with pytest.raises(WorkloadError, match=r"has no option 'no_such_option'; its options: .*sample_cost_ms"):
        load_workload("driving-vlm", no_such_option=1)


# --- learning ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTINS)
def test_tiny_loss_falls_over_30_adamw_steps(name: str) -> None:
    workload = load_workload(name, preset="tiny")
    model = _model(workload)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = [
        _train_step(workload, model, optimizer, _batch(workload, start=s * workload.batch_size)) for s in range(30)
    ]
    first, last = statistics.mean(losses[:5]), statistics.mean(losses[-5:])
    # Seen here: last/first ≈ 0.42 (bev), 0.37 (planner), 0.30 (vlm); 0.8 leaves room for noise.
    assert last < 0.8 * first, f"{name}: loss went {first:.3f} -> {last:.3f}: {losses}"


@pytest.mark.parametrize("name", BUILTINS)
def test_tiny_train_step_is_well_under_a_second(name: str) -> None:
    workload = load_workload(name, preset="tiny")
    model = _model(workload)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = _batch(workload)
    _train_step(workload, model, optimizer, batch)  # warm-up
    times = []
    for _ in range(3):
        start = time.perf_counter()
        _train_step(workload, model, optimizer, batch)
        times.append(time.perf_counter() - start)
    assert statistics.median(times) < 1.0, f"{name}: tiny fp32 step took {times} s"


# --- data -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTINS)
def test_equal_seeds_give_equal_samples_in_any_order(name: str) -> None:
    workload = load_workload(name, preset="tiny")
    a, b, other = _dataset(workload, 0), _dataset(workload, 0), _dataset(workload, 1)
    forward = [a[i] for i in (3, 7)]
    backward = [b[i] for i in (7, 3)][::-1]  # workers fetch out of order; the sample must not care
    assert all(_same(x, y) for x, y in zip(forward, backward))
    assert not _same(a[3], other[3])
    assert not _same(a[3], a[4])
    assert len(a) >= 1_000_000


def test_sample_seeds_do_not_collide_across_neighbouring_seeds() -> None:
    seeds = {sample_seed(seed, index) for seed in range(50) for index in range(200)}
    assert len(seeds) == 50 * 200
    assert all(0 <= s < 2**63 for s in seeds)


def test_sample_cost_burns_cpu_in_getitem() -> None:
    workload = load_workload("e2e-planner", preset="tiny", sample_cost_ms=20)
    assert workload.options == {"sample_cost_ms": 20.0}
    dataset = _dataset(workload)
    wall, cpu = time.perf_counter(), time.process_time()
    dataset[0]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert wall >= 0.020
    assert cpu >= 0.005, "the cost must be CPU work (like decoding), not a sleep"


def test_datasets_pickle_into_spawned_loader_workers() -> None:
    datasets = [_dataset(load_workload(name, preset="tiny"), seed=5) for name in BUILTINS]
    loader = DataLoader(
        torch.utils.data.ConcatDataset(datasets),
        batch_size=None,
        sampler=[0, 1_000_000, 2_000_000],
        num_workers=1,
        multiprocessing_context="spawn",
    )
    from_worker = list(loader)
    assert all(_same(sample, dataset[0]) for sample, dataset in zip(from_worker, datasets))


def test_bev_cameras_show_each_object_where_the_splat_geometry_puts_it() -> None:
    size, rig = bev.PRESETS["tiny"], bev.CameraRig()
    index, _ = bev.splat_geometry(rig, size.image[1] // 8, size.depth_bins, size.grid)
    index = index.view(rig.cameras, size.image[1] // 8, size.depth_bins)
    depth_step = (rig.max_range - rig.min_range) / size.depth_bins
    for azimuth, distance in [(0.3, 10.0), (2.0, 25.0), (4.4, 35.0), (5.9, 6.0)]:
        one = torch.tensor([1.0])
        objects = bev.SceneObjects(torch.tensor([azimuth]), torch.tensor([distance]), 2 * one, 4 * one, 0 * one)
        images = bev.render_cameras(rig, size.image, objects)
        cell = int(bev.bev_targets(rig, size.grid, objects)["box_mask"].flatten().argmax())
        seen = 0
        for camera in range(rig.cameras):
            brightness = images[camera].sum(dim=(0, 1))  # per image column
            if brightness.max() < 0.5:
                continue
            seen += 1
            column = int(brightness.argmax()) // 8
            splat_cell = int(index[camera, column, int((distance - rig.min_range) / depth_step)])
            # Columns are 10° wide, so the splat may land one cell off the true centre.
            assert abs(splat_cell // size.grid - cell // size.grid) <= 1, (azimuth, distance, camera)
            assert abs(splat_cell % size.grid - cell % size.grid) <= 1, (azimuth, distance, camera)
        assert seen >= 1


def test_planner_arc_lies_on_its_circle() -> None:
    radius = 20.0
    arc = planner._arc(
        torch.tensor(1 / radius), torch.tensor(0.0), torch.tensor([0.0, 10.0, 10 * math.pi, 20 * math.pi])
    )
    centre = torch.tensor([0.0, radius])  # turning left from the origin, heading along +x
    torch.testing.assert_close(torch.linalg.norm(arc - centre, dim=1), torch.full((4,), radius))
    torch.testing.assert_close(arc[2], torch.tensor([radius, radius]), atol=1e-4, rtol=0)  # a quarter turn
    torch.testing.assert_close(arc[3], torch.tensor([0.0, 2 * radius]), atol=1e-4, rtol=0)  # a half turn
    straight = planner._arc(torch.tensor(0.0), torch.tensor(math.pi / 2), torch.tensor([5.0]))
    torch.testing.assert_close(straight[0], torch.tensor([0.0, 5.0]), atol=1e-6, rtol=0)


def test_planner_brakes_for_an_occupied_front_camera_and_stops() -> None:
    sampler = planner.PlannerSceneSampler(planner.PRESETS["tiny"])
    samples = [sampler(torch.Generator().manual_seed(i)) for i in range(200)]
    blocked = torch.stack([s["occupancy"][0].mean() for s in samples])
    accel = torch.stack([s["ego"][1] for s in samples])
    assert torch.corrcoef(torch.stack([blocked, accel]))[0, 1] < -0.3
    # Braking ends in a stop: the plan never backs up towards the car.
    reach = torch.stack([torch.linalg.norm(s["waypoints"], dim=-1) for s in samples])
    assert (reach.diff(dim=1) >= -1e-6).all()
    speed = torch.stack([s["ego"][0] for s in samples]) * 10
    stop_time = speed / (-accel * 4).clamp(min=1e-6)
    assert (stop_time < planner.HORIZON_S).sum() >= 5, "some scenes must stop inside the horizon to test this"


def test_vlm_caption_names_the_colours_painted_in_each_cell() -> None:
    size = vlm.PRESETS["tiny"]
    sample = vlm.CaptionSampler(size)(torch.Generator().manual_seed(3))
    tokens, image = sample["tokens"], sample["image"]
    assert tokens[0] == vlm.BOS and tokens[-1] == vlm.EOS
    torch.testing.assert_close(sample["labels"][:-1], tokens[1:])
    words = tokens[1:-1].view(size.objects, vlm.WORDS_PER_OBJECT)
    cell_px = size.image // vlm.CELLS_PER_SIDE
    for word in words:
        cls, cell = int(word[3]) - vlm.CLASS_TOKEN0, int(word[5]) - vlm.CELL_TOKEN0
        row, col = divmod(cell, vlm.CELLS_PER_SIDE)
        centre = image[:, row * cell_px + cell_px // 2, col * cell_px + cell_px // 2]
        assert torch.allclose(centre, vlm.class_colours()[cls], atol=0.5), (cls, cell, centre)
    named = {int(w[5]) - vlm.CELL_TOKEN0 for w in words}
    empty = next(c for c in range(vlm.CELLS_PER_SIDE**2) if c not in named)
    row, col = divmod(empty, vlm.CELLS_PER_SIDE)
    assert image[:, row * cell_px : (row + 1) * cell_px, col * cell_px : (col + 1) * cell_px].abs().mean() < 0.15


# --- optimization paths -----------------------------------------------------------------


class _Checkpointed(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=False)


def _wrap_blocks(model: nn.Module, class_name: str) -> int:
    wrapped = 0
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child).__name__ == class_name:
                setattr(parent, child_name, _Checkpointed(child))
                wrapped += 1
    return wrapped


@pytest.mark.parametrize("name", BUILTINS)
def test_checkpointing_the_target_blocks_keeps_the_gradients(name: str) -> None:
    workload = load_workload(name, preset="tiny")
    assert workload.checkpoint_target is not None
    batch = _batch(workload)
    plain = _model(workload)
    wrapped = copy.deepcopy(plain)
    assert _wrap_blocks(wrapped, workload.checkpoint_target) >= 2, "the target must be a repeated block"
    for model in (plain, wrapped):
        _loss(workload, model, batch).backward()
    for (param_name, p), q in zip(plain.named_parameters(), wrapped.parameters()):
        assert p.grad is not None and q.grad is not None, param_name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=param_name)


@pytest.mark.parametrize("name", BUILTINS)
def test_channels_last_and_bf16_autocast_train(name: str) -> None:
    workload = load_workload(name, preset="tiny")
    batch = _batch(workload)
    reference = _loss(workload, _model(workload), batch).item()

    model = _model(workload).to(memory_format=torch.channels_last)
    nhwc = {k: v.contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v for k, v in batch.items()}
    loss = _loss(workload, model, nhwc)
    loss.backward()
    assert math.isclose(loss.item(), reference, rel_tol=1e-3)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())

    model = _model(workload)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = _loss(workload, model, batch)
    loss.backward()
    assert loss.dtype == torch.float32  # the losses upcast, so bf16 does not round the loss itself
    assert math.isclose(loss.item(), reference, rel_tol=0.05)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("name", BUILTINS)
def test_forward_compiles_as_one_graph(name: str) -> None:
    workload = load_workload(name, preset="tiny")
    batch = _batch(workload)
    model = _model(workload)
    compiled = torch.compile(model, backend="eager", fullgraph=True)  # fullgraph: any graph break fails
    try:
        loss = _loss(workload, compiled, batch)
        loss.backward()
    finally:
        torch._dynamo.reset()
    assert math.isclose(loss.item(), _loss(workload, _model(workload), batch).item(), rel_tol=1e-5)


# --- sizes ------------------------------------------------------------------------------

PARAMETER_RANGES = {"tiny": (0.3e6, 2e6), "base": (10e6, 300e6), "large": (100e6, 1e9)}


@pytest.mark.parametrize("name", BUILTINS)
def test_presets_grow_within_their_parameter_ranges(name: str) -> None:
    counts = {}
    for preset, (low, high) in PARAMETER_RANGES.items():
        workload = load_workload(name, preset=preset)
        with torch.device("meta"):  # no memory, no init work: just the shapes
            model = workload.model_fn()
        counts[preset] = sum(p.numel() for p in model.parameters())
        assert low <= counts[preset] <= high, f"{name} {preset}: {counts[preset] / 1e6:.1f}M parameters"
    assert counts["tiny"] < counts["base"] < counts["large"]


def test_transformer_block_parameter_count_matches_the_formula() -> None:
    dim = 96
    # qkv 3d²+3d, proj d²+d, MLP 8d²+5d, two LayerNorms 4d.
    assert sum(p.numel() for p in TransformerBlock(dim, heads=4).parameters()) == 12 * dim**2 + 13 * dim


def test_synthetic_dataset_refuses_out_of_range_indices() -> None:
    dataset = SyntheticDataset(lambda g: {"x": torch.rand(1, generator=g)}, seed=0, length=3)
    assert len(dataset) == 3
    with pytest.raises(IndexError):
        dataset[3]
