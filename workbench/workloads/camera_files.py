"""Camera images read from JPEG files: the real decode stall, without downloading a data set.

The scenes are rendered once (deterministically, from the seed) at twice the network's input size
and written as JPEG files into a cache folder; every sample then reads its cameras' files, decodes
them, resizes them to the input size and normalizes them, as a driving data pipeline does. Pillow
decodes by default (libjpeg-turbo inside; what most PyTorch pipelines use, so figures compare);
simplejpeg is the optional faster decoder. Writers are safe side by side (write a temporary file,
then rename), and the files are kept, so only the first trial of a size pays for them.
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from workbench.workloads.base import WorkloadError
from workbench.workloads.stages import stage
from workbench.workloads.synthetic import VIRTUAL_LENGTH, Sample, burn_cpu, sample_seed

DECODERS = ("pillow", "simplejpeg")
FILE_SCALE = 2
"""Files hold twice the input's height and width: the pipeline resizes them down, as real ones do."""
SCENES = 64
"""Distinct scenes on disk; sample i shows scene i mod SCENES (enough for any trial's window)."""
JPEG_QUALITY = 90
FORMAT_VERSION = 1
"""Part of the folder's name: a change to the rendering or the encoding writes a new folder."""
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
"""The usual ImageNet normalization, per RGB channel, of pixels scaled to [0, 1]."""
CACHE_ENV = "WORKBENCH_CACHE"

SceneFn = Callable[[torch.Generator, "tuple[int, int] | None"], Sample]
"""`scene_fn(generator, image_size)`: a scene's targets, plus its float camera images (cameras, 3,
H, W) in [0, 1] under 'images' when `image_size` is given. Picklable, for loader workers."""


