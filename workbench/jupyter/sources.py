"""What the `capabilities`, `runs`, `watch` and `notebooks/*` endpoints serve, kept apart from HTTP.

Nothing here takes a path, a module name or code from a request: templates come from a
fixed allow-list of notebooks installed with the package, runs from the user's default
store, and capabilities from our own CLI (fixed arguments) run in a child process. The child process is the trade-off:
probing the device imports torch and runs a tiny kernel, which inside the Jupyter server
would cost it ~300 MB of RAM for good and, on a GPU, a CUDA context (GPU memory) that
would outlive the probe. The answer cannot change while the server runs, so it is
computed once per process.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

CAPABILITIES_TIMEOUT_S = 180.0

#: Template name in the URL → file name. The only notebooks the API will read.
TEMPLATES = {"quickstart": "01_quickstart.ipynb"}

#: Where the wheel installs the notebooks, under each Jupyter data directory (pyproject shared-data).
DATA_SUBDIR = ("training-workbench", "notebooks")
#: A source checkout (editable install) reads its own notebooks/ folder, so edits show up at once.
_CHECKOUT = _PACKAGE_PARENT = Path(__file__).resolve().parents[2]


class SourceError(Exception):
    """A source cannot answer; `status` is the HTTP status the handler should send."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# --- capabilities --------------------------------------------------------------------

_capabilities: dict[str, Any] | None = None
_probe: asyncio.Task[dict[str, Any]] | None = None


async def capabilities() -> dict[str, Any]:
    """`workbench capabilities --json`, computed once per process in a child process."""
    global _capabilities, _probe
    if _capabilities is not None:
        return _capabilities
    loop = asyncio.get_running_loop()
    if _probe is None or _probe.get_loop() is not loop:
        _probe = loop.create_task(_probe_capabilities())  # concurrent first requests share one probe
    task = _probe
    try:
        # shield: a client that goes away does not cancel the probe the others wait for
        _capabilities = await asyncio.shield(task)
    except BaseException:
        if _probe is task and task.done():
            _probe = None  # a failed probe is retried by the next request, not cached
        raise
    return _capabilities


