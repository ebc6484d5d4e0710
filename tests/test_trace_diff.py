"""A/B diff of two profiled windows: the join, the ranking, the explained share, and `workbench diff`."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from workbench.analysis.trace_diff import TraceDiffError, diff_tables, diff_trials
from workbench.cli import main
from workbench.config import TrainConfig
from workbench.measure import TrialResult
from workbench.measure.profile import ProfileOptions
from workbench.store import Store
from workbench.trials import run_trial
from workbench.workloads import Workload


def _op(name: str, ms: float, calls: float = 1.0, dtypes: tuple[str, ...] = ("float32",)) -> dict[str, Any]:
    return {"name": name, "ms_per_step": ms, "calls_per_step": calls, "dtypes": list(dtypes)}


def _trial(trial_id: str, step_ms: list[float], ops: list[dict[str, Any]], workload: str = "w") -> TrialResult:
    profile = {"op_table": ops, "ops_per_step": float(len(ops)), "overhead": {}}
    return TrialResult(trial_id=trial_id, status="ok", workload=workload, config={}, preset="tiny",
                       step_ms=step_ms, profile=profile)  # fmt: skip


def test_join_names_appeared_disappeared_and_dtype_changes() -> None:
    eager = [_op("aten::mm", 4.0, 3), _op("aten::relu", 1.0), _op("aten::add", 0.5)]
    fused = [_op("aten::mm", 4.0, 3, ("bfloat16",)), _op("CompiledFunction", 0.8), _op("aten::add", 0.5)]
    rows = {r.name: r for r in diff_tables(eager, fused)}
    assert rows["aten::relu"].change == "disappeared" and rows["aten::relu"].candidate_ms == 0.0
    assert rows["CompiledFunction"].change == "appeared" and rows["CompiledFunction"].baseline_calls == 0.0
    assert rows["aten::mm"].change == "dtype float32 -> bfloat16" and rows["aten::mm"].delta_ms == 0.0
    assert rows["aten::add"].change == "" and set(rows) == {"aten::mm", "aten::relu", "aten::add", "CompiledFunction"}


def test_rows_rank_by_contribution_to_the_measured_change_and_explain_it() -> None:
    # Measured: 10 ms -> 6 ms (4 ms faster). relu vanished (-3), mm got 1 ms faster, a cast appeared (+0.5).
    base = _trial("a", [10.0, 10.0, 10.0], [_op("aten::mm", 5.0), _op("aten::relu", 3.0), _op("aten::sum", 1.0)])
    cand = _trial("b", [6.0, 6.0, 6.0], [_op("aten::mm", 4.0), _op("aten::_to_copy", 0.5), _op("aten::sum", 1.0)])
    diff = diff_trials(base, cand, top=2)
    assert diff.measured_delta_ms == pytest.approx(-4.0)
    assert [r.name for r in diff.rows] == ["aten::relu", "aten::mm"]  # the two that made it faster, biggest first
    assert diff.explained_share == pytest.approx((3.0 + 1.0) / 4.0)
    assert diff.profiled_share == pytest.approx(4.0 / 3.5)  # of the profiled change, which the cast offsets
    assert diff.rows[0].share == pytest.approx(0.75)
    assert diff.profiled_delta_ms == pytest.approx(-3.5)  # every row, the cast that worked against it too
    everything = diff_trials(base, cand, top=10)
    assert everything.rows[-1].name == "aten::_to_copy" and everything.explained_share == pytest.approx(3.5 / 4.0)


def test_trials_that_cannot_be_diffed_say_why_and_how_to_fix_it() -> None:
    ops = [_op("aten::mm", 1.0)]
    with pytest.raises(TraceDiffError, match=r"different workloads .*workbench history --workload"):
        diff_trials(_trial("a", [1.0], ops, "bev"), _trial("b", [1.0], ops, "planner"))
    unprofiled = dataclasses.replace(_trial("c", [1.0], ops), profile=None)
    with pytest.raises(
        TraceDiffError, match="trial c\\) has no profiled window: rerun it with `workbench run --profile"
    ):
        diff_trials(_trial("a", [1.0], ops), unprofiled)
    old = dataclasses.replace(_trial("d", [1.0], ops), profile={"top_ops": []})
    with pytest.raises(TraceDiffError, match="before per-op tables"):
        diff_trials(old, _trial("a", [1.0], ops))


# --- a real fp32 vs bf16 pair, stored and diffed from the command line --------------------------


class SmallConvNet(nn.Module):
    """Convolutions make most of the step (10-30 ms here), so bf16 moves it by a quarter or
    more either way: faster on a CPU with native bf16, several times slower on one without."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 48, 3, padding=1), nn.Conv2d(48, 48, 3, padding=1)
        self.head = nn.Linear(48 * 32 * 32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv2(torch.relu(self.conv1(x)))).flatten(1))


def conv_workload(name: str = "small-conv") -> Workload:
    return Workload.from_callables(
        model_fn=SmallConvNet,
        batch_fn=lambda n, g: (torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)),
        loss_fn=lambda out, batch: nn.functional.cross_entropy(out.float(), batch[1]),
        batch_size=8,
        name=name,
    )


