"""The compile report of a compiled trial: graphs, graph breaks, recompiles and compile time by stage.

Read in the trial's own process from dynamo's records, not from log text: the per-frame-compile
records of `torch._dynamo.utils.get_compilation_metrics()` (graphs, failed guards, stage times)
and the `GraphCompileReason`s dynamo keeps for every break (`torch._dynamo.utils.graph_break_reasons`,
the list `torch._dynamo.explain` reads; each with the user's stack). Both are private PyTorch APIs:
each is feature-detected, and a torch without one gets a report that says what is not available
on it, never an error. A break's place is the innermost frame outside torch itself (the user's or
the workload's code, e.g. a transformers model's line).
"""

from __future__ import annotations

import os
import re
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.measure.compile_words import BREAK_CLASSES, break_words, guard_words

_RESUME = re.compile(r"torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")


@dataclass
class CompileReport:
    """What dynamo did in one trial; plain data (stored on `TrialResult.compile_report` as a dict)."""

    available: bool
    torch_version: str
    note: str = ""
    """What could not be read on this torch, in words ('' when everything was)."""
    frames: int = 0
    """Python frames dynamo compiled (a resumed frame after a break and every recompile count)."""
    graphs: int = 0
    """Graphs captured: frames whose first compile produced a graph with operations (a recompile
    captures one of them again; `torch._dynamo.explain`'s graph_count counts the same)."""
    breaks: list[dict[str, Any]] = field(default_factory=list)
    """One per break site: reason (PyTorch's type), explanation, hints, url, registry_id,
    reason_class, where ('file:line' in the user's code), function, code (that line)."""
    recompiles: list[dict[str, Any]] = field(default_factory=list)
    """One per recompile: words (the failed guard), kind, fix, guard (dynamo's text), where, function,
    started_at (time.time() seconds: inside the timed window, it inflated a step time)."""
    stages_s: dict[str, float] = field(default_factory=dict)
    """Compile seconds by stage, where the records have them: dynamo (tracing), aot_autograd,
    inductor, backward (compiled at the first backward), total."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class CompileWatch:
    """Marks where a trial's compile starts; `report()` reads what dynamo recorded since."""

    def __init__(self) -> None:
        import torch

        self.torch_version = torch.__version__.split("+")[0]
        self.started_us = time.time() * 1e6
        reasons = _break_reasons()
        self.breaks_before = len(reasons) if reasons is not None else 0

    def report(self) -> CompileReport:
        """Never raises: a record this code does not understand is said in the note instead."""
        try:
            return self._read()
        except Exception as exc:  # private records change between torch releases; the trial stands
            return CompileReport(False, self.torch_version, note=f"not read on torch {self.torch_version}: {exc!r}")

    def _read(self) -> CompileReport:
        missing: list[str] = []
        records = _metrics_since(self.started_us)
        if records is None:
            missing.append("per-frame compile records (torch._dynamo.utils.get_compilation_metrics)")
            records = []
        report = CompileReport(True, self.torch_version)
        forward = [r for r in records if getattr(r, "co_name", None)]
        report.frames = len(forward)
        # A recompile ('1/1') captures a graph again: graphs count each frame's first capture ('1/0').
        first = [r for r in forward if str(getattr(r, "compile_id", None) or "0/0").endswith("/0")]
        report.graphs = sum(1 for r in first if (getattr(r, "graph_op_count", None) or 0) > 0)
        reasons = _break_reasons()
        if reasons is not None:
            report.breaks = _breaks_from_reasons(reasons[self.breaks_before :])
        elif records:
            report.breaks = _breaks_from_records(records)
            missing.append("the user's stack of each break (torch._dynamo.utils.graph_break_reasons)")
        report.recompiles = [_recompile(r) for r in forward if getattr(r, "recompile_reason", None)]
        report.stages_s = _stages(records)
        if missing:
            report.available = bool(records) or reasons is not None
            report.note = f"not available on torch {self.torch_version}: " + "; ".join(missing)
        return report


def reset_compiler() -> None:
    """Forget this process's compiled frames, as a fresh worker process would start: an inline
    trial's report (and its compile time) is then its own, not a reuse of an earlier trial's."""
    import torch._dynamo

    torch._dynamo.reset()


def _metrics_since(started_us: float) -> list[Any] | None:
    try:
        from torch._dynamo.utils import get_compilation_metrics
    except ImportError:
        return None
    records = list(get_compilation_metrics())
    # Records carry their start time (2.13: start_time_us; older: start_time in seconds).
    return [r for r in records if _start_us(r) is None or (_start_us(r) or 0) >= started_us]


def _start_us(record: Any) -> float | None:
    value = getattr(record, "start_time_us", None)
    if value is not None:
        return float(value)
    seconds = getattr(record, "start_time", None)
    return float(seconds) * 1e6 if seconds is not None else None


def _break_reasons() -> list[Any] | None:
    try:
        from torch._dynamo.utils import graph_break_reasons
    except ImportError:
        return None
    return graph_break_reasons if isinstance(graph_break_reasons, list) else None


def _stdlib_dir() -> str:
    return os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


def _torch_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def user_frame(stack: list[Any]) -> Any | None:
    """The innermost frame outside torch's own files and Python's standard library (the user's or the
    workload's code); for a break wholly inside torch (DDP's own forward, when the DDP wrapper is
    compiled), the innermost torch frame outside dynamo: a `contextlib` line would name neither."""
    internal = (_torch_dir(), _stdlib_dir())
    outside = [f for f in stack if not os.path.abspath(f.filename).startswith(internal)]
    if outside:
        return outside[-1]
    dynamo = os.path.join(internal[0], "_dynamo") + os.sep  # its polyfills stand in for the code they replace
    in_torch = [f for f in stack if os.path.abspath(f.filename).startswith(internal[0])]
    in_torch = [f for f in in_torch if not os.path.abspath(f.filename).startswith(dynamo)] or in_torch
    return in_torch[-1] if in_torch else (stack[-1] if stack else None)


