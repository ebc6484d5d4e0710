"""A search in the run history: one stored "tune" run holds every trial the search ran.

The store is the one source of truth for resuming: Optuna's study lives in memory and is
rebuilt from the stored trials (`Screening.replay`), so there is no second database to keep
in step with ours. The run's label is the search's identity (workload, window, space,
objective): `--resume` only continues a search of the same question.
"""

from __future__ import annotations

import json
from typing import Any

from workbench.config import ConfigError
from workbench.measure.result import TrialResult
from workbench.store import StoreArg, opened_store

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
        if resume:
            self._resume()

    @property
    def run_id(self) -> int | None:
        return self.recorder.run_id if self.recorder is not None else None

    def save(self, result: TrialResult, label: str) -> None:
        if self.recorder is not None:
            self.recorder.save(result, label=label)

    def close(self) -> None:
        self._context.__exit__(None, None, None)

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
