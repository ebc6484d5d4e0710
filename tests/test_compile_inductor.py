"""The suite's one real inductor compile (≈1 min cold on 2 cores, seconds with the shared cache).

Checks what only a real compile shows: compile time is reported apart from the steady
steps, the compiled step is faster than its own first step, and it trains like eager.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from workbench.analysis.compare import compare_trials
from workbench.config import TrainConfig
from workbench.trials import run_trial


@pytest.mark.slow
def test_inductor_compile_is_timed_apart_and_trains_like_eager() -> None:
    # The quickstart notebook compiles this same graph: one cold compile serves both (shared cache).
    eager_config = TrainConfig(amp="bf16", channels_last=True)
    eager = run_trial("bev-perception", eager_config, steps=5, warmup=2)
    compiled = run_trial("bev-perception", eager_config.replace(compile="default"), steps=5, warmup=2)
    assert compiled.status == "ok", compiled.message
    assert any(a["toggle"] == "compile" for a in compiled.applied)
    assert compiled.time_to_first_step_s is not None and compiled.median_step_ms is not None
    # The first step carried the compile; the steady steps did not.
    assert compiled.compile_time_s > 1.0
    # More than a second above a steady step: with a warm cache the compile is seconds, not minutes, and
    # a 1 s bf16 step on a CPU without bf16 is no longer small beside it (5x a step was: 4.97 s vs 3.92 s).
    assert compiled.time_to_first_step_s * 1000 > compiled.median_step_ms + 1000
    assert max(compiled.step_ms) < compiled.warmup_step_ms[0]
    # Inductor's CPU buffers bypass the tensor tracker: no figure rather than a wrong one.
    assert compiled.peak_memory_bytes is None and "inductor" in compiled.memory_method
    row = compare_trials(eager, [compiled]).candidates[0]
    assert row.numerics_ok, row.numerics.note
    assert row.break_even_steps is None or row.break_even_steps > 0


@pytest.mark.slow
def test_a_result_says_whether_its_compile_was_cold_or_warm_and_a_cold_one_can_be_asked_for() -> None:
    import tempfile

    from workbench.measure.compile_cache import cold_compile
    from workbench.workloads import Workload

    workload = Workload.from_callables(
        model_fn=lambda: torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)),
        loss_fn=lambda output, batch: output.square().mean(),
        batch_fn=lambda n: (torch.randn(n, 8),),
        batch_size=4,
    )
    config = TrainConfig(compile="default")
    window = {"warmup": 1, "steps": 2, "track_memory": False}
    run_trial(workload, config, **window)  # fills the shared cache (the suite's, see conftest) if it was empty
    warm = run_trial(workload, config, **window)
    leftovers = set(Path(tempfile.gettempdir()).glob("workbench-compile-cache-*"))
    with cold_compile():
        cold = run_trial(workload, config, **window)
    assert warm.status == cold.status == "ok", (warm.message, cold.message)
    assert warm.compile_cache == "warm"
    assert cold.compile_cache == "cold"
    assert cold.compile_time_s > warm.compile_time_s  # what the cache is worth, seen in the figures
    assert set(Path(tempfile.gettempdir()).glob("workbench-compile-cache-*")) == leftovers  # removed after
    assert run_trial(workload, TrainConfig(), **window).compile_cache is None  # nothing compiled


def test_a_fresh_compile_cache_is_an_empty_directory_per_trial_removed_after(monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.config import ConfigError
    from workbench.measure.compile_cache import ENV, cold_compile, fresh_cache_environment

    monkeypatch.delenv(ENV, raising=False)
    with fresh_cache_environment() as env:
        assert env is None  # the default: the caller's environment, its cache shared
    with cold_compile(), fresh_cache_environment() as env:
        assert env is not None
        inductor, triton = Path(env["TORCHINDUCTOR_CACHE_DIR"]), Path(env["TRITON_CACHE_DIR"])
        assert inductor.parent == triton.parent and inductor.parent.is_dir()
        assert not any(inductor.parent.iterdir())
    assert not inductor.parent.exists()
    assert ENV not in os.environ
    monkeypatch.setenv(ENV, "cold")
    with pytest.raises(ConfigError, match="WORKBENCH_COMPILE_CACHE must be 'fresh'"), fresh_cache_environment():
        pass