def cache_root(cache_dir: str = "") -> Path:
    """`cache_dir`, else $WORKBENCH_CACHE, else $XDG_CACHE_HOME (or ~/.cache) / workbench."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get(CACHE_ENV, "").strip():
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "workbench"


def check_decoder(workload: str, decoder: Any) -> str:
    """The decoder's name, or a `WorkloadError` naming the choices or the package to install."""
    if decoder not in DECODERS:
        raise WorkloadError(f"workload '{workload}': decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
    module = {"pillow": "PIL", "simplejpeg": "simplejpeg"}[decoder]
    try:
        __import__(module)
    except ImportError:
        raise WorkloadError(
            f"workload '{workload}': the {decoder} decoder needs the '{decoder}' package: pip install {decoder}"
        ) from None
    return str(decoder)


def decode_jpeg(data: bytes, decoder: str) -> Any:
    """JPEG bytes → an (H, W, 3) uint8 RGB array."""
    if decoder == "simplejpeg":
        import simplejpeg

        return simplejpeg.decode_jpeg(data, colorspace="RGB")
    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return np.array(image if image.mode == "RGB" else image.convert("RGB"))  # a writable copy for torch


def encode_jpeg(pixels: torch.Tensor) -> bytes:
    """(3, H, W) floats in [0, 1] → JPEG bytes (Pillow, quality `JPEG_QUALITY`)."""
    from PIL import Image

    array = (pixels.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
    buffer = io.BytesIO()
    Image.fromarray(array, "RGB").save(buffer, "JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary name beside `path`, then rename: a reader never sees half a file, and
    two writers of the same file (loader workers, two trials) both leave a whole one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


class CameraFileDataset(Dataset[Sample]):
    """Map-style dataset: item i = scene (i mod `scenes`)'s camera JPEGs read, decoded, resized and
    normalized, plus the scene's targets; `sample_cost_ms` of extra CPU first (an exact known cost)."""

    def __init__(
        self,
        scene_fn: SceneFn,
        image: tuple[int, int],
        cameras: int,
        seed: int,
        *,
        cache_dir: str = "",
        decoder: str = "pillow",
        sample_cost_ms: float = 0.0,
        scenes: int = SCENES,
        length: int = VIRTUAL_LENGTH,
        uint8: bool = False,
    ) -> None:
        self.scene_fn, self.image, self.cameras, self.seed = scene_fn, image, cameras, seed
        self.uint8 = uint8
        """Images leave as resized uint8 pixels; `normalize_on_device` finishes them after the copy."""
        self.decoder, self.sample_cost_ms, self.scenes, self.length = decoder, sample_cost_ms, scenes, length
        height, width = image
        name = (
            f"bev-{cameras}cam-{height * FILE_SCALE}x{width * FILE_SCALE}-q{JPEG_QUALITY}-seed{seed}-v{FORMAT_VERSION}"
        )
        self.folder = cache_root(cache_dir) / "cameras" / name
        self.write_missing()

    def __len__(self) -> int:
        return self.length

    def path(self, scene: int, camera: int) -> Path:
        return self.folder / f"scene{scene:03d}-cam{camera}.jpg"

    def write_missing(self) -> None:
        """Write every scene whose files are not all there yet (the first trial of this size does)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for scene in range(self.scenes):
                if not all(self.path(scene, camera).is_file() for camera in range(self.cameras)):
                    self._write_scene(scene)
        except OSError as exc:
            raise WorkloadError(
                f"cannot write the camera files into {self.folder} ({exc.strerror or exc}); give a writable "
                f"folder as the workload option cache_dir (extra.cache_dir=PATH) or in ${CACHE_ENV}"
            ) from None

    def _write_scene(self, scene: int) -> None:
        size = (self.image[0] * FILE_SCALE, self.image[1] * FILE_SCALE)
        images = self.scene_fn(self._generator(scene), size)["images"]
        for camera in range(self.cameras):
            write_atomically(self.path(scene, camera), encode_jpeg(images[camera]))

    def _generator(self, scene: int) -> torch.Generator:
        return torch.Generator().manual_seed(sample_seed(self.seed, scene))

    def __getitem__(self, index: int) -> Sample:
        if not 0 <= index < self.length:
            raise IndexError(f"sample {index} is outside this dataset of {self.length}")
        burn_cpu(self.sample_cost_ms)
        scene = index % self.scenes
        with stage("targets"):  # the scene's labels, drawn again from its seed: cheap, but not free
            targets = self.scene_fn(self._generator(scene), None)
        pixels = [self.decode(self.read(scene, camera)) for camera in range(self.cameras)]
        with stage("transform"):
            resized = resize(pixels, self.image)
            images = to_uint8(resized) if self.uint8 else normalize(resized)
        return {"images": images, **targets}

    def read(self, scene: int, camera: int) -> tuple[Path, bytes]:
        path = self.path(scene, camera)
        with stage("read"):
            try:
                return path, path.read_bytes()
            except FileNotFoundError:  # removed since the dataset was made: written again, once
                pass
        self.write_missing()
        with stage("read"):
            return path, path.read_bytes()

    def decode(self, file: tuple[Path, bytes]) -> torch.Tensor:
        path, data = file
        with stage("decode"):
            try:
                return torch.from_numpy(decode_jpeg(data, self.decoder))
            except Exception as exc:  # each decoder raises its own type for a broken file
                raise WorkloadError(
                    f"camera file {path} is not a JPEG this decoder ({self.decoder}) can read: {exc}; "
                    f"delete it and it will be written again"
                ) from None


def resize(pixels: list[torch.Tensor], image: tuple[int, int]) -> torch.Tensor:
    """(H, W, 3) uint8 arrays → (cameras, 3, height, width) floats in [0, 1], antialiased bilinear."""
    stacked = torch.stack(pixels).permute(0, 3, 1, 2).float().div_(255.0)
    if tuple(stacked.shape[-2:]) == image:
        return stacked
    return F.interpolate(stacked, size=image, mode="bilinear", antialias=True, align_corners=False)


def normalize(images: torch.Tensor) -> torch.Tensor:
    """Floats in [0, 1] (..., 3, H, W) → normalized per channel, in place, on their own device."""
    mean = torch.tensor(MEAN, device=images.device).view(3, 1, 1)
    std = torch.tensor(STD, device=images.device).view(3, 1, 1)
    return images.sub_(mean).div_(std)


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Floats in [0, 1] → uint8 pixels, rounded: what the uint8 path ships (off by at most half a
    pixel level from the float path's resized values, the only difference it makes)."""
    return images.mul(255.0).round_().clamp_(0.0, 255.0).to(torch.uint8)


def normalize_on_device(batch: Sample) -> Sample:
    """A batch of uint8 camera images, already on the device → the float path's normalized images.

    Images already float are left as they are: a prepared batch may be prepared again (the trial's
    timed fetches and staged batches are), and must not be normalized twice."""
    images = batch["images"]
    if images.dtype != torch.uint8:
        return batch
    return {**batch, "images": normalize(images.float().div_(255.0))}  # a new tensor: the input stays
