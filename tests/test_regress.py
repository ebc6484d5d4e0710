"""Regression checks: the suite format, the gate over compare's statistics, REF resolution, the
`history`/`regress` commands, the History view — and the proof: a real `workbench regress` run
exits non-zero on a deliberately slower step and zero on an unchanged rerun."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_store import COMMIT_A, COMMIT_B, COMMIT_C, HERE, fake_result

from workbench.analysis.compare import compare_trials
from workbench.analysis.regress import Baseline, SuiteError, check_one, load_suite, parse_suite
from workbench.api import run_trials
from workbench.cli import main
from workbench.config import TrainConfig
from workbench.measure import TrialResult
from workbench.store import Store, UnknownReference, parse_reference, records
from workbench.store.reference import find_baselines

REPO = Path(__file__).resolve().parent.parent
SUITE = {"name": "s", "workload": "bev-perception", "preset": "tiny", "steps": 20, "warmup": 2,
         "configurations": [{"name": "plain", "config": ""}, {"name": "bf16", "config": {"amp": "bf16"}}]}  # fmt: skip


def steps(median: float, n: int = 20, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(median, median * 0.02, n)


def trials(median: float, count: int = 4, seed: int = 0, **kwargs: Any) -> list[TrialResult]:
    """`count` processes' trials (each trial is one unit of the interval), each its own seed."""
    return [fake_result(steps(median, seed=seed + 1000 * i), **kwargs) for i in range(count)]


def geometric_mean_ms(runs: list[TrialResult]) -> float:
    return float(np.exp(np.mean(np.log([r.median_step_ms or 0.0 for r in runs]))))


# --- the suite file ---------------------------------------------------------------------------


def test_the_example_suite_is_valid() -> None:
    suite = load_suite(REPO / "examples" / "regress-suite.json")
    assert suite.workload == "bev-perception" and len(suite.configurations) == 3
    assert suite.configurations[1].config == TrainConfig(amp="bf16", channels_last=True)
    assert suite.configurations[2].config == TrainConfig(amp="bf16", activation_checkpointing="full")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"configurations": []}, "'configurations' must be a non-empty list"),
        ({"steps": 0}, "'steps' must be an integer >= 1"),
        ({"workload": ""}, "'workload' must be a built-in name"),
        ({"colour": "red"}, "unknown key(s) colour"),
        ({"configurations": [{"name": "a", "config": "amp=fp8"}]}, "configurations[0] ('a'): amp='fp8' is not valid"),
        ({"configurations": [{"name": "a"}, {"name": "a"}]}, "names must be unique; repeated: a"),
        ({"configurations": [{"name": "a", "config": 3}]}, "must be an override string"),
        ({"configurations": ["amp=bf16"]}, "configurations[0] must be an object"),
    ],
)
def test_a_malformed_suite_names_the_file_and_the_entry(change: dict[str, Any], expected: str) -> None:
    with pytest.raises(SuiteError) as info:
        parse_suite({**SUITE, **change}, source="ci/suite.json")
    assert str(info.value).startswith("ci/suite.json") and expected in str(info.value)


# --- the gate ---------------------------------------------------------------------------------


def test_a_significant_slowdown_beyond_the_threshold_fails_with_compares_statistics() -> None:
    reference, now = trials(100, warmup=2), trials(120, seed=1, warmup=2)
    row = check_one("plain", now, Baseline("run 1 @ aaaa", reference), threshold=0.05)
    expected = compare_trials(reference, [now]).candidates[0]  # the very same statistics
    assert (row.speedup, row.speedup_ci, row.verdict) == (expected.speedup, expected.speedup_ci, expected.verdict)
    assert row.status == "regression" and row.verdict == "slower" and row.units == 4
    assert row.time_change == pytest.approx(geometric_mean_ms(now) / geometric_mean_ms(reference) - 1)
    assert row.time_change_ci is not None and row.time_change_ci[0] > 0.05
    assert "slower by" in row.reasons[0]


