"""A search in the run history: one stored "tune" run holds every trial the search ran.

The store is the one source of truth for resuming a search of one process: Optuna's study lives
in memory and is rebuilt from the stored trials (`Screening.replay`), so there is no second
database to keep in step with ours. The run's label is the search's identity (workload, window,
space, objective): `--resume` only continues a search of the same question. A search shared by
several processes keeps its study in PostgreSQL instead (`study.py`); there the study is what
resumes, and each process still saves the trials it measured here.
"""

from __future__ import annotations

import json
from typing import Any

from workbench.config import ConfigError
from workbench.measure.result import TrialResult
from workbench.store import StoreArg, StoreError, opened_store

KIND = "tune"

#: Trial labels: the search stage each stored trial belongs to.
BASELINE, SCREEN, VERIFY_BATCH = "baseline", "screen", "largest batch"


class TuneRecord:
    """Opens the store for the whole search and saves each trial to the one tune run."""

    def __init__(self, store: StoreArg, identity: dict[str, Any], *, resume: bool) -> None:
        self._context = opened_store(store)
        self.store = self._context.__enter__()
        self.label = json.dumps({"tune": identity}, sort_keys=True, default=str)
        self.recorder = self.store.recorder(KIND, label=self.label) if self.store is not None else None
        self.previous: list[tuple[str, TrialResult]] = []
        self.unsaved: list[tuple[TrialResult, str]] = []
        """Measured trials the store refused (its server away), oldest first, still to be written."""
        self.store_failure = ""
        if resume:
            self._resume()

    @property
    def run_id(self) -> int | None:
        return self.recorder.run_id if self.recorder is not None else None

    def save(self, result: TrialResult, label: str) -> None:
        """Write the trial, after any kept back while the store was unreachable. A store that fails
        (a server gone away) keeps the trial here and the search goes on: it is written with the next
        save that succeeds, and `close` stops with what is still unwritten printed, never dropped."""
        if self.recorder is None:
            return
        self.unsaved.append((result, label))
        self._write_unsaved()

    def close(self) -> None:
        try:
            self._write_unsaved()  # a last try: the server may be back
        finally:
            self._context.__exit__(None, None, None)
        if self.unsaved:
            raise UnsavedTrials(self.unsaved, self.store_failure)

    def _write_unsaved(self) -> None:
        if self.recorder is None:
            return
        try:
            while self.unsaved:
                result, label = self.unsaved[0]
                self.recorder.save(result, label=label)
                self.unsaved.pop(0)
        except StoreError as exc:
            self.store_failure = str(exc)

    def _resume(self) -> None:
        if self.store is None or self.recorder is None:
            raise ConfigError("--resume needs the run history; drop --no-store (or WORKBENCH_STORE=off)")
        run = next((r for r in self.store.runs(kind=KIND, limit=500) if r["label"] == self.label), None)
        if run is None:
            self.close()
            raise ConfigError(
                f"no earlier tune of this workload, window, space and objective in {self.store.path}; "
                "run without --resume to start one (the same flags and space file resume it later)"
            )
        self.recorder.run_id = int(run["id"])
        self.previous = [(t.label, t.result) for t in self.store.trials(run_id=int(run["id"]))]


class UnsavedTrials(StoreError):
    """The search ended with trials the run history never took: each one's figures are in the message."""

    def __init__(self, unsaved: list[tuple[TrialResult, str]], why: str) -> None:
        self.results = [result for result, _ in unsaved]
        lines = [f"{len(unsaved)} measured trial(s) could not be written to the run history ({why}):"]
        for result, label in unsaved:
            median = f"{result.median_step_ms:.3f} ms" if result.median_step_ms is not None else "-"
            config = json.dumps(result.config, sort_keys=True)
            lines.append(f"  {label}: {config} {result.status} median {median} (trial {result.trial_id})")
        lines.append("  full results: " + json.dumps([r.to_dict() for r in self.results], default=str))
        super().__init__("\n".join(lines))
