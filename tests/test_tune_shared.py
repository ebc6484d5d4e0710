"""One study, many tuners: `workbench tune --storage postgresql://... --study NAME` in several processes on a
throw-away PostgreSQL. Two processes started seconds apart share the study (each configuration measured
once, by one of them; none left running; the verification run once, its verdict stored once); one killed
mid-trial leaves its trial failed, and the other finishes the study."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from test_cli_tune import SLEEPY_MODULE

SPACE = '{"batch_size": [2, 4, 8], "optimizer_impl": ["for-loop", "foreach"], "channels_last": [false, true]}'


_STARTED: list[subprocess.Popen[str]] = []
"""Every tuner a test started: ended at its teardown whatever the test's outcome (`_end_tuners`)."""


@pytest.fixture(autouse=True)
def _end_tuners() -> Any:
    """A failed assertion or timeout must not leave a tuner running into the next tests."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def _start(tmp_path: Path, storage: str, study: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    command = [
        sys.executable,
        "-m",
        "workbench.cli",
        "tune",
        "--workload",
        "sleepy_models:sleepy",
        "--space",
        str(tmp_path / "space.json"),
        "--budget",
        "40",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--device",
        "cpu",
        "--precision",
        "0.1",
        "--no-store",
        "--storage",
        storage,
        "--study",
        study,
        "--json",
        *extra,
    ]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    _STARTED.append(proc)
    return proc


@pytest.fixture
def studies(postgres_url: str) -> Any:
    """Reads a study of the test's database (one storage for the test, its connections closed after)."""
    storage = optuna.storages.RDBStorage(postgres_url.replace("postgresql://", "postgresql+psycopg://"))
    yield lambda name: optuna.load_study(study_name=name, storage=storage)
    storage.remove_session()
    storage.engine.dispose()


def _measured(study: Any) -> list[Any]:
    """The trials a process measured in screening (the ones told with their figures)."""
    return [t for t in study.get_trials(deepcopy=False) if "figures" in t.user_attrs]


@pytest.fixture
def workload_folder(tmp_path: Path) -> Path:
    (tmp_path / "sleepy_models.py").write_text(SLEEPY_MODULE)
    (tmp_path / "space.json").write_text(SPACE)
    return tmp_path


def test_two_tuners_started_seconds_apart_share_one_study(
    workload_folder: Path, postgres_url: str, studies: Any
) -> None:
    first = _start(workload_folder, postgres_url, "shared")
    time.sleep(3)
    second = _start(workload_folder, postgres_url, "shared")
    outputs = [proc.communicate(timeout=240) for proc in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], [err[-2000:] for _, err in outputs]
    results = [json.loads(out) for out, _ in outputs]

    study = studies("shared")
    measured = _measured(study)
    configs = [json.dumps(t.params, sort_keys=True) for t in measured]
    assert len(configs) == len(set(configs)), "a configuration was measured twice"
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,)), "a trial was left running"
    by_process = [{t["trial_id"] for t in r["trials"] if not t["resumed"] and t["stage"] == "screen"} for r in results]
    assert not by_process[0] & by_process[1]
    assert by_process[0] | by_process[1] == {t.user_attrs["figures"]["trial_id"] for t in measured}
    # The verification ran once, in one process; its verdict is the study's, and both report it.
    verified = [r for r in results if r["rungs"]]
    assert len(verified) == 1
    verdict = study.user_attrs["verdict"]
    assert verdict["best"]["config"] == verified[0]["best"]["config"]
    assert [r["best"]["config"] for r in results] == [verdict["best"]["config"]] * 2
    assert verdict["best"]["config"]["batch_size"] == 8  # 1.5x per sample: the truth of this workload
    assert all(r["shared_study"] == "shared" and "constant_liar" in r["sampler"] for r in results)


