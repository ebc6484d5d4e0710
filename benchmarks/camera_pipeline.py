"""The camera pipeline's throughput: bev-perception's `camera_files` samples per second, per decoder
and DataLoader worker count, printed as samples/s and as the ratio to one worker (JPEG decode is
known to scale far from linearly with workers). Also each decoder's time per image for the files'
decode alone, the figure the default decoder was chosen on.

    PYTHONPATH=. .venv/bin/python benchmarks/camera_pipeline.py [--preset base] [--workers 0 1 2] [--batches 12]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from torch.utils.data import DataLoader

from workbench.config import TrainConfig
from workbench.workloads import load_workload
from workbench.workloads.camera_files import DECODERS, CameraFileDataset, decode_jpeg


def samples_per_s(dataset: CameraFileDataset, workers: int, batch: int, batches: int) -> float:
    loader = DataLoader(dataset, batch_size=batch, num_workers=workers, persistent_workers=False)
    iterator = iter(loader)
    next(iterator)  # worker start-up and the first batch are not throughput
    began = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * batch / (time.perf_counter() - began)


def decode_ms(dataset: CameraFileDataset, decoder: str, repeats: int = 5) -> float:
    files = [dataset.path(scene, camera).read_bytes() for scene in range(8) for camera in range(6)]
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        for data in files:
            decode_jpeg(data, decoder)
        times.append((time.perf_counter() - began) * 1000.0 / len(files))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batches", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        for decoder in DECODERS:
            workload = load_workload(
                "bev-perception", preset=args.preset, camera_files=True, decoder=decoder, cache_dir=cache
            )
            dataset = workload.make_dataset(TrainConfig())
            assert isinstance(dataset, CameraFileDataset)
            print(f"{decoder}: decode alone {decode_ms(dataset, decoder):.2f} ms per image ({dataset.folder.name})")
            rates = {n: samples_per_s(dataset, n, workload.batch_size, args.batches) for n in args.workers}
            one = rates.get(1)
            for workers, rate in rates.items():
                ratio = f"  {rate / one:.2f}x one worker" if one else ""
                print(f"  num_workers={workers}: {rate:7.1f} samples/s{ratio}")


if __name__ == "__main__":
    main()
