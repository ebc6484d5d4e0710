"""The camera-file pipeline of bev-perception: real JPEG files, written once, decoded per sample."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader

from workbench.config import TrainConfig
from workbench.workloads import WorkloadError, bev, load_workload
from workbench.workloads.camera_files import (
    FILE_SCALE,
    MEAN,
    STD,
    CameraFileDataset,
    decode_jpeg,
    write_atomically,
)
from workbench.workloads.stages import StageTimes
from workbench.workloads.synthetic import sample_seed


def _dataset(tmp_path: Path, seed: int = 0, **options: object) -> CameraFileDataset:
    workload = load_workload("bev-perception", preset="tiny", camera_files=True, cache_dir=str(tmp_path), **options)
    dataset = workload.make_dataset(TrainConfig(seed=seed))
    assert isinstance(dataset, CameraFileDataset)
    return dataset


def _pillow_pixels(path: Path) -> torch.Tensor:
    """The file decoded by Pillow directly, as (3, H, W) floats in [0, 1]: the independent decode."""
    with Image.open(path) as image:
        return torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1).float() / 255.0


def test_samples_are_the_files_decoded_resized_and_normalized(tmp_path: Path) -> None:
    dataset = _dataset(tmp_path)
    sample = dataset[5]
    height, width = bev.PRESETS["tiny"].image
    assert sample["images"].shape == (6, 3, height, width)
    for camera in range(6):
        expected = F.interpolate(
            _pillow_pixels(dataset.path(5, camera))[None], size=(height, width), mode="bilinear", antialias=True
        )[0]
        expected = (expected - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
        torch.testing.assert_close(sample["images"][camera], expected, atol=1e-5, rtol=0)


def test_files_hold_the_rendered_scene_within_jpeg_error(tmp_path: Path) -> None:
    dataset = _dataset(tmp_path, seed=3)
    sampler = bev.BevSceneSampler(bev.PRESETS["tiny"])
    height, width = bev.PRESETS["tiny"].image
    generator = torch.Generator().manual_seed(sample_seed(3, 7))
    rendered = sampler.scene(generator, (height * FILE_SCALE, width * FILE_SCALE))["images"].clamp(0, 1)
    for camera in range(6):
        decoded = _pillow_pixels(dataset.path(7, camera))
        assert decoded.shape == rendered[camera].shape
        assert (decoded - rendered[camera]).abs().mean() < 0.03  # quality-90 JPEG of noisy blobs


def test_targets_are_the_synthetic_scenes_targets(tmp_path: Path) -> None:
    dataset = _dataset(tmp_path)
    synthetic = load_workload("bev-perception", preset="tiny").make_dataset(TrainConfig())
    for key in ("heatmap", "boxes", "box_mask"):
        torch.testing.assert_close(dataset[9][key], synthetic[9][key])


def test_simplejpeg_and_pillow_decode_the_same_pixels(tmp_path: Path) -> None:
    pytest.importorskip("simplejpeg")
    path = _dataset(tmp_path).path(0, 2)
    data = path.read_bytes()
    pillow, turbo = decode_jpeg(data, "pillow"), decode_jpeg(data, "simplejpeg")
    assert pillow.shape == turbo.shape
    assert np.abs(pillow.astype(int) - turbo.astype(int)).mean() < 1.0  # both libjpeg-turbo; IDCTs may differ by 1


def test_files_are_written_once_and_kept(tmp_path: Path) -> None:
    first = _dataset(tmp_path)
    files = sorted(first.folder.glob("*.jpg"))
    assert len(files) == first.scenes * 6
    stamps = [f.stat().st_mtime_ns for f in files]
    second = _dataset(tmp_path)
    assert second.folder == first.folder
    assert [f.stat().st_mtime_ns for f in files] == stamps
    assert not list(first.folder.glob(".*.tmp"))


def test_a_removed_file_is_written_again_when_read(tmp_path: Path) -> None:
    dataset = _dataset(tmp_path)
    before = dataset[4]["images"]
    dataset.path(4, 1).unlink()
    torch.testing.assert_close(dataset[4]["images"], before)
    assert dataset.path(4, 1).is_file()


def _write_many(path: str, payload: bytes) -> None:
    for _ in range(200):
        write_atomically(Path(path), payload)


def test_writers_side_by_side_never_leave_half_a_file(tmp_path: Path) -> None:
    target = tmp_path / "scene.jpg"
    payloads = [bytes([i]) * 200_000 for i in (1, 2)]
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_write_many, args=(str(target), p)) for p in payloads]
    for writer in writers:
        writer.start()
    seen = set()
    while any(w.is_alive() for w in writers):
        if target.exists():
            data = target.read_bytes()
            seen.add((len(data), data[:1]))
    for writer in writers:
        writer.join()
    assert seen <= {(200_000, b"\x01"), (200_000, b"\x02")}
    assert os.listdir(tmp_path) == ["scene.jpg"]


def test_an_unwritable_cache_folder_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(WorkloadError, match=r"cannot write the camera files into .*cache_dir"):
        _dataset(blocker)


def test_a_corrupt_jpeg_is_a_clear_error(tmp_path: Path) -> None:
    dataset = _dataset(tmp_path)
    dataset.path(2, 0).write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(WorkloadError, match=r"scene002-cam0.jpg is not a JPEG .*delete it"):
        dataset[2]


def test_bad_options_are_refused_with_the_choices() -> None:
    with pytest.raises(WorkloadError, match="decoder must be one of pillow, simplejpeg"):
        load_workload("bev-perception", camera_files=True, decoder="cv2")
    with pytest.raises(WorkloadError, match="camera_files must be true or false"):
        load_workload("bev-perception", camera_files="yes")


def test_the_stages_of_a_sample_are_marked(tmp_path: Path) -> None:
    dataset = _dataset(tmp_path)
    times = StageTimes()
    with times.collecting():
        dataset[0]
    assert set(times.ms) == {"read", "decode", "transform", "targets"}
    assert all(ms > 0 for ms in times.ms.values())
    recorded = dict(times.ms)
    dataset[1]  # outside the block: the markers cost a check and record nothing
    assert times.ms == recorded


def test_the_dataset_pickles_into_spawned_loader_workers(tmp_path: Path) -> None:
    dataset = _dataset(tmp_path, seed=2)
    loader = DataLoader(dataset, batch_size=2, num_workers=1, multiprocessing_context="spawn")
    batch = next(iter(loader))
    torch.testing.assert_close(batch["images"][1], dataset[1]["images"])