async def _probe_capabilities() -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workbench.cli",
        "capabilities",
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        # `-m` puts the working directory first on sys.path: run from the folder holding this very
        # `workbench` package, so a `workbench/` folder among the user's notebooks is never imported.
        cwd=_PACKAGE_PARENT,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CAPABILITIES_TIMEOUT_S)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise SourceError(504, f"the device probe took over {CAPABILITIES_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        raise SourceError(500, f"the device probe failed (exit {proc.returncode}): {tail[0]}")
    try:
        report: dict[str, Any] = json.loads(out)
    except json.JSONDecodeError as exc:
        raise SourceError(500, f"the device probe printed no JSON report ({exc})") from None
    return report


# --- runs ----------------------------------------------------------------------------


def list_runs(limit: int) -> dict[str, Any]:
    """The newest stored trials (summaries, newest first) from the user's default run store.

    Blocking (SQLite): call it in a thread. An absent store is an empty list with a note
    saying why, not an error — a fresh install has run nothing yet.
    """
    try:
        from workbench.store import Store, StoreError, default_store_path, shown_store, store_exists
    except ImportError as exc:
        return {"runs": [], "store": None, "note": f"the run store is not part of this installation ({exc})"}
    path = default_store_path()
    if path is None:
        return {"runs": [], "store": None, "note": "the run store is switched off (WORKBENCH_STORE=off)"}
    if not store_exists(path):
        return {
            "runs": [],
            "store": shown_store(path),
            "note": "no runs saved yet: `workbench run` and `compare` save here",
        }
    try:
        with Store(path, create=False) as store:
            rows = store.history(limit=limit)
    except StoreError as exc:
        raise SourceError(500, f"cannot read the run store: {exc}") from None
    return {"runs": [row.to_dict() for row in rows], "store": shown_store(path), "note": ""}


# --- watched jobs --------------------------------------------------------------------


def list_watched(limit: int) -> dict[str, Any]:
    """The newest watched runs (a user's own jobs, from any process: terminal, torchrun, notebook)
    with their state and newest step, from the default run store; the side panel polls this.

    The transport is the run history itself: the job's writer thread commits a step row
    about once a second to the SQLite file (WAL: readers never block it), and this reads the
    newest rows. No socket from the job to the server, so a dead server costs the job nothing.
    """
    from workbench.store import Store, StoreError, default_store_path, shown_store, store_exists
    from workbench.store.watch_profiles import newest_profiles
    from workbench.store.watched import last_steps, watched_runs
    from workbench.watch.job import job_of, job_steps

    path = default_store_path()
    if path is None:
        return {"jobs": [], "store": None, "note": "the run history is switched off (WORKBENCH_STORE=off)"}
    if not store_exists(path):
        return {
            "jobs": [],
            "store": shown_store(path),
            "note": "no watched job yet: wrap a training loop in wb.watch(...)",
        }
    try:
        with Store(path, create=False) as store:
            runs = watched_runs(store, limit=limit)
            newest = last_steps(store, [r.run_id for r in runs])
            windows = newest_profiles(store, [r.run_id for r in runs])
            launches = {}
            for job in {r.job for r in runs if r.job}:
                ranks = watched_runs(store, job=job, limit=None)
                launches[job] = _launch(job_of(ranks, job_steps(store, ranks)))
    except StoreError as exc:
        raise SourceError(500, f"cannot read the run store: {exc}") from None
    jobs = []
    for run in runs:
        step = newest.get(run.run_id)
        jobs.append({
            "run_id": run.run_id, "name": run.name, "status": run.status, "message": run.message,
            "rank": run.rank, "world_size": run.world_size, "job": run.job, "host": run.host,
            "started_at": run.started_at, "heartbeat_at": run.heartbeat_at, "last_step": run.last_step,
            "steady_median_ms": run.summary.get("steady_median_ms"),
            "first_nonfinite_loss_step": run.summary.get("first_nonfinite_loss_step"),
            "step": None if step is None else {"step": step.first_step, "wall_time": step.wall_time,
                                               "step_ms": step.step_ms, "data_ms": step.data_ms,
                                               "peak_memory_bytes": step.peak_memory_bytes, "loss": step.loss},
            "profile": _window(windows[run.run_id]) if run.run_id in windows else None,
            "launch": launches.get(run.job) if run.job else None,
        })  # fmt: skip
    return _finite({"jobs": jobs, "store": shown_store(path), "note": ""})


def _launch(job: Any) -> dict[str, Any]:
    """A torchrun job as one: its state, the rank that failed first, and the straggler line (who, why)."""
    first = job.first_failed
    return {
        "status": job.status,
        "first_failed_rank": first.rank if first is not None else None,
        "straggler": job.straggler,
        "pace": job.pace(),
    }


def _window(window: Any) -> dict[str, Any]:
    """The newest profiled window of a job: its state and, when done, the primary finding and first fix."""
    findings = (window.diagnosis or {}).get("findings") or []
    top = findings[0] if findings else {}
    fixes = top.get("recommendations") or [{}]
    return {"id": window.id, "status": window.status, "first_step": window.first_step, "last_step": window.last_step,
            "message": window.message, "finding": top.get("title"), "summary": top.get("summary"),
            "fix": fixes[0].get("title")}  # fmt: skip


def request_watch_profile(run_id: int, steps: int) -> dict[str, Any]:
    """Ask the running watched job of run `run_id` to profile its next `steps` steps (the panel's button)."""
    from workbench.store import Store, StoreError, default_store_path, store_exists
    from workbench.store.watch_profiles import check_steps, request_profile
    from workbench.store.watched import watched_run

    try:
        check_steps(steps)
    except ValueError as exc:
        raise SourceError(400, str(exc)) from None
    path = default_store_path()
    if path is None or not store_exists(path):
        raise SourceError(404, "no run history: there is no watched job to profile")
    try:
        with Store(path, create=False) as store:
            try:
                run = watched_run(store, run_id)
            except KeyError as exc:
                raise SourceError(404, str(exc.args[0])) from None
            if run.status != "running":
                raise SourceError(409, f"watched run {run_id} is {run.status}: only a running job can be profiled")
            return {"request": request_profile(store, run_id, steps), "run_id": run_id, "steps": steps}
    except StoreError as exc:
        raise SourceError(500, f"cannot write the run store: {exc}") from None


def _finite(value: Any) -> Any:
    """NaN and infinities as null: the reply is strict JSON (a diverged job's loss is NaN)."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


# --- notebook templates --------------------------------------------------------------


def notebook_template(name: str) -> dict[str, Any]:
    """A packaged notebook by template name, outputs cleared, as `{"name", "content"}`.

    Outputs, execution counts and saved widget state are dropped: they were produced on
    someone else's machine, and a fresh copy should show only what this one measures.
    """
    file_name = TEMPLATES.get(name)
    if file_name is None:
        raise SourceError(404, f"no notebook template {name!r}; known: {', '.join(sorted(TEMPLATES))}")
    path = _template_path(file_name)
    if path is None:
        raise SourceError(404, f"{file_name} is not installed with the workbench package (reinstall it)")
    notebook: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    notebook.get("metadata", {}).pop("widgets", None)
    return {"name": file_name, "content": notebook}


def _template_path(file_name: str) -> Path | None:
    from jupyter_core.paths import jupyter_path

    candidates = [Path(folder) / file_name for folder in jupyter_path(*DATA_SUBDIR)]
    if (_CHECKOUT / "pyproject.toml").is_file():
        candidates.insert(0, _CHECKOUT / "notebooks" / file_name)
    return next((path for path in candidates if path.is_file()), None)
