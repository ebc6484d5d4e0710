"""`workbench regress --watched RUN`: a watched job's steady step time against a stored reference run.

The reference is another watched run: `run:<id>`, or `latest`, the newest earlier run of
the same job name on comparable hardware (same environment key) that ended cleanly. The
statistics are `analysis.steady.check_watched`'s; this module only finds the two runs.
"""

from __future__ import annotations

from workbench.analysis.regress import RegressionReport
from workbench.analysis.steady import check_watched
from workbench.store.core import Store
from workbench.store.watched import WatchedRun, watch_steps, watched_run, watched_runs


class WatchReferenceError(ValueError):
    """The watched run or its reference cannot be found; the message says which and how to list them."""


def find_watched(store: Store, spec: str) -> WatchedRun:
    """A run id ('12', 'run:12') or a job name (its newest watched run)."""
    text = spec.removeprefix("run:")
    if text.isdigit():
        try:
            return watched_run(store, int(text))
        except KeyError as exc:
            raise WatchReferenceError(str(exc.args[0])) from None
    found = watched_runs(store, name=spec, limit=1)
    if not found:
        raise WatchReferenceError(f"no watched run named '{spec}' in {store.path} (`workbench history` lists them)")
    return found[0]


def find_reference(store: Store, run: WatchedRun, against: str) -> WatchedRun | None:
    """The run to hold `run` against: 'latest' (None when there is none yet) or 'run:<id>'."""
    if against == "latest":
        earlier = watched_runs(store, name=run.name, before_run=run.run_id, limit=None)
        return next((r for r in earlier if r.env_key == run.env_key and r.status == "ended" and not r.message), None)
    if against.startswith("run:") and against[4:].isdigit():
        return find_watched(store, against)
    raise WatchReferenceError(f"--against for a watched run is 'latest' or 'run:<id>' of another watched run; "
                              f"got '{against}'")  # fmt: skip


def check_watched_run(
    store: Store, spec: str, against: str = "latest", *, threshold: float = 0.05, confidence: float = 0.95
) -> RegressionReport:
    """The one-row regression report of watched run `spec` against its reference."""
    run = find_watched(store, spec)
    reference = find_reference(store, run, against)
    label = f"run:{reference.run_id}" if reference is not None else "none"
    current = watch_steps(store, run.run_id)
    ref_rows = watch_steps(store, reference.run_id) if reference is not None else []
    row = check_watched(run.name, current, run.warmup, ref_rows, reference.warmup if reference else 0,
                        reference_label=label, threshold=threshold, confidence=confidence)  # fmt: skip
    row.current_trial_ids = [f"watch-{run.run_id}"]
    if reference is not None:
        row.reference_trial_ids = [f"watch-{reference.run_id}"]
    else:  # in place of "reference has no step": there is no reference at all
        row.notes = [f"no earlier cleanly ended watched run of '{run.name}' on this hardware to hold it against"]
    if run.status != "ended" or run.message:
        row.notes.append(f"the watched run is {run.status}{': ' + run.message if run.message else ''}")
    return RegressionReport(f"watch:{run.name}", label, threshold, confidence, [row])
