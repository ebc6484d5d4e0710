"""Deterministic synthetic datasets for the built-in workloads, plus the builders' option checks.

Sample i comes from a `torch.Generator` seeded from (seed, i) alone, so equal seeds give
equal data whatever the DataLoader's worker count or order. `sample_cost_ms` burns real
CPU in `__getitem__` (a stand-in for JPEG decode and augmentation), so a trial can show a
loader-bound step and moving the loading into worker processes really helps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch.utils.data import Dataset

from workbench.workloads.base import WorkloadError

Sample = dict[str, torch.Tensor]
SampleFn = Callable[[torch.Generator], Sample]
"""Turns a seeded generator into one sample; must be picklable (a module-level class) for spawned workers."""

VIRTUAL_LENGTH = 1_000_000
"""Samples in a synthetic dataset: far more than any trial draws, so no trial runs out."""

_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1


def sample_seed(seed: int, index: int) -> int:
    """A well-mixed 63-bit generator seed for sample `index` of dataset `seed`.

    A plain `seed * K + index` makes (seed, index) pairs collide across seeds; two
    splitmix64 rounds keep neighbouring seeds' streams unrelated.
    """
    return _splitmix64(_splitmix64(seed & _MASK64) ^ (index & _MASK64)) & _MASK63


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def burn_cpu(milliseconds: float) -> None:
    """Keep this core busy for `milliseconds` (a busy loop, not a sleep: decode work holds the CPU)."""
    if milliseconds <= 0:
        return
    deadline = time.perf_counter() + milliseconds / 1000.0
    while time.perf_counter() < deadline:
        pass


class SyntheticDataset(Dataset[Sample]):
    """Map-style dataset: item i = `sample_fn(generator seeded by (seed, i))`, after `sample_cost_ms` of CPU work."""

    def __init__(
        self, sample_fn: SampleFn, seed: int, sample_cost_ms: float = 0.0, length: int = VIRTUAL_LENGTH
    ) -> None:
        self.sample_fn = sample_fn
        self.seed = seed
        self.sample_cost_ms = sample_cost_ms
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Sample:
        if not 0 <= index < self.length:
            raise IndexError(f"sample {index} is outside this dataset of {self.length}")
        burn_cpu(self.sample_cost_ms)
        generator = torch.Generator().manual_seed(sample_seed(self.seed, index))
        return self.sample_fn(generator)


PresetT = TypeVar("PresetT")


def choose_preset(workload: str, preset: str, presets: Mapping[str, PresetT]) -> PresetT:
    """The preset's settings, or a `WorkloadError` that lists the valid names."""
    if preset not in presets:
        raise WorkloadError(f"workload '{workload}' has no preset '{preset}'; choose one of: {', '.join(presets)}")
    return presets[preset]


def check_sample_cost(workload: str, sample_cost_ms: Any) -> float:
    """`sample_cost_ms` as a float, refusing negatives and non-numbers with a fix in the message."""
    if (
        isinstance(sample_cost_ms, bool)
        or not isinstance(sample_cost_ms, (int, float))
        or not 0 <= sample_cost_ms < math.inf
    ):
        raise WorkloadError(
            f"workload '{workload}': sample_cost_ms must be a finite number of milliseconds >= 0, got {sample_cost_ms!r}"
        )
    return float(sample_cost_ms)
