"""One tuning study shared by many tuner processes, on one machine or many, through Optuna's
relational storage on PostgreSQL (no coordinator of our own).

Each process asks the study for the sampler's next proposal, measures it on its own device and
tells the result. What Optuna leaves to an ask/tell driver is done here:
- heartbeats: Optuna records them only under `optimize()`; a measuring process beats for its
  trial from a thread, and every process fails stale trials (`fail_stale_trials`) before it asks,
  so a killed worker's trial ends FAIL instead of RUNNING forever;
- measured once: two processes may be handed the same configuration at the same moment (TPE's
  constant liar makes it rare); the later trial number defers to the earlier one;
- the baseline and the verification rung run once: under a PostgreSQL advisory lock, which the
  server releases when its holder dies, so the next process takes over; the baseline's result and
  the verdict are stored in the study's attributes, written once.
The study records the device it measures on; a process on another kind of device is refused by name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from workbench.config import ConfigError
from workbench.measure.result import TrialResult
from workbench.store import StoreError, is_database_url
from workbench.store.location import redacted

HEARTBEAT_S = 2
"""How often a measuring process tells the study it is alive."""
GRACE_S = 15
"""Silence after which its trial is failed by whichever process looks next."""
REPEAT_ATTR = "repeat_of"


class SharedStudy:
    """The Optuna study `name` in the PostgreSQL database at `url`, opened (or created) for this process."""

    def __init__(
        self,
        url: str,
        name: str,
        identity: dict[str, Any],
        device_kind: str,
        *,
        resume: bool,
        sampler: Any,
        pruner: Any,
    ) -> None:
        if not is_database_url(url):
            raise ConfigError(
                f"--storage must be a PostgreSQL URL (postgresql://USER@HOST[:PORT]/DATABASE), got '{url}'; "
                "a study on one machine needs no storage at all"
            )
        if not name or not name.strip():
            raise ConfigError("a shared study needs a name: --study NAME (every process of one search gives the same)")
        import optuna
        import psycopg

        from workbench.store.postgres import explain

        self.optuna, self.name, self.shown = optuna, name, redacted(url)
        try:
            self._locks = psycopg.connect(url, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise explain(exc, self.shown) from None
        try:
            with _no_heartbeat_warnings():
                self.storage = optuna.storages.RDBStorage(
                    _sqlalchemy_url(url),
                    heartbeat_interval=HEARTBEAT_S,
                    grace_period=GRACE_S,
                    engine_kwargs={"pool_pre_ping": True},
                )
        except Exception as exc:
            self._locks.close()
            raise StoreError(f"cannot open the study storage {self.shown}: {exc}") from None
        try:
            self.study = self._open(identity, device_kind, resume, sampler, pruner)
        except BaseException:
            self.close()
            raise

    # --- who measures what ---------------------------------------------------------------------

    def fail_stale(self) -> None:
        """Fail the trials whose process stopped beating (killed, its machine gone)."""
        with _no_heartbeat_warnings():
            self.optuna.storages.fail_stale_trials(self.study)

    def ask(self, distributions: dict[str, Any]) -> tuple[Any, int | None]:
        """The sampler's next proposal, marked with the process that measures it (host:pid), and the
        earlier trial of the same configuration if there is one (then this one is not measured).

        One process asks at a time: Optuna writes a new trial's parameters one by one, so a check
        made while another process's ask is half-written would miss its duplicate."""
        with self.only_one("ask"), _no_heartbeat_warnings():
            trial = self.study.ask(distributions)
            trial.set_user_attr("worker", f"{platform.node()}:{os.getpid()}")
            return trial, self.repeat_of(trial)

    def repeat_of(self, trial: Any) -> int | None:
        """An earlier trial (running or finished, not itself a repeat) with this trial's configuration."""
        mine = trial.params
        for other in self.study.get_trials(deepcopy=False):
            if other.number >= trial.number or other.params != mine or REPEAT_ATTR in other.user_attrs:
                continue
            return int(other.number)
        return None

    def tell(self, trial: Any, value: float | None, state: Any, figures: dict[str, Any], result: TrialResult) -> None:
        """Report a measured trial, with the figures another process's verification ranks it by. A
        storage that stopped answering ends the run with the trial's result printed (never dropped)."""
        try:
            trial.set_user_attr("figures", figures)
            self.study.tell(trial, value, state=state)
        except Exception as exc:
            raise StudyUnreachable(self.shown, exc, result) from None

    @contextlib.contextmanager
    def beating(self, trial: Any) -> Iterator[None]:
        """Heartbeats for `trial` while the block measures it."""
        stop = threading.Event()
        trial_id = trial._trial_id
        self.storage.record_heartbeat(trial_id)

        def beat() -> None:
            while not stop.wait(HEARTBEAT_S):
                with contextlib.suppress(Exception):  # a missed beat is retried; the grace period covers it
                    self.storage.record_heartbeat(trial_id)

        thread = threading.Thread(target=beat, name="study-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    @contextlib.contextmanager
    def only_one(self, purpose: str) -> Iterator[None]:
        """Held by one process of the study at a time (a PostgreSQL advisory lock, freed by the server
        if its holder dies): the baseline's measurement, the verification rung."""
        key = int.from_bytes(hashlib.sha256(f"{self.name}/{purpose}".encode()).digest()[:8], "big", signed=True)
        self._locks.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                self._locks.execute("SELECT pg_advisory_unlock(%s)", (key,))

    # --- what the study keeps -------------------------------------------------------------------

    def baseline(self, measure: Callable[[], TrialResult]) -> tuple[TrialResult, bool]:
        """The study's baseline result, measured by the first process to get here; (result, measured here)."""
        with self.only_one("baseline"):
            stored = self.attr("baseline")
            if stored is not None:
                return TrialResult.from_dict(stored), False
            result = measure()
            if result.ok:
                self.study.set_user_attr("baseline", json.loads(result.to_json()))
            return result, True

    def attr(self, name: str) -> Any:
        return self.storage.get_study_user_attrs(self.study._study_id).get(name)

    def set_verdict(self, verdict: dict[str, Any]) -> bool:
        """Store the verification's verdict unless one is stored already (False then)."""
        if self.attr("verdict") is not None:
            return False
        self.study.set_user_attr("verdict", verdict)
        return True

    def running(self) -> int:
        states = (self.optuna.trial.TrialState.RUNNING,)
        return len(self.study.get_trials(deepcopy=False, states=states))

    def wait_until_idle(self, timeout_s: float) -> None:
        """Until no trial runs (stale ones failed as they turn stale), or the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.fail_stale()
            if not self.running():
                return
            time.sleep(1.0)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._locks.close()
        with contextlib.suppress(Exception):
            self.storage.remove_session()
            self.storage.engine.dispose()

    # --- internals --------------------------------------------------------------------------------

    def _open(self, identity: dict[str, Any], device_kind: str, resume: bool, sampler: Any, pruner: Any) -> Any:
        optuna = self.optuna
        exists = any(s.study_name == self.name for s in optuna.get_all_study_summaries(self.storage))
        if resume and not exists:
            raise ConfigError(
                f"--resume: no study '{self.name}' in {self.shown}; start it without --resume "
                "(every process that gives the same --study joins it)"
            )
        study = optuna.create_study(
            study_name=self.name,
            storage=self.storage,
            load_if_exists=True,
            direction="minimize",
            sampler=sampler,
            pruner=pruner,
        )
        wanted = {"identity": json.loads(json.dumps(identity, sort_keys=True, default=str)), "device": device_kind}
        with self.only_one("identity"):
            stored = {key: study.user_attrs.get(key) for key in wanted}
            if stored["identity"] is None:
                for key, value in wanted.items():
                    study.set_user_attr(key, value)
                return study
        if stored["device"] != device_kind:
            raise ConfigError(
                f"study '{self.name}' measures on {stored['device']}; this process's device is {device_kind}. "
                "Measurements from different devices are never mixed in one study: give another --study"
            )
        differing = sorted(k for k in wanted["identity"] if stored["identity"].get(k) != wanted["identity"][k])
        if differing:
            raise ConfigError(
                f"study '{self.name}' searches another question (it differs in {', '.join(differing)}); every "
                "process of one study needs the same workload, window, space, objective and baseline"
            )
        return study


class StudyUnreachable(StoreError):
    """The study's database stopped answering after a trial was measured: the message holds its result."""

    def __init__(self, shown: str, exc: Exception, result: TrialResult) -> None:
        self.result = result
        why = " ".join(str(exc).split())[:300]
        median = f"{result.median_step_ms:.3f} ms" if result.median_step_ms is not None else "-"
        super().__init__(
            f"the study storage {shown} stopped answering ({type(exc).__name__}: {why}); the trial just measured "
            f"is not in the study: {json.dumps(result.config, sort_keys=True)} {result.status} median {median} "
            f"(trial {result.trial_id}). Its result: {result.to_json()}. Restart this process to rejoin the study "
            "once the server is back (its trial there is failed once its heartbeat is stale)"
        )


@contextlib.contextmanager
def _no_heartbeat_warnings() -> Iterator[None]:
    """Optuna marks its heartbeats experimental and warns that they are meant for `optimize()`:
    driving them from ask/tell is what this module does on purpose (see the module docstring)."""
    import optuna

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        yield


def _sqlalchemy_url(url: str) -> str:
    """libpq's URL as SQLAlchemy takes it, on the psycopg 3 driver the run store uses too."""
    rest = url.strip().split("://", 1)[1]
    return f"postgresql+psycopg://{rest}"
