"""The run history: lossless round trips, the queries regression checks use, and the reliability
promises — no partial rows after a kill or an interrupt, no lost writes between processes, and a
corrupt, foreign or newer file refused with a clear error and left byte-for-byte as it was.

The same test functions run on both backends (`backend` parameter): the SQLite file and a fresh
database on a throw-away PostgreSQL server (conftest's `postgres_server`, never skipped)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from workbench.api import Protocol, run_comparison, run_trials
from workbench.config import TrainConfig
from workbench.measure import StepMeasured, TrialResult
from workbench.store import DEFAULT_STORE, Store, StoreError, config_key, default_store_path, opened_store, schema
from workbench.store.series import step_time_series
from workbench.workloads import Workload

COMMIT_A, COMMIT_B, COMMIT_C = "a" * 40, "b" * 40, "c" * 40
HERE = {"device_type": "cpu", "device_name": "AMD EPYC", "device_count": 1, "cpu_cores": 2, "platform": "linux",
        "host": "ci-1", "torch": "2.13.0", "cuda": None, "python": "3.11.9"}  # fmt: skip


def fake_result(
    step_ms: list[float] | np.ndarray | None = None,
    *,
    config: TrainConfig | None = None,
    commit: str | None = COMMIT_A,
    started_at: float | None = None,
    status: str = "ok",
    workload: str = "bev-perception",
    env: dict[str, Any] | None = None,
    losses: list[float] | None = None,
    warmup: int = 2,
) -> TrialResult:
    """A finished trial with chosen numbers and every field filled, as a worker would return it."""
    steps = [float(x) for x in (step_ms if step_ms is not None else [100.0, 101.0, 99.0, 102.0])]
    return TrialResult(
        trial_id=uuid.uuid4().hex[:12], status=status, workload=workload,  # type: ignore[arg-type]
        config=(config or TrainConfig()).to_dict(), message="" if status == "ok" else f"{status}: boom",
        preset="tiny", workload_source={"kind": "builtin", "name": workload, "preset": "tiny", "options": {}},
        device={"type": "cpu", "name": "AMD EPYC", "count": 1},
        environment={**HERE, "git_commit": commit, **(env or {})},
        capabilities={"amp": {"fp32": {"available": True, "reason": ""}, "fp16": {"available": False, "reason": "no"}}},
        applied=[{"toggle": "optimizer", "value": "adamw/for-loop", "detail": "AdamW"}],
        warmup=warmup, steps=len(steps), batch_size=4, samples_per_step=4, warmup_step_ms=[900.0, 120.0][:warmup],
        step_ms=steps, phase_ms={"forward": [s * 0.4 for s in steps], "backward": [s * 0.5 for s in steps]},
        losses=losses if losses is not None else [2.0 - 0.05 * i for i in range(warmup + len(steps))],
        peak_memory_bytes=42_000_000, memory_method="tensor tracker", memory_breakdown={"activations": 1000},
        time_to_first_step_s=0.9, compile_time_s=0.0, started_at=started_at or time.time(), wall_time_s=3.5,
        worker_pid=1234,
    )  # fmt: skip


BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a new, empty history goes: a file that does not exist yet, or a fresh PostgreSQL database."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("postgres_url"))
    return str(tmp_path / "history.sqlite")


@pytest.fixture
def store(store_target: str) -> Any:
    with Store(store_target) as opened:
        yield opened


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Any:
    with Store(tmp_path / "history.sqlite") as opened:
        yield opened


# --- the file ---------------------------------------------------------------------------


def test_default_path_follows_the_env_var_and_can_be_turned_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "mine.sqlite"))
    assert default_store_path() == tmp_path / "mine.sqlite"
    monkeypatch.setenv("WORKBENCH_STORE", "off")
    assert default_store_path() is None
    with opened_store(DEFAULT_STORE) as nothing:
        assert nothing is None
    monkeypatch.delenv("WORKBENCH_STORE")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    if os.name == "posix" and os.uname().sysname == "Linux":
        assert default_store_path() == tmp_path / "xdg" / "workbench" / "history.sqlite"


def test_tests_never_write_to_the_users_own_history() -> None:
    path = default_store_path()
    assert path is not None and "workbench-test-store-" in str(path)


def test_a_new_store_is_wal_versioned_and_marked_as_ours(sqlite_store: Store) -> None:
    conn = sqlite3.connect(sqlite_store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.schema_version()
    assert conn.execute("PRAGMA application_id").fetchone()[0] == schema.APPLICATION_ID
    conn.close()


# --- round trip and queries -------------------------------------------------------------------


def test_every_field_round_trips_and_capabilities_are_kept_once(store: Store) -> None:
    first, second = fake_result(), fake_result(config=TrainConfig(amp="bf16"))
    run_id = store.save_run([first, second], kind="compare", labels=["baseline", "candidate 1"])
    again = store.get(first.trial_id)
    assert again.result.to_dict() == first.to_dict()
    assert (again.run_id, again.label) == (run_id, "baseline")
    assert store.get(again.id).result.trial_id == first.trial_id
    assert store.get(second.trial_id).result.config["amp"] == "bf16"
    (kept,) = store._conn.execute("SELECT count(*) FROM capability_sets").fetchone()
    assert kept == 1
    with pytest.raises(KeyError):
        store.get("nope")


def test_trace_path_is_taken_from_the_profile_summary_and_can_be_attached(store: Store) -> None:
    result = fake_result()
    if "profile" in {f for f in result.__dataclass_fields__}:
        result.profile = {"trace_path": "/tmp/t.pt.trace.json.gz"}  # type: ignore[attr-defined]
        store.save_run([result])
        assert store.get(result.trial_id).trace_path == "/tmp/t.pt.trace.json.gz"
    other = fake_result()
    store.save_run([other])
    assert store.get(other.trial_id).trace_path is None
    store.attach_trace(other.trial_id, "/traces/x.json.gz")
    assert store.get(other.trial_id).trace_path == "/traces/x.json.gz"


def test_config_identity_ignores_defaults_number_spelling_and_the_simulated_regression() -> None:
    assert config_key(TrainConfig()) == config_key({"amp": "fp32"})  # a default spelled out
    assert config_key(TrainConfig(extra={"sample_cost_ms": 2})) == config_key(
        TrainConfig(extra={"sample_cost_ms": 2.0})
    )
    assert config_key(TrainConfig(extra={"slow_step_ms": 50})) == config_key(TrainConfig())
    assert config_key(TrainConfig(amp="bf16")) != config_key(TrainConfig())
    assert config_key(TrainConfig(extra={"sample_cost_ms": 2})) != config_key(TrainConfig())


def test_history_filters_by_workload_config_commit_and_time(store: Store) -> None:
    now = time.time()
    store.save_run([fake_result(commit=COMMIT_A, started_at=now - 7200)])
    store.save_run([fake_result(commit=COMMIT_B, started_at=now - 3600, config=TrainConfig(amp="bf16"))])
    store.save_run([fake_result(commit=COMMIT_C, started_at=now, workload="e2e-planner")])
    rows = store.history()
    assert [r.commit for r in rows] == [COMMIT_C, COMMIT_B, COMMIT_A]  # newest first
    assert [r.workload for r in store.history(workload="e2e-planner")] == ["e2e-planner"]
    assert [r.commit for r in store.history(config=TrainConfig(amp="bf16"))] == [COMMIT_B]
    assert [r.commit for r in store.history(commit="bbbb")] == [COMMIT_B]  # a prefix
    assert [r.commit for r in store.history(since=now - 5400)] == [COMMIT_C, COMMIT_B]
    assert [r.commit for r in store.history(until=now - 5400)] == [COMMIT_A]
    assert len(store.history(limit=1)) == 1
    assert rows[1].config_label == "amp=bf16" and rows[0].median_step_ms == pytest.approx(100.5)
    assert store.workloads() == ["bev-perception", "e2e-planner"]


def test_latest_baseline_is_the_newest_comparable_ok_run_with_all_its_repeats(store: Store) -> None:
    old = store.save_run([fake_result(commit=COMMIT_A)])
    newer = store.save_run([fake_result(commit=COMMIT_B), fake_result(commit=COMMIT_B)])
    store.save_run([fake_result(commit=COMMIT_C, env={"device_name": "other CPU"})])  # other hardware
    store.save_run([fake_result(commit=COMMIT_C, status="oom")])  # a failure is never a baseline
    store.save_run([fake_result(commit=COMMIT_C, warmup=5)])  # another window
    store.save_run([fake_result(commit=COMMIT_C, config=TrainConfig(amp="bf16"))])  # another config
    # A newer torch is the same hardware: comparable (it is what a regression check must see).
    found = store.latest_baseline({**HERE, "torch": "2.14.0"}, "bev-perception", TrainConfig(), warmup=2, steps=4)
    assert [t.run_id for t in found] == [newer, newer]
    assert [t.run_id for t in store.latest_baseline(HERE, "bev-perception", TrainConfig(), before_run=newer)] == [old]
    assert store.latest_baseline(HERE, "bev-perception", TrainConfig(), commit="aaaa")[0].run_id == old
    assert store.latest_baseline(HERE, "e2e-planner", TrainConfig()) == []


def test_a_clean_tree_is_preferred_over_dirty_at_the_same_commit(store: Store) -> None:
    clean = store.save_run([fake_result(commit=COMMIT_A)])
    store.save_run([fake_result(commit=COMMIT_A + "+dirty")])
    assert store.latest_baseline(HERE, "bev-perception", TrainConfig(), commit=COMMIT_A)[0].run_id == clean
    assert store.history()[0].commit_label == "aaaaaaaaaa+dirty"


def test_series_pools_each_commits_steps_in_first_measured_order(store: Store) -> None:
    rng = np.random.default_rng(0)
    start = time.time() - 1000
    steps: dict[str, list[float]] = {COMMIT_B: [], COMMIT_A: []}
    for i, commit in enumerate([COMMIT_B, COMMIT_A, COMMIT_B]):  # B measured first, then A, then B again
        values = list(rng.normal(100 + 10 * i, 3, 8))
        steps[commit] += values
        store.save_run([fake_result(values, commit=commit, started_at=start + i)])
    store.save_run([fake_result([1.0] * 4, commit=COMMIT_C, status="error")])  # failures are not plotted
    series = step_time_series(store, "bev-perception", TrainConfig(), environment=HERE)
    assert [p.commit for p in series] == [COMMIT_B, COMMIT_A]
    assert [p.trials for p in series] == [2, 1]
    assert series[0].median_step_ms == pytest.approx(np.median(steps[COMMIT_B]))
    assert series[1].q1_step_ms == pytest.approx(np.percentile(steps[COMMIT_A], 25))


# --- reliability: kills and interrupts leave no partial rows ---------------------------------------


def _die_inside_a_transaction(path: str) -> None:
    """Child process: write a run row and a trial row, then get SIGKILLed before COMMIT."""
    opened = Store(path)

    def insert_then_die(*args: Any, **kwargs: Any) -> int:
        row_id = Store._insert_trial(opened, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
        return row_id

    opened._insert_trial = insert_then_die  # type: ignore[method-assign]
    opened.save_run([fake_result()])


def test_a_process_killed_mid_write_leaves_no_rows_and_a_sound_file(store_target: str) -> None:
    path = store_target
    Store(path).close()
    child = multiprocessing.get_context("spawn").Process(target=_die_inside_a_transaction, args=(str(path),))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    with Store(path) as opened:
        assert opened.count() == 0 and opened.history() == []
        assert opened._conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
        if not opened.shared:
            assert opened._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        opened.save_run([fake_result()])  # and the file takes new trials
        assert opened.count() == 1


def tiny_workload(die_at: int = 0) -> Workload:
    """A small linear model whose forward SIGKILLs its own process (the worker) at call `die_at`.

    torch is imported here, not at module level: the writer processes of the concurrency
    test import this module and should start in a second, not pay for torch.
    """
    import torch
    from torch import nn

    class Crashing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear, self.calls = nn.Linear(8, 1), 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            if self.calls == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return self.linear(x)

    return Workload.from_callables(
        model_fn=Crashing,
        batch_fn=lambda n, g: (torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=4,
        name="tiny-linear",
    )


def test_a_worker_killed_mid_trial_is_stored_as_a_failure_never_as_a_measurement(store: Store) -> None:
    (runs,) = run_trials(tiny_workload(die_at=4), [TrainConfig()], warmup=1, steps=6, track_memory=False, store=store)
    assert runs[0].status in ("oom", "error") and "killed" in runs[0].message
    (row,) = store.history()
    assert row.status == runs[0].status and "killed" in row.message
    assert store.latest_baseline(HERE, "tiny-linear", TrainConfig()) == []
    assert step_time_series(store, "tiny-linear", TrainConfig()) == []


def test_an_interrupted_kernel_keeps_finished_trials_and_nothing_of_the_interrupted_one(store: Store) -> None:
    """A notebook interrupt is a KeyboardInterrupt in the main thread while it waits on the worker."""
    seen: list[str] = []

    def interrupt_in_second_trial(event: object) -> None:
        if isinstance(event, StepMeasured) and event.timed:
            seen.append(event.trial_id)
            if len(set(seen)) == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_comparison(tiny_workload(), TrainConfig(), [TrainConfig(lr=0.01)], warmup=1, steps=3, track_memory=False,
                       on_event=interrupt_in_second_trial, store=store)  # fmt: skip
    (row,) = store.history()
    assert row.label == "baseline" and row.status == "ok" and row.trial_id == seen[0]
    assert len(store.get(row.id).result.step_ms) == 3


# --- reliability: concurrent writers ------------------------------------------------------------


def _write_many(path: str, writer: int, count: int, start: Any) -> None:
    start.wait(60)  # every writer imported and ready: they really write at the same time
    with Store(path) as opened:
        for i in range(count):
            result = fake_result()
            result.trial_id = f"w{writer}-{i}"
            opened.save_run([result], kind="import", label=f"writer {writer}")
            time.sleep(0.002)  # like trials finishing now and then, so no writer holds the file throughout


def test_processes_writing_at_once_lose_nothing(store_target: str) -> None:
    path = store_target  # not created yet: the writers also race to create it
    writers, count = 3, 60
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(writers)
    procs = [context.Process(target=_write_many, args=(path, w, count, start)) for w in range(writers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [p.exitcode for p in procs] == [0] * writers
    with Store(path) as opened:
        rows = opened.history(limit=None)[::-1]
        assert {r.trial_id for r in rows} == {f"w{w}-{i}" for w in range(writers) for i in range(count)}
        assert opened._conn.execute("SELECT count(*) FROM runs").fetchone()[0] == writers * count
    spans = [[r.saved_at for r in rows if r.trial_id.startswith(f"w{w}-")] for w in range(writers)]
    assert max(min(s) for s in spans) < min(max(s) for s in spans), "the writers never overlapped: nothing was tested"


# --- reliability: files we must not touch -----------------------------------------------------------


def _unchanged(path: Path, before: bytes) -> bool:
    return path.read_bytes() == before and not Path(f"{path}-wal").exists()


def test_a_corrupt_file_is_refused_with_its_name_and_left_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    path.write_bytes(b"this is not SQLite at all " * 200)
    before = path.read_bytes()
    with pytest.raises(StoreError) as info:
        Store(path)
    assert str(path) in str(info.value) and "left unchanged" in str(info.value) and "WORKBENCH_STORE" in str(info.value)
    assert _unchanged(path, before)


def test_a_damaged_page_is_reported_not_reset(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    with Store(path) as opened:
        opened.save_run([fake_result() for _ in range(50)])
        opened._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    data[4096 * 3 : 4096 * 6] = b"\xff" * (4096 * 3)  # overwrite three pages in the middle
    path.write_bytes(bytes(data))

    def read_everything() -> None:
        with Store(path) as damaged:
            for row in damaged.history(limit=None):
                damaged.get(row.id)

    with pytest.raises(StoreError) as info:
        read_everything()
    assert str(path) in str(info.value) and "left unchanged" in str(info.value)
    assert path.read_bytes() == bytes(data)


def _one_trial_store(path: Path) -> bytes:
    with Store(path) as opened:
        opened.save_run([fake_result()])
        opened._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.read_bytes()


def _history_cli(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workbench.cli", "history", "--store", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


# Offsets in a one-trial store: 4096 the runs table, 8192 the capability sets (its loss once hid the
# trial: "no stored trials match", exit 0), 20480 an index (history still read, wrongly, as sound).
@pytest.mark.parametrize("offset", [4096, 8192, 20480])
def test_history_of_a_damaged_store_says_so_and_writes_nothing(tmp_path: Path, offset: int) -> None:
    path = tmp_path / "history.sqlite"
    data = bytearray(_one_trial_store(path))
    data[offset : offset + 4096] = b"\xab" * 4096
    path.write_bytes(bytes(data))
    proc = _history_cli(path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert str(path) in proc.stderr and "left unchanged" in proc.stderr and not proc.stdout
    assert path.read_bytes() == bytes(data)  # not a byte written: no PRAGMA optimize, no journal
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.sqlite"]


def test_reading_history_leaves_a_sound_store_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    before = _one_trial_store(path)
    proc = _history_cli(path)
    assert proc.returncode == 0 and "1 trial(s)" in proc.stdout, proc.stdout + proc.stderr
    assert path.read_bytes() == before


def _unwritable_place(tmp_path: Path, kind: str) -> Path:
    if kind == "parent is a file":
        (tmp_path / "taken").write_text("a file, not a folder")
        return tmp_path / "taken" / "sub" / "history.sqlite"
    if os.geteuid() == 0:  # root writes into a read-only folder; sysfs refuses even root
        return Path("/sys/workbench-test-store/history.sqlite")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    return locked / "sub" / "history.sqlite"


@pytest.mark.parametrize("kind", ["parent is a file", "read-only parent"])
def test_a_store_path_that_cannot_be_created_is_one_line_and_exit_2(tmp_path: Path, kind: str) -> None:
    path = _unwritable_place(tmp_path, kind)
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "run", "--store", str(path), "--steps", "1"],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"cannot create the run history {path}" in proc.stderr and "--store" in proc.stderr


def test_a_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE songs (title TEXT)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not a workbench run history"):
        Store(path)
    assert _unchanged(path, before)


def test_a_newer_schema_is_refused_and_never_downgraded(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    with Store(path) as opened:
        opened.save_run([fake_result()])
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {schema.schema_version() + 5}")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="newer workbench") as info:
        Store(path)
    assert str(path) in str(info.value) and "upgrade training-workbench" in str(info.value)
    assert path.read_bytes() == before


def test_migrations_upgrade_in_one_transaction_and_keep_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "history.sqlite"
    with Store(path) as opened:
        kept = fake_result()
        opened.save_run([kept])
    version = schema.schema_version()
    broken = [*schema.MIGRATIONS, ["ALTER TABLE trials ADD COLUMN note TEXT", "THIS IS NOT SQL"]]
    monkeypatch.setattr(schema, "MIGRATIONS", broken)
    with pytest.raises(StoreError):
        Store(path)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == version  # rolled back whole
    monkeypatch.setattr(schema, "MIGRATIONS", [*broken[:-1], ["ALTER TABLE trials ADD COLUMN note TEXT"]])
    with Store(path) as migrated:
        assert migrated._conn.execute("PRAGMA user_version").fetchone()[0] == version + 1
        assert migrated.get(kept.trial_id).result.to_dict() == kept.to_dict()
    assert Path(f"{path}.schema-v{version}.bak").exists()


def test_a_missing_file_is_not_created_by_read_only_opens(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no run history"):
        Store(tmp_path / "none.sqlite", create=False)
    assert not (tmp_path / "none.sqlite").exists()


# --- saving from the API and the CLI ------------------------------------------------------------


def test_comparisons_and_cli_runs_are_saved_unless_told_not_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.cli import build_parser, main
    from workbench.cli.options import store_arg

    path = tmp_path / "h.sqlite"
    # design='processes': every unit is a trial (inline here, so no process start-ups), and each is stored.
    protocol = Protocol(design="processes", budget_s=1)
    outcome = run_comparison(tiny_workload(), TrainConfig(), [TrainConfig(lr=0.01)], protocol=protocol, warmup=1,
                             steps=2, isolation="inline", track_memory=False, store=path)  # fmt: skip
    run_comparison(tiny_workload(), TrainConfig(), [TrainConfig(lr=0.01)], protocol=protocol, warmup=1, steps=2,
                   isolation="inline", track_memory=False, store=None)  # fmt: skip
    rounds = outcome.comparison.rounds
    assert rounds == 6  # the fewest the 95% signed-rank interval needs; the 1 s budget stops it there
    with Store(path) as opened:
        rows = opened.history()
        assert sorted(r.label for r in rows) == ["baseline"] * rounds + ["candidate 1"] * rounds
        assert {r.run_id for r in rows} == {1} and {r.kind for r in rows} == {"compare"}
        # The comparison's verdict is stored with the trials it came from.
        stored = {r.label: opened.get(r.id).result.comparison for r in rows}
        candidate = outcome.comparison.candidates[0]
        assert stored["candidate 1"] is not None and stored["candidate 1"]["verdict"] == candidate.verdict
        assert stored["candidate 1"]["speedup"] == pytest.approx(candidate.speedup)
        assert stored["baseline"] is not None and stored["baseline"]["rounds"] == rounds
    assert store_arg(build_parser().parse_args(["run", "--no-store"])) is None
    assert store_arg(build_parser().parse_args(["compare", "--candidate", "amp=bf16", "--store", "x"])) == "x"
    assert store_arg(build_parser().parse_args(["run"])) is DEFAULT_STORE
    # This module is importable in the worker (pytest put tests/ on sys.path, and spawn passes it on).
    spec = f"{__name__}:tiny_workload"
    assert main(["run", "--workload", spec, "--steps", "1", "--warmup", "1", "--quiet", "--store", str(path)]) == 0
    with Store(path) as opened:
        newest = opened.history(limit=1)[0]
        assert (newest.workload, newest.kind, newest.run_id, newest.steps) == ("tiny-linear", "run", 2, 1)
        assert opened.history(workload=spec)[0].id == newest.id  # found by what was asked for, too