def test_a_slowdown_whose_interval_reaches_below_the_threshold_passes() -> None:
    rng = np.random.default_rng(2)
    reference = [fake_result(rng.normal(100 * rng.lognormal(0, 0.1), 5, 20), warmup=2) for _ in range(4)]
    now = [fake_result(rng.normal(108 * rng.lognormal(0, 0.1), 5, 20), warmup=2) for _ in range(4)]
    row = check_one("plain", now, Baseline("ref", reference), threshold=0.05)
    assert row.time_change_ci is not None and row.time_change_ci[0] <= 0.05
    assert row.status == "pass"
    faster = check_one("plain", trials(70, seed=5, warmup=2), Baseline("ref", reference), threshold=0.05)
    assert faster.status == "pass" and faster.verdict == "faster"


def test_too_few_trials_a_side_pass_as_inconclusive_with_the_fix() -> None:
    """One trial against one cannot tell a 20% slowdown from a slow process: never a verdict."""
    row = check_one("plain", [fake_result(steps(120, seed=1))], Baseline("ref", [fake_result(steps(100))]), 0.05)
    assert row.status == "pass" and row.verdict == "inconclusive" and row.speedup_ci is None
    assert "at least 4 a side" in row.notes[0]


def test_numerics_mismatch_and_failed_trials_fail_while_no_baseline_passes() -> None:
    reference = trials(100, warmup=2)
    drifted = fake_result(steps(100, seed=4), warmup=2, losses=[2.0, 2.5, 3.0] + [4.0] * 20)
    row = check_one("plain", [drifted], Baseline("ref", reference), threshold=0.05)
    assert row.status == "regression" and row.numerics_ok is False and "numerics" in row.reasons[0]
    crashed = check_one("plain", [fake_result([], status="oom", warmup=2)], Baseline("ref", reference), 0.05)
    assert crashed.status == "failed" and "oom" in crashed.reasons[0]
    first = check_one("plain", [fake_result(steps(100), warmup=2)], None, threshold=0.05)
    assert first.status == "no baseline" and not first.reasons


def test_a_reference_that_resolved_pytorchs_defaults_differently_is_not_compared() -> None:
    reference = [fake_result(steps(100), warmup=2)]  # its optimizer ran as a for-loop
    now = fake_result(steps(70, seed=1), warmup=2)
    now.applied = [{"toggle": "optimizer", "value": "adamw/foreach", "detail": "AdamW, PyTorch's default"}]
    row = check_one("plain", [now], Baseline("run 1 @ aaaa", reference), threshold=0.05)
    assert row.status == "no baseline" and row.speedup is None and not row.reasons
    assert "optimizer: adamw/for-loop -> adamw/foreach" in row.notes[0] and "run 1 @ aaaa" in row.notes[0]
    now.applied = [*reference[0].applied, {"toggle": "cudnn_tf32", "value": True, "detail": "TF32 allowed"}]
    row = check_one("plain", [now], Baseline("run 1 @ aaaa", reference), threshold=0.05)
    assert row.status == "no baseline" and "cudnn_tf32: not recorded -> True" in row.notes[0]
    same = check_one("plain", [fake_result(steps(70, seed=1), warmup=2)], Baseline("ref", reference), 0.05)
    assert same.speedup is not None and not any("resolved settings" in note for note in same.notes)


def old_defaults_result() -> TrialResult:
    """A trial as stored before the defaults became PyTorch's: a for-loop optimizer, every field
    written out, no cudnn_tf32 field and no precision records (on CUDA it convolved in strict fp32)."""
    result = fake_result(steps(100), commit=COMMIT_A)
    result.config = {**TrainConfig().to_dict(), "optimizer_impl": "for-loop", "matmul_precision": "highest"}
    del result.config["cudnn_tf32"]
    result.applied = [{"toggle": "optimizer", "value": "adamw/for-loop", "detail": "AdamW, foreach=False"}]
    return result


def test_a_reference_stored_under_the_old_defaults_is_not_comparable_with_the_new_default_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite = parse_suite({**SUITE, "configurations": [{"name": "plain", "config": ""}]})
    with Store(tmp_path / "history.sqlite") as store:
        # Keyed as the code before stored it: a hash of the fields that differed from ITS defaults, none.
        monkeypatch.setattr(records, "config_key", lambda config: hashlib.sha256(b"{}").hexdigest()[:24])
        old_run = store.save_run([old_defaults_result()], labels=["plain"])
        monkeypatch.undo()
        assert find_baselines(suite, parse_reference("latest", store), store, HERE) == {"plain": []}
        with pytest.raises(UnknownReference, match="no stored trial comparable"):
            find_baselines(suite, parse_reference(f"run:{old_run}", store), store, HERE)
        # Saved (imported) by this version, the old config is keyed by what it ran: not the defaults.
        store.save_run([old_defaults_result()], labels=["plain"])
        assert find_baselines(suite, parse_reference("latest", store), store, HERE) == {"plain": []}
        new_run = store.save_run([fake_result(steps(100), commit=COMMIT_B)], labels=["plain"])
        found = find_baselines(suite, parse_reference("latest", store), store, HERE)
        assert [t.run_id for t in found["plain"]] == [new_run]