@pytest.fixture(scope="module")
def stored_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int, TrialResult, TrialResult]:
    folder = tmp_path_factory.mktemp("diff")
    # Six profiled steps and 16 timed ones: with two and five the profiled difference swung from -0.4
    # to -13 ms between reruns, and beside a busy core the two windows disagreed (explained share 0.3).
    options = ProfileOptions(wait=0, warmup=1, active=6, trace_dir=str(folder), scan_syncs=False)
    results = []
    for amp in ("fp32", "bf16"):
        # One intra-op thread: two on a loaded 2-core host make even tiny ops 10-100x slower at random.
        result = run_trial(conv_workload(), TrainConfig(amp=amp, intra_op_threads=1), warmup=1, steps=16, isolation="inline",
                           profile=options, track_memory=False)  # fmt: skip
        assert result.status == "ok", result.message
        results.append(result)
    path = folder / "history.sqlite"
    with Store(path) as store:
        run_a = store.save_run([results[0]], kind="run")
        run_b = store.save_run([results[1]], kind="run")
    return path, run_a, run_b, results[0], results[1]


def test_bf16_diff_shows_the_conv_and_matmul_dtype_change_and_explains_the_change(
    stored_pair: tuple[Path, int, int, TrialResult, TrialResult], capsys: pytest.CaptureFixture[str]
) -> None:
    path, run_a, run_b, fp32, bf16 = stored_pair
    # Which way bf16 moves the step is the host's (native bf16 or not); the diff must explain either.
    measured = bf16.median_step_ms - fp32.median_step_ms  # type: ignore[operator]
    sign = 1.0 if measured > 0 else -1.0
    assert main(["diff", str(run_a), str(run_b), "--store", str(path), "--json", "--top", "8"]) == 0
    diff = json.loads(capsys.readouterr().out)
    assert diff["baseline"] == fp32.trial_id and diff["candidate"] == bf16.trial_id
    assert diff["measured_delta_ms"] == pytest.approx(measured)
    top = diff["rows"][0]
    assert "conv" in top["name"] and sign * top["delta_ms"] > 0 and "bfloat16" in top["candidate_dtypes"]
    assert {"baseline_ms", "candidate_ms", "delta_ms", "baseline_calls", "candidate_calls"} <= set(top)
    # The fp32 conv kernel is gone or changed dtype; the linear layer's matmul ran in bfloat16.
    changed = {r["name"]: r["change"] for r in diff["rows"]}
    assert any("conv" in n and (c == "appeared" or "-> bfloat16" in c) for n, c in changed.items())
    matmuls = [r for r in bf16.profile["op_table"] if r["name"] in ("aten::addmm", "aten::mm")]  # type: ignore[index]
    assert matmuls and all(r["dtypes"] == ["bfloat16"] for r in matmuls)
    # Eight rows account for most of the difference the timed windows measured (more than all of it
    # when the busy host slowed the profiled steps more than the timed ones: no upper bound here).
    assert diff["explained_share"] == pytest.approx(sum(r["delta_ms"] for r in diff["rows"]) / measured)
    assert diff["explained_share"] >= 0.5
    assert sign * sum(r["delta_ms"] for r in diff["rows"]) >= 0.5 * sign * diff["profiled_delta_ms"] > 0


def test_cli_diff_refuses_other_workloads_and_unprofiled_runs(
    stored_pair: tuple[Path, int, int, TrialResult, TrialResult], capsys: pytest.CaptureFixture[str]
) -> None:
    path, run_a, _, fp32, _ = stored_pair
    with Store(path) as store:
        other = store.save_run([dataclasses.replace(fp32, trial_id="other000", workload="e2e-planner")], kind="run")
        plain = store.save_run([dataclasses.replace(fp32, trial_id="plain000", profile=None)], kind="run")
    assert main(["diff", str(run_a), str(other), "--store", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "different workloads" in err and "history --workload" in err
    assert main(["diff", "plain000", f"run:{run_a}", "--store", str(path)]) == 2
    assert "has no profiled window: rerun it with `workbench run --profile" in capsys.readouterr().err
    assert main(["diff", str(plain), "nosuchtrial", "--store", str(path)]) == 2
    assert "no profiled window" in capsys.readouterr().err
    assert main(["diff", "nosuchtrial", str(run_a), "--store", str(path)]) == 2
    assert "no stored run or trial 'nosuchtrial'" in capsys.readouterr().err


def test_cli_diff_prints_a_table_by_trial_id(
    stored_pair: tuple[Path, int, int, TrialResult, TrialResult], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, _, fp32, bf16 = stored_pair
    assert main(["diff", fp32.trial_id, bf16.trial_id, "--store", str(path)]) == 0
    out = capsys.readouterr().out
    assert "by contribution to the change" in out and "of the measured change" in out


def test_the_command_line_entry_reports_a_bad_reference_in_one_line(
    stored_pair: tuple[Path, int, int, TrialResult, TrialResult],
) -> None:
    path, run_a, *_ = stored_pair
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "diff", str(run_a), "nosuch", "--store", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "no stored run or trial 'nosuch'" in proc.stderr