def test_a_tuner_killed_mid_trial_leaves_its_trial_failed_and_the_other_finishes(
    workload_folder: Path, postgres_url: str, studies: Any
) -> None:
    # The one to be killed starts first, so it surely takes a trial; started second, it found the
    # study all but measured when the host was slow to start it.
    victim = _start(workload_folder, postgres_url, "killed")
    time.sleep(3)
    survivor = _start(workload_folder, postgres_url, "killed")
    mine = f":{victim.pid}"
    deadline = time.monotonic() + 120
    running: list[Any] = []
    while not running and time.monotonic() < deadline:
        time.sleep(0.3)
        try:
            trials = studies("killed").get_trials(states=(optuna.trial.TrialState.RUNNING,))
        except KeyError:  # the study is not created yet
            continue
        running = [t for t in trials if str(t.user_attrs.get("worker", "")).endswith(mine)]
    assert running, "the first tuner never started a trial"
    os.killpg(victim.pid, signal.SIGKILL)  # the tuner and its trial's worker process
    victim.communicate(timeout=30)
    out, err = survivor.communicate(timeout=240)
    assert survivor.returncode == 0, err[-2000:]

    study = studies("killed")
    killed = study.trials[running[0].number]
    assert killed.state == optuna.trial.TrialState.FAIL, "the killed tuner's trial was not failed"
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    configs = [json.dumps(t.params, sort_keys=True) for t in _measured(study)]
    assert len(configs) == len(set(configs))
    result = json.loads(out)
    assert result["rungs"] and study.user_attrs["verdict"]["best"]["config"] == result["best"]["config"]


def test_workers_starts_n_tuners_that_share_the_study(workload_folder: Path, postgres_url: str, studies: Any) -> None:
    proc = _start(workload_folder, postgres_url, "workers", "--workers", "2")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-2000:]
    results = json.loads(out)
    assert len(results) == 2 and sum(1 for r in results if r["rungs"]) == 1
    verdict = studies("workers").user_attrs["verdict"]
    assert [r["best"]["config"] for r in results] == [verdict["best"]["config"]] * 2


def test_another_device_kind_or_question_is_refused_by_name(postgres_url: str) -> None:
    from workbench.config import ConfigError
    from workbench.tune.screening import make_pruner, make_sampler
    from workbench.tune.space import user_space
    from workbench.tune.study import SharedStudy

    space = user_space({"batch_size": [2, 4]}, "cpu")

    def join(kind: str, question: dict[str, Any]) -> SharedStudy:
        return SharedStudy(
            postgres_url, "kinds", question, kind, resume=False, sampler=make_sampler(space, 0), pruner=make_pruner()
        )

    join("cuda: NVIDIA H100 80GB HBM3", {"workload": "sleepy"}).close()
    with pytest.raises(ConfigError, match=r"measures on cuda: NVIDIA H100 80GB HBM3; this process's device is cpu"):
        join("cpu: AMD EPYC", {"workload": "sleepy"})
    with pytest.raises(ConfigError, match="differs in workload"):
        join("cuda: NVIDIA H100 80GB HBM3", {"workload": "bev-perception"})
    with pytest.raises(ConfigError, match="no study 'other'"):
        SharedStudy(postgres_url, "other", {}, "cpu", resume=True, sampler=None, pruner=None)
    with pytest.raises(ConfigError, match="must be a PostgreSQL URL"):
        SharedStudy("sqlite:///x.db", "kinds", {}, "cpu", resume=False, sampler=None, pruner=None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--study", "s"], "give its --storage"),
        (["--workers", "2"], "--workers N shares one study"),
        (["--storage", "postgresql://postgres@127.0.0.1:1/x", "--study", "s"], "nothing answers at 127.0.0.1:1"),
    ],
)
def test_bad_shared_study_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    from workbench.cli import main

    (tmp_path / "space.json").write_text('{"amp": ["fp32", "bf16"]}')
    code = main(["tune", "--space", str(tmp_path / "space.json"), "--device", "cpu", "--no-store", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1, err