# --- REF resolution ---------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def history_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the history goes: a new file, or a fresh database on the session's throw-away PostgreSQL."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("postgres_url"))
    return str(tmp_path / "history.sqlite")


@pytest.fixture
def history(history_target: str) -> Any:
    """Commit A: 100 ms; commit B: both configs 100 ms; commit C (newest): plain 130 ms, bf16 101 ms."""
    yield from write_history(history_target, count=1)


@pytest.fixture
def repeated_history(history_target: str) -> Any:
    """The same history with 4 trials per configuration and commit, as `regress` records it."""
    yield from write_history(history_target, count=4)


def write_history(target: str, count: int) -> Any:
    with Store(target) as store:
        bf16 = TrainConfig(amp="bf16")
        labels = ["plain"] * count + ["bf16"] * count
        store.save_run(trials(100, count, commit=COMMIT_A), labels=["plain"] * count)
        store.save_run(trials(100, count, seed=1, commit=COMMIT_B) + trials(100, count, seed=2, commit=COMMIT_B,
                       config=bf16), labels=labels)  # fmt: skip
        store.save_run(trials(130, count, seed=3, commit=COMMIT_C) + trials(101, count, seed=4, commit=COMMIT_C,
                       config=bf16), labels=labels)  # fmt: skip
        yield store


def test_refs_resolve_to_stored_runs_or_fail_clearly(history: Store) -> None:
    assert parse_reference("latest", history).kind == "latest"
    assert parse_reference("run:2", history).run_id == 2
    assert parse_reference("aaaa", history).commit == COMMIT_A
    assert parse_reference(COMMIT_B, history).commit == COMMIT_B
    for bad, message in [("run:99", "no stored run 99"), ("nope", "unknown REF 'nope'"),
                         ("dddd", "unknown REF 'dddd'"), ("--help", "unknown REF")]:  # fmt: skip
        with pytest.raises(UnknownReference, match=message):
            parse_reference(bad, history)
    history.save_run([fake_result(commit="aaaa" + "0" * 36)])
    with pytest.raises(UnknownReference, match="commit prefix 'aaaa' is ambiguous"):
        parse_reference("aaaa", history)


def test_a_git_revision_resolves_through_git_and_must_be_stored(history: Store) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    if head.returncode != 0:
        pytest.skip("not in a git checkout")
    with pytest.raises(UnknownReference, match=f"is commit {head.stdout.strip()[:12]}, but no run at that commit"):
        parse_reference("HEAD", history, cwd=str(REPO))
    history.save_run([fake_result(commit=head.stdout.strip())])
    assert parse_reference("HEAD", history, cwd=str(REPO)).commit == head.stdout.strip()


def test_an_explicit_ref_with_nothing_comparable_is_an_error(history: Store) -> None:
    suite = parse_suite(SUITE)
    found = find_baselines(suite, parse_reference("aaaa", history), history, HERE)
    assert [t.result.environment["git_commit"] for t in found["plain"]] == [COMMIT_A] and found["bf16"] == []
    with pytest.raises(UnknownReference, match="no stored trial comparable"):
        find_baselines(suite, parse_reference("aaaa", history), history, {**HERE, "device_name": "NVIDIA H200"})
    assert find_baselines(suite, parse_reference("latest", history), history, {**HERE, "device_count": 8}) == {
        "plain": [],
        "bf16": [],
    }


# --- the commands (in process; the proof below runs them for real) --------------------------------


def write_suite(tmp_path: Path, **changes: Any) -> str:
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({**SUITE, **changes}))
    return str(path)


