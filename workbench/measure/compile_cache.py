"""Inductor's on-disk compile cache: whether a trial's compile hit it, and a fresh one on request.

A fresh worker process starts with empty in-memory caches, but Inductor (and Triton on GPUs)
also keep compiled graphs on disk, shared by every process of the user: the same config's
compile time fell from 26.9 s to 3.9 s here as that cache warmed. So a result says which it
measured — 'cold' (every graph compiled), 'warm' (every graph from the cache) or 'partly warm'
— read from Inductor's own hit/miss counters; and `WORKBENCH_COMPILE_CACHE=fresh` (or the
`cold_compile()` context in Python) gives each trial worker an empty cache directory of its
own, removed when the trial ends, for a cold measurement.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from workbench.measure.child_env import child_environment

#: Environment variable: 'fresh' gives every trial worker an empty compile cache; unset or
#: 'reuse' shares the user's cache (PyTorch's default).
ENV = "WORKBENCH_COMPILE_CACHE"
#: The cache directories a fresh trial points elsewhere: Inductor's (FX graphs, AOTAutograd,
#: generated code) and Triton's (GPU kernels).
CACHE_DIR_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def fresh_cache_requested() -> bool:
    value = os.environ.get(ENV, "reuse").strip().lower()
    if value not in ("fresh", "reuse", ""):
        from workbench.config import ConfigError

        raise ConfigError(f"{ENV} must be 'fresh' (a cold compile per trial) or 'reuse', got {value!r}")
    return value == "fresh"


@contextlib.contextmanager
def cold_compile() -> Iterator[None]:
    """Trials started inside this block compile with an empty cache (each in its own directory)."""
    previous = os.environ.get(ENV)
    os.environ[ENV] = "fresh"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = previous


@contextlib.contextmanager
def fresh_cache_environment() -> Iterator[dict[str, str] | None]:
    """The environment for a trial worker: None (the caller's, cache shared) unless a fresh cache
    is asked for; then one with empty cache directories, removed once the block (and the worker
    started in it) has ended. The caller's own cache is never touched."""
    if not fresh_cache_requested():
        yield None
        return
    directory = tempfile.mkdtemp(prefix="workbench-compile-cache-")
    try:
        env = child_environment()
        env.update({name: os.path.join(directory, name.split("_")[0].lower()) for name in CACHE_DIR_VARIABLES})
        yield env
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def cache_counts() -> tuple[int, int]:
    """Inductor's FX-graph cache (hits, misses) in this process so far."""
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return int(inductor["fxgraph_cache_hit"]), int(inductor["fxgraph_cache_miss"])


def cache_state(before: tuple[int, int]) -> str | None:
    """'cold', 'warm' or 'partly warm (h of n graphs from the cache)' since `before`; None when
    nothing went through Inductor's cache (compile off, another backend, a bypassed graph)."""
    hits, misses = (now - then for now, then in zip(cache_counts(), before, strict=True))
    if hits == 0 and misses == 0:
        return None
    if misses == 0:
        return "warm"
    if hits == 0:
        return "cold"
    return f"partly warm ({hits} of {hits + misses} graphs from the cache)"