def _breaks_from_reasons(reasons: list[Any]) -> list[dict[str, Any]]:
    """One entry per break site: dynamo records a break again when it re-traces the frame the
    break sits in (an inner function's own frame, a recompile), at the same innermost line."""
    seen: set[tuple[str, int, str]] = set()
    breaks: list[dict[str, Any]] = []
    for reason in reasons:
        frame = user_frame(list(getattr(reason, "user_stack", None) or []))
        words = break_words(str(getattr(reason, "reason", "")))
        filename, line = (frame.filename, frame.lineno) if frame is not None else ("?", 0)
        key = (filename, int(line or 0), words.gb_type)
        if key in seen:
            continue
        seen.add(key)
        code = (getattr(frame, "line", None) or "").strip() if frame is not None else ""
        function = frame.name if frame is not None else "?"
        breaks.append(_break_entry(words, f"{filename}:{line}", function, code))
    return breaks


def _breaks_from_records(records: list[Any]) -> list[dict[str, Any]]:
    """Older torch without the reasons list: each frame's restart reason, placed at the resumed
    frame dynamo compiled next (named `torch_dynamo_resume_in_<function>_at_<line>`)."""
    breaks: list[dict[str, Any]] = []
    for index, record in enumerate(records):
        for reason in sorted(getattr(record, "restart_reasons", None) or []):
            resume = next((r for r in records[index + 1 :] if _RESUME.match(getattr(r, "co_name", "") or "")), None)
            match = _RESUME.match(getattr(resume, "co_name", "") or "") if resume is not None else None
            filename = getattr(resume or record, "co_filename", "?")
            line = match["line"] if match else getattr(record, "co_firstlineno", 0)
            function = match["fn"] if match else getattr(record, "co_name", "?")
            breaks.append(_break_entry(break_words(str(reason)), f"{filename}:{line}", function, ""))
    return breaks


def _break_entry(words: Any, where: str, function: str, code: str) -> dict[str, Any]:
    return {
        "reason": words.gb_type,
        "explanation": words.explanation,
        "hints": words.hints,
        "url": words.url,
        "registry_id": words.registry_id,
        "reason_class": words.reason_class,
        "class_words": BREAK_CLASSES[words.reason_class],
        "where": where,
        "function": function,
        "code": code,
    }


def _recompile(record: Any) -> dict[str, Any]:
    guard = str(record.recompile_reason)
    words = guard_words(guard)
    return {
        "words": words.words,
        "kind": words.kind,
        "fix": words.fix,
        "guard": guard.strip().splitlines()[0],
        "started_at": (_start_us(record) or 0.0) / 1e6,  # time.time() seconds, as TrialResult.timed_window
        "where": f"{getattr(record, 'co_filename', '?')}:{getattr(record, 'co_firstlineno', 0)}",
        "function": getattr(record, "co_name", "?"),
    }


def _stages(records: list[Any]) -> dict[str, float]:
    """Seconds per compile stage, summed over the records that have it (fields differ by torch)."""

    def total(name: str, scale: float = 1.0, forward: bool = True) -> float | None:
        values = [getattr(r, name, None) for r in records if bool(getattr(r, "co_name", None)) == forward]
        present = [float(v) * scale for v in values if v is not None]
        return sum(present) if present else None

    frame = total("entire_frame_compile_time_s")
    backend = total("backend_compile_time_s")
    aot = total("aot_autograd_cumulative_compile_time_us", 1e-6)
    inductor = total("inductor_cumulative_compile_time_us", 1e-6)
    backward = total("backward_cumulative_compile_time_us", 1e-6, forward=False)
    stages: dict[str, float] = {}
    if frame is not None:
        stages["dynamo"] = frame - (backend or 0.0)
    if aot is not None:
        stages["aot_autograd"] = aot - (inductor or 0.0)  # AOTAutograd's time includes inductor's forward compile
    if inductor is not None:
        stages["inductor"] = inductor
    if backward is not None:
        stages["backward"] = backward
    if frame is not None:
        stages["total"] = frame + (backward or 0.0)
    return stages


def fullgraph_failure(exc: BaseException) -> str | None:
    """A trial error naming the break that `fullgraph=True` refused, with its place in the user's
    code; None when `exc` is not dynamo refusing to trace."""
    import torch._dynamo.exc as dynamo_exc

    # Unsupported: a break fullgraph refuses; UserError: a guard on a data-dependent value. A backend
    # that failed to compile is another story, told by its own traceback.
    refusals = tuple(t for t in (getattr(dynamo_exc, "Unsupported", None), getattr(dynamo_exc, "UserError", None)) if t)
    if not refusals or not isinstance(exc, refusals):
        return None
    stack = list(getattr(exc, "real_stack", None) or [])
    frame = user_frame(stack)
    where = f"{frame.filename}:{frame.lineno}" if frame is not None else "an unknown line"
    text = str(getattr(exc, "msg", None) or exc)
    words = break_words(text)
    gb_type = getattr(exc, "gb_type", None) or f"{type(exc).__name__}: {words.gb_type}"
    code = f" (`{frame.line.strip()}`)" if frame is not None and getattr(frame, "line", None) else ""
    hint = f" Hint: {words.hints[0]}" if words.hints else ""
    link = f" See {words.url}" if words.url else ""
    return (
        f"compile_fullgraph=True refused a graph break at {where}{code}: {gb_type} "
        f"[{words.reason_class}].{hint}{link} Set compile_fullgraph=False to run the break eagerly, "
        "or change that line."
    )
