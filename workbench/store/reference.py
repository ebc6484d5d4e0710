"""What a regression check compares against: a REF string resolved to stored trials.

REF is one of
- `latest`: per configuration, the newest comparable stored run (before the one being checked);
- `run:<id>`: one stored run (the `run` column of `workbench history`), e.g. a release's run;
- a git commit: a full sha, a prefix of at least 4 hex digits, or any revision git resolves in
  the current repository (`HEAD~1`, `origin/main`): the newest comparable run at that commit,
  a clean tree preferred over '+dirty'.

An explicit REF (a commit or a run) that names nothing stored is an `UnknownReference`:
a CI gate must not pass because its reference is missing. `latest` with nothing stored
yet is not an error: the first run starts the history.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from workbench.config import TrainConfig
from workbench.store.db import StoreError

if TYPE_CHECKING:
    from workbench.analysis.regress import Suite
    from workbench.store.core import Store
    from workbench.store.records import StoredTrial

_HEX_PREFIX = re.compile(r"^[0-9a-fA-F]{4,40}$")
_RUN = re.compile(r"^run:(\d+)$")


class UnknownReference(StoreError):
    """REF names nothing usable in the store (or is not a REF at all)."""


@dataclass(frozen=True)
class Reference:
    text: str
    kind: Literal["latest", "commit", "run"]
    commit: str | None = None
    run_id: int | None = None

    @property
    def explicit(self) -> bool:
        """A commit or a run the user named, which must exist (unlike 'latest')."""
        return self.kind != "latest"

    def describe(self) -> str:
        if self.kind == "commit":
            return f"commit {(self.commit or '')[:10]}"
        if self.kind == "run":
            return f"run {self.run_id}"
        return "latest"

    def find(
        self,
        store: Store | None,
        environment: dict[str, Any] | str,
        workload: str,
        config: TrainConfig,
        *,
        preset: str | None,
        warmup: int,
        steps: int,
        before_run: int | None = None,
    ) -> list[StoredTrial]:
        """The reference trials for one configuration ([] when there are none)."""
        if store is None:
            return []
        return store.latest_baseline(environment, workload, config, preset=preset, warmup=warmup, steps=steps,
                                     commit=self.commit, run_id=self.run_id, before_run=before_run)  # fmt: skip


def find_baselines(
    suite: Suite,
    reference: Reference,
    store: Store | None,
    environment: dict[str, Any] | str | None,
    *,
    current: Mapping[str, list[StoredTrial]] | None = None,
) -> dict[str, list[StoredTrial]]:
    """Per suite configuration, the reference trials: comparable hardware, same workload and window.

    `environment` is this machine's fingerprint when the suite is measured now; with
    `current` (stored trials, `--from-store`) each configuration is matched to its own
    current trials' hardware, and 'latest' means the newest run saved before them.
    An explicit REF with no comparable trial for any configuration is an UnknownReference:
    the check would compare nothing, and a CI gate must not pass on that.
    """
    found = {}
    for item in suite.configurations:
        env, before = environment, None
        if current is not None:
            mine = current[item.name][0]
            env, before = mine.result.environment, (mine.run_id if not reference.explicit else None)
        if env is None:
            raise ValueError("find_baselines needs this machine's environment, or the current stored trials")
        found[item.name] = reference.find(store, env, suite.workload, item.config, preset=suite.preset,
                                          warmup=suite.warmup, steps=suite.steps, before_run=before)  # fmt: skip
    if reference.explicit and not any(found.values()):
        raise UnknownReference(
            f"{reference.describe()} has no stored trial comparable with suite '{suite.name}' here (same workload, "
            f"preset, steps and warmup, one of its configurations, the same hardware)"
        )
    return found


def stored_current(suite: Suite, store: Store) -> dict[str, list[StoredTrial]]:
    """`regress --from-store`: per configuration, the newest stored run's trials (any hardware, any status)."""
    current = {}
    for item in suite.configurations:
        trials = store.latest_baseline(None, suite.workload, item.config, preset=suite.preset, warmup=suite.warmup,
                                       steps=suite.steps, ok_only=False)  # fmt: skip
        if not trials:
            raise UnknownReference(
                f"--from-store: no stored trial of configuration '{item.name}' ({item.config.describe()}) for "
                f"{suite.workload} [{suite.preset}], {suite.steps} steps after {suite.warmup} warm-up, in {store.path}"
            )
        current[item.name] = trials
    return current


def describe_trials(trials: list[StoredTrial]) -> str:
    """'run 12 @ 1a2b3c4d5e' — where a set of reference trials comes from, for a table cell."""
    from workbench.store.series import commit_label

    first = trials[0]
    return f"run {first.run_id} @ {commit_label(first.commit)}"


def parse_reference(text: str, store: Store | None, *, cwd: str | None = None) -> Reference:
    """Resolve REF against the store (see the module docstring); UnknownReference when it cannot be."""
    text = text.strip()
    where = f"in {store.path}" if store is not None else "(no run history file exists yet)"
    if text == "latest":
        return Reference(text, "latest")
    run = _RUN.match(text)
    if run:
        run_id = int(run.group(1))
        if store is None or store.run(run_id) is None:
            raise UnknownReference(f"no stored run {run_id} {where}; `workbench history` lists the runs")
        return Reference(text, "run", run_id=run_id)
    stored = store.commits(text.lower()) if store is not None and _HEX_PREFIX.match(text) else []
    if len(stored) > 1:
        raise UnknownReference(f"commit prefix '{text}' is ambiguous {where}: {', '.join(c[:12] for c in stored)}")
    if len(stored) == 1:
        return Reference(text, "commit", commit=stored[0])
    resolved = _git_rev_parse(text, cwd)
    if resolved is None:
        raise UnknownReference(
            f"unknown REF '{text}': give 'latest', 'run:<id>' (ids in `workbench history`) or a git commit"
        )
    if store is None or not store.commits(resolved):
        raise UnknownReference(f"REF '{text}' is commit {resolved[:12]}, but no run at that commit is stored {where}")
    return Reference(text, "commit", commit=resolved)


def _git_rev_parse(text: str, cwd: str | None) -> str | None:
    if text.startswith("-"):  # never let a REF become a git option
        return None
    try:
        proc = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{text}^{{commit}}"], cwd=cwd,
                              capture_output=True, text=True, timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None
