"""The uint8 images lever: a quarter of the image bytes over the copy, the float path's images after it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import workbench as wb
from workbench.levers.build import build
from workbench.workloads import WorkloadError
from workbench.workloads.bev import BOX_FIELDS, PRESETS
from workbench.workloads.camera_files import MEAN, STD

TINY = PRESETS["tiny"]
CAMERAS = 6


def _camera_workload(tmp_path: Path) -> wb.Workload:
    return wb.load_workload("bev-perception", camera_files=True, cache_dir=str(tmp_path))


def test_uint8_images_copy_a_quarter_of_float32s_image_bytes(tmp_path: Path) -> None:
    workload = _camera_workload(tmp_path)
    counted = {}
    for uint8 in (False, True):
        config = wb.TrainConfig(uint8_images=uint8)
        result = wb.run_trial(workload, config, steps=2, warmup=1, data_stages=True, isolation="inline")
        assert result.ok, result.message
        assert result.data_stages is not None
        counted[uint8] = result.data_stages["bytes_per_step"]
    # The truth from the preset's shapes: a batch's image elements, and its float32 targets
    # (heatmap, box fields and box mask per BEV cell), which stay as they were.
    height, width = TINY.image
    image_elements = TINY.batch_size * CAMERAS * 3 * height * width
    targets = TINY.batch_size * (1 + BOX_FIELDS + 1) * TINY.grid * TINY.grid * 4
    assert counted[False] == targets + 4 * image_elements
    assert counted[True] == targets + image_elements
    assert (counted[True] - targets) * 4 == counted[False] - targets


def _first_batches(workload: wb.Workload, device: str) -> tuple[dict[str, torch.Tensor], ...]:
    out = []
    for uint8 in (False, True):
        config = wb.TrainConfig(uint8_images=uint8)
        step = build(workload, config, device)
        raw = next(workload.batches(config))
        out += [raw, step.prepare_batch(raw)]
    return tuple(out)


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))],
)
def test_normalized_on_the_device_the_images_equal_the_float_paths(tmp_path: Path, device: str) -> None:
    _, floats, raw_uint8, on_device = _first_batches(_camera_workload(tmp_path), device)
    assert raw_uint8["images"].dtype == torch.uint8  # what the loader hands over, and the copy moves
    images = on_device["images"]
    assert images.dtype == torch.float32 and images.device.type == device
    # Independently: the uint8 pixels scaled to [0, 1] and normalized per channel by hand.
    pixels = raw_uint8["images"].double() / 255.0
    mean = torch.tensor(MEAN, dtype=torch.float64).view(3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(3, 1, 1)
    torch.testing.assert_close(images.cpu().double(), (pixels - mean) / std, atol=1e-5, rtol=0)
    # Against the float path: equal but for rounding the resized pixels to whole levels, at most
    # half a level (0.5 / 255) before the division by the channel's std.
    half_level = 0.5 / 255.0 / min(STD)
    torch.testing.assert_close(images, floats["images"], atol=half_level + 1e-5, rtol=0)
    assert (images - floats["images"]).abs().mean() < half_level / 2  # rounding, not a shifted image
    for name in ("heatmap", "boxes", "box_mask"):
        torch.testing.assert_close(on_device[name], floats[name])


def test_a_prepared_batch_prepared_again_is_not_normalized_twice(tmp_path: Path) -> None:
    """The timed fetches and the ideal loader's staged batches reach the step's own preparation again."""
    workload = _camera_workload(tmp_path)
    config = wb.TrainConfig(uint8_images=True)
    step = build(workload, config, "cpu")
    raw = next(workload.batches(config))
    kept = raw["images"].clone()
    once = step.prepare_batch(raw)
    normalized = once["images"].clone()
    twice = step.prepare_batch(once)
    torch.testing.assert_close(twice["images"], normalized, atol=0, rtol=0)
    torch.testing.assert_close(once["images"], normalized, atol=0, rtol=0)  # nor changed in place
    assert torch.equal(raw["images"], kept)  # the loader's batch itself is left as it was


def test_the_ideal_loader_feeds_the_same_uint8_batches_as_the_loader(tmp_path: Path) -> None:
    """Staged batches are prepared before the window and again in it: normalized once, they give the
    loader's losses exactly for the batches both use (the first two; then staging cycles back)."""
    workload = _camera_workload(tmp_path)
    config = wb.TrainConfig(uint8_images=True)
    staged = wb.run_trial(workload, config, steps=2, warmup=1, staged_batches=2, isolation="inline")
    loaded = wb.run_trial(workload, config, steps=2, warmup=1, isolation="inline")
    assert staged.ok and loaded.ok, (staged.message, loaded.message)
    assert staged.losses[:2] == loaded.losses[:2]


def test_the_exported_snippet_trains_on_uint8_batches_as_the_trial_does(tmp_path: Path) -> None:
    """The snippet's train_step, on the loader's uint8 batch, gives the workbench step's loss."""
    from workbench.export import to_snippet
    from workbench.workloads.bev import bev_forward, bev_loss

    workload = _camera_workload(tmp_path)
    config = wb.TrainConfig(uint8_images=True)
    step = build(workload, config, "cpu")
    raw = next(workload.batches(config))
    code = to_snippet(config, device="cpu")
    assert "normalize_images" not in to_snippet(wb.TrainConfig(), device="cpu")  # only when asked for
    namespace: dict[str, object] = {"__name__": "user_snippet"}
    exec(compile(code, str(tmp_path / "user_snippet.py"), "exec"), namespace)
    model = workload.model_fn()
    model.load_state_dict(step.base_model.state_dict())
    model = namespace["optimize_model"](model)  # type: ignore[operator]
    optimizer = namespace["make_optimizer"](model)  # type: ignore[operator]
    exported = namespace["train_step"](model, optimizer, [raw], bev_loss, bev_forward)  # type: ignore[operator]
    measured = step([step.prepare_batch(raw)])
    assert raw["images"].dtype == torch.uint8
    assert float(exported) == pytest.approx(float(measured), rel=1e-5)
    floats = namespace["normalize_images"](raw)  # type: ignore[operator]
    torch.testing.assert_close(floats["images"], step.prepare_batch(raw)["images"], atol=1e-5, rtol=0)


def test_a_workload_without_a_uint8_path_refuses_it() -> None:
    workload = wb.load_workload("bev-perception")  # rendered float images, no files to decode
    with pytest.raises(WorkloadError, match="has no uint8 path for its images"):
        build(workload, wb.TrainConfig(uint8_images=True), "cpu")
