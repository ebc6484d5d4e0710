"""The suite's one real inductor compile (≈1 min cold on 2 cores, seconds with the shared cache).

Checks what only a real compile shows: compile time is reported apart from the steady
steps, the compiled step is faster than its own first step, and it trains like eager.
"""

from __future__ import annotations

import pytest

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
    assert compiled.median_step_ms * 5 < compiled.time_to_first_step_s * 1000
    assert max(compiled.step_ms) < compiled.warmup_step_ms[0]
    # Inductor's CPU buffers bypass the tensor tracker: no figure rather than a wrong one.
    assert compiled.peak_memory_bytes is None and "inductor" in compiled.memory_method
    row = compare_trials(eager, [compiled]).candidates[0]
    assert row.numerics_ok, row.numerics.note
    assert row.break_even_steps is None or row.break_even_steps > 0