def test_regress_from_store_fails_on_the_slower_config_only(
    repeated_history: Store, tmp_path: Path, capsys: Any
) -> None:
    history = repeated_history
    code = main(["regress", "--suite", write_suite(tmp_path), "--from-store", "--store", str(history.path)])
    out = capsys.readouterr().out
    assert code == 1
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith(("plain", "bf16"))}
    assert "REGRESSION" in lines["plain"] and "run 2 @ bbbbbbbbbb" in lines["plain"]
    assert lines["bf16"].rstrip().endswith("pass")
    assert main(["regress", "--suite", write_suite(tmp_path), "--from-store", "--store", str(history.path),
                 "--threshold", "0.5"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["regress", "--suite", write_suite(tmp_path), "--from-store", "--store", str(history.path),
                 "--against", "aaaa", "--json"]) == 1  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["exit_code"] == 1 and report["against"] == "commit aaaaaaaaaa"
    assert [r["status"] for r in report["rows"]] == ["regression", "no baseline"]


def test_history_prints_a_table_and_json(history: Store, capsys: Any) -> None:
    assert main(["history", "--store", str(history.path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:4] == ["run", "trial", "started", "commit"]
    assert "cccccccccc" in out.splitlines()[2] and "amp=bf16" in out and "5 trial(s)" in out
    assert main(["history", "--store", str(history.path), "--config", "amp=bf16", "--json", "--limit", "1"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (
        row["config_label"] == "amp=bf16"
        and row["commit"] == COMMIT_C
        and row["median_step_ms"] == pytest.approx(np.median(steps(101, seed=4)))
    )
    assert main(["history", "--store", str(history.path), "--commit", "aaaa", "--json"]) == 0
    assert [r["commit"] for r in json.loads(capsys.readouterr().out)] == [COMMIT_A]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"--against": "nope"}, "unknown REF 'nope'"),
        ({"--against": "run:42"}, "no stored run 42"),
        ({"--threshold": "-1"}, "--threshold must be a fraction"),
        ({"--suite": "/no/such/suite.json"}, "cannot read suite file /no/such/suite.json"),
        ({"--suite": "{not json"}, "is not valid JSON"),
        ({"--suite": {"configurations": [{"name": "plain", "config": "colour=red"}]}},
         "configurations[0] ('plain'): unknown config field 'colour'"),
        ({"--store": b"garbage"}, "is not a readable workbench run history"),
    ],
)  # fmt: skip
def test_regress_bad_input_is_one_line_and_exit_2(
    history: Store, tmp_path: Path, capsys: Any, options: dict[str, Any], expected: str
) -> None:
    """A str option is passed as is; dict: a suite with these changes; other str/bytes: a file with that content."""
    given = {"--suite": write_suite(tmp_path), "--store": str(history.path)}
    for flag, value in options.items():
        if isinstance(value, dict):
            value = write_suite(tmp_path, **value)
        elif isinstance(value, bytes) or value.startswith("{"):
            (tmp_path / "given").write_bytes(value if isinstance(value, bytes) else value.encode())
            value = str(tmp_path / "given")
        given[flag] = value
    assert main(["regress", "--from-store", *(x for pair in given.items() for x in pair)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and err.startswith("workbench regress: error:")


def test_regress_refuses_a_configuration_this_device_cannot_run_before_measuring(
    history: Store, tmp_path: Path, capsys: Any
) -> None:
    """The protocol checks every suite row on the device before the first trial, naming the row."""
    suite = write_suite(tmp_path, configurations=[{"name": "plain", "config": ""},
                                                  {"name": "graphed", "config": "cuda_graphs=true"}])  # fmt: skip
    before = len(history.trials())
    assert main(["regress", "--suite", suite, "--store", str(history.path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "graphed: cuda_graphs=True is not available on cpu" in err and err.count("\n") == 1
    assert len(history.trials()) == before  # nothing measured, nothing stored


# --- the History view --------------------------------------------------------------------------------


def test_history_view_lists_plots_and_hands_over_a_baseline_and_a_config(history: Store) -> None:
    pytest.importorskip("ipywidgets")
    pytest.importorskip("jupyter_bokeh")
    from workbench.ui.history_view import HistoryView

    picked: list[Any] = []
    opened: list[Any] = []
    view = HistoryView(history, on_pick_baseline=picked.append, on_open_config=opened.append)
    assert [row.id for row in view.rows] == [5, 4, 3, 2, 1] and len(view.runs.options) == 5
    assert view.baseline_button.disabled
    view.select(4)  # commit C's plain trial: its configuration's step time per commit (wb.ui.history)
    (points,) = [el.dframe() for el in view.chart.view if type(el).__name__ == "Scatter" and el.label == "defaults"]
    assert points["commit"].tolist() == [COMMIT_A, COMMIT_B, COMMIT_C]
    expected = [np.median(steps(100)), np.median(steps(100, seed=1)), np.median(steps(130, seed=3))]
    assert points["median_ms"].tolist() == pytest.approx(expected)
    assert view.chart.model.name == "history_series"
    ticks = view.chart.model.xaxis[0].major_label_overrides
    assert list(ticks.values()) == ["aaaaaaaaaa", "bbbbbbbbbb", "cccccccccc"]
    view.baseline_button.click()
    view.config_button.click()
    assert [r.trial_id for r in picked] == [history.get(4).result.trial_id]
    assert opened == [TrainConfig()]
    view.workload.value = "bev-perception"
    assert len(view.rows) == 5


def test_history_view_shows_a_broken_history_instead_of_raising(tmp_path: Path) -> None:
    pytest.importorskip("ipywidgets")
    pytest.importorskip("jupyter_bokeh")
    from workbench.ui.history_view import HistoryView

    path = tmp_path / "corrupt.sqlite"
    path.write_bytes(b"garbage" * 1000)
    view = HistoryView(path)
    assert view.store is None and "not a readable workbench run history" in view.message.value
    assert view.rows == [] and view.pick_baseline() is None


# --- the proof --------------------------------------------------------------------------------------

TINY_MODULE = """
import torch
from torch import nn
from workbench.workloads import Workload

def tiny(preset="tiny"):
    return Workload.from_callables(
        model_fn=lambda: nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)),
        batch_fn=lambda n, g: (torch.randn(n, 32, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=8, name="tiny-mlp",
    )
"""


def regress_cli(tmp_path: Path, suite: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / f"suite-{abs(hash(json.dumps(suite)))}.json"
    path.write_text(json.dumps(suite))
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path), "WORKBENCH_STORE": str(tmp_path / "h.sqlite")}
    return subprocess.run([sys.executable, "-m", "workbench.cli", "regress", "--suite", str(path), "--json", *args],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO, check=False)  # fmt: skip


def test_regress_catches_a_slower_step_and_passes_an_unchanged_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step sleeps 20 ms (so load on this shared machine cannot fake a 50% change); the
    'slower commit' sleeps 100 ms — slow_step_ms is not part of the configuration's identity, so
    it is checked against the plain configuration's history, as a real slow commit would be."""
    (tmp_path / "tiny_models.py").write_text(textwrap.dedent(TINY_MODULE))
    base = {"name": "proof", "workload": "tiny_models:tiny", "steps": 8, "warmup": 1,
            "configurations": [{"name": "mlp", "config": "extra.slow_step_ms=20"}]}  # fmt: skip
    slower = {**base, "configurations": [{"name": "mlp", "config": "extra.slow_step_ms=100"}]}

    # The history so far: one earlier run of the suite (measured here, in process, to save a start-up).
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(REPO)
    (seed,) = run_trials("tiny_models:tiny", [TrainConfig(extra={"slow_step_ms": 20})], warmup=1, steps=8, repeats=4,
                         isolation="inline", kind="regress", labels=["mlp"], store=tmp_path / "h.sqlite")  # fmt: skip
    assert all(r.ok for r in seed), seed[0].message

    rerun = regress_cli(tmp_path, base, "--threshold", "0.5", "--budget", "1")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    (row,) = json.loads(rerun.stdout)["rows"]
    assert row["status"] == "pass" and row["reference"].startswith("run 1 @") and row["numerics_ok"] is True
    assert row["units"] == 4 and row["verdict"] != "inconclusive"

    slow = regress_cli(tmp_path, slower, "--threshold", "0.5", "--against", "run:1", "--budget", "1")
    assert slow.returncode == 1, slow.stdout + slow.stderr
    (row,) = json.loads(slow.stdout)["rows"]
    assert row["status"] == "regression" and row["verdict"] == "slower" and row["time_change_ci"][0] > 0.5
    with Store(tmp_path / "h.sqlite") as store:
        assert [(r.kind, r.label) for r in store.history()] == [("regress", "mlp")] * 12
