"""A/B diff of two profiled windows: which operators (and CUDA kernels) account for the step-time change.

HTA's `trace_diff` compares call graphs; this ranks per-op self time by its contribution to the
*measured* step-time difference (the timed windows' medians) and says how much of that difference
the listed rows explain. Profiled times are inflated by the profiler, so a row's delta is evidence
of where the time moved, and `explained_share` can pass 1.0 when the profiler slowed one side more.
Ops that appeared (a fused kernel, a recompute, a cast) or disappeared, and dtype changes, are named.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.measure.compiled_kernels import generated_kernel
from workbench.measure.result import TrialResult


class TraceDiffError(ValueError):
    """Two trials that cannot be diffed; the message says why and how to fix it."""


@dataclass
class DiffRow:
    name: str
    baseline_ms: float
    """Self time per profiled step in the baseline (device time on CUDA); 0 when absent there."""
    candidate_ms: float
    delta_ms: float
    """candidate_ms - baseline_ms: positive where the candidate spends more."""
    baseline_calls: float
    candidate_calls: float
    baseline_dtypes: list[str]
    candidate_dtypes: list[str]
    change: str
    """'appeared', 'disappeared', 'dtype float32 -> bfloat16', or '' (same op, same dtypes)."""
    share: float | None
    """delta_ms ÷ the measured step-time difference (None when that difference is ~0)."""


@dataclass
class TraceDiff:
    baseline: str
    candidate: str
    measured_delta_ms: float | None
    """Candidate median step − baseline median step, from the timed windows (not the profiler)."""
    profiled_delta_ms: float
    """The same difference as the profiled ops see it: sum of every op's delta."""
    rows: list[DiffRow] = field(default_factory=list)
    kernel_rows: list[DiffRow] = field(default_factory=list)
    """CUDA only: the same diff over device kernels."""
    explained_share: float | None = None
    """The fraction of measured_delta_ms that the listed rows account for."""
    profiled_share: float | None = None
    """The fraction of profiled_delta_ms they account for: the profiler slows both sides unevenly, so
    explained_share can pass 1.0 where this one stays a plain share."""
    launches: dict[str, float | None] = field(default_factory=dict)
    """Ops, launches (leaf ops on CPU) and on CUDA kernels per step, baseline and candidate."""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def diff_trials(baseline: TrialResult, candidate: TrialResult, *, top: int = 15) -> TraceDiff:
    """Diff the profiled windows of two trials of the same workload; TraceDiffError if they cannot be."""
    _check_diffable(baseline, candidate)
    base_profile, cand_profile = baseline.profile or {}, candidate.profile or {}
    rows = diff_tables(base_profile["op_table"], cand_profile["op_table"])
    measured = _measured_delta(baseline, candidate)
    listed = sorted(rows, key=lambda r: _contribution(r, measured), reverse=True)[:top]
    for row in rows:
        row.share = row.delta_ms / measured if measured else None
    kernels = diff_tables(base_profile.get("kernel_table") or [], cand_profile.get("kernel_table") or [])
    kernels = sorted(kernels, key=lambda r: _contribution(r, measured), reverse=True)[:top]
    for row in kernels:
        row.share = row.delta_ms / measured if measured else None
    result = TraceDiff(
        baseline=baseline.trial_id,
        candidate=candidate.trial_id,
        measured_delta_ms=measured,
        profiled_delta_ms=sum(r.delta_ms for r in rows),
        rows=listed,
        kernel_rows=kernels,
        explained_share=sum(r.delta_ms for r in listed) / measured if measured else None,
        profiled_share=_share(sum(r.delta_ms for r in listed), sum(r.delta_ms for r in rows)),
        launches=_launches(base_profile, cand_profile),
    )
    if measured is None:
        result.notes.append("no measured step-time difference (a median is missing or they are equal): shares omitted")
    if baseline.device.get("type") != candidate.device.get("type"):
        result.notes.append("the trials ran on different device types: op names and times are not like for like")
    return result


def diff_tables(baseline: list[dict[str, Any]], candidate: list[dict[str, Any]]) -> list[DiffRow]:
    """Join two op tables (`measure.op_table`) by name; every op of either side gets a row."""
    base = {row["name"]: row for row in baseline}
    cand = {row["name"]: row for row in candidate}
    rows = []
    for name in list(base) + [n for n in cand if n not in base]:
        b, c = base.get(name), cand.get(name)
        b_ms = float(b["ms_per_step"]) if b else 0.0
        c_ms = float(c["ms_per_step"]) if c else 0.0
        rows.append(
            DiffRow(
                name=name,
                baseline_ms=b_ms,
                candidate_ms=c_ms,
                delta_ms=c_ms - b_ms,
                baseline_calls=float(b["calls_per_step"]) if b else 0.0,
                candidate_calls=float(c["calls_per_step"]) if c else 0.0,
                baseline_dtypes=list(b.get("dtypes", [])) if b else [],
                candidate_dtypes=list(c.get("dtypes", [])) if c else [],
                change=_change(b, c),
                share=None,
            )
        )
    return rows


def _change(base: dict[str, Any] | None, cand: dict[str, Any] | None) -> str:
    if base is None or cand is None:
        row = base if cand is None else cand
        generated = generated_kernel(str(row["name"])) if row else None
        fused = f" (fused: {'+'.join(generated[1])})" if generated else ""
        return ("appeared" if base is None else "disappeared") + fused
    b_types, c_types = list(base.get("dtypes", [])), list(cand.get("dtypes", []))
    if b_types != c_types and b_types and c_types:
        return f"dtype {'/'.join(b_types)} -> {'/'.join(c_types)}"
    return ""


def _share(part: float, whole: float) -> float | None:
    return part / whole if abs(whole) > 1e-9 else None


def _contribution(row: DiffRow, measured: float | None) -> float:
    """How much a row pushes in the direction of the measured change (the size of its delta if none)."""
    if not measured:
        return abs(row.delta_ms)
    return row.delta_ms if measured > 0 else -row.delta_ms


def _measured_delta(baseline: TrialResult, candidate: TrialResult) -> float | None:
    b, c = baseline.median_step_ms, candidate.median_step_ms
    if b is None or c is None or c == b:
        return None
    return c - b


def _launches(base: dict[str, Any], cand: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {
        "baseline_ops_per_step": base.get("ops_per_step"),
        "candidate_ops_per_step": cand.get("ops_per_step"),
    }
    for side, profile in (("baseline", base), ("candidate", cand)):
        if profile.get("launches_per_step") is not None:
            out[f"{side}_launches_per_step"] = profile["launches_per_step"]
        kernels = (profile.get("overhead") or {}).get("kernels_per_step")
        if kernels is not None:
            out[f"{side}_kernels_per_step"] = kernels
    return out


def _check_diffable(baseline: TrialResult, candidate: TrialResult) -> None:
    for role, trial in (("baseline", baseline), ("candidate", candidate)):
        if trial.profile is None:
            raise TraceDiffError(
                f"the {role} (trial {trial.trial_id}) has no profiled window: rerun it with "
                "`workbench run --profile ...` (Python: run_trial(..., profile=True)) and diff that run"
            )
        if not trial.profile.get("op_table"):
            raise TraceDiffError(
                f"the {role} (trial {trial.trial_id}) was profiled before per-op tables were recorded: "
                "rerun it with `workbench run --profile ...` and diff that run"
            )
    if (baseline.workload, baseline.preset) != (candidate.workload, candidate.preset):
        raise TraceDiffError(
            f"the runs are of different workloads ({_workload(baseline)} vs {_workload(candidate)}): a diff compares "
            "two configurations of one workload; pick two runs from `workbench history --workload NAME`"
        )


def _workload(trial: TrialResult) -> str:
    return f"{trial.workload} [{trial.preset}]" if trial.preset else trial.workload


def format_diff(diff: TraceDiff, *, max_name: int = 48) -> str:
    """The diff as a table for the terminal."""
    from workbench.textfmt import table

    head = f"baseline {diff.baseline} -> candidate {diff.candidate}: measured step-time change "
    head += f"{diff.measured_delta_ms:+.1f} ms" if diff.measured_delta_ms is not None else "n/a"
    head += f", profiled ops {diff.profiled_delta_ms:+.1f} ms/step"
    lines = [head]
    launches = diff.launches
    if (
        launches.get("baseline_launches_per_step") is not None
        and launches.get("candidate_launches_per_step") is not None
    ):
        lines.append(
            f"launches per step (leaf ops on CPU, kernels on CUDA): {launches['baseline_launches_per_step']:g} -> "
            f"{launches['candidate_launches_per_step']:g}"
        )
    for title, rows in (("ops", diff.rows), ("CUDA kernels", diff.kernel_rows)):
        if not rows:
            continue
        body = [
            [_clip(r.name, max_name), f"{r.baseline_ms:.2f}", f"{r.candidate_ms:.2f}", f"{r.delta_ms:+.2f}",
             f"{r.share:.0%}" if r.share is not None else "-", f"{r.baseline_calls:g} -> {r.candidate_calls:g}",
             r.change]
            for r in rows
        ]  # fmt: skip
        lines += ["", f"{title} by contribution to the change (ms per profiled step):"]
        lines.append(table([title[:-1] if title == "ops" else "kernel", "baseline", "candidate", "delta", "share",
                            "calls", "change"], body))  # fmt: skip
    if diff.explained_share is not None:
        of_profiled = f" ({diff.profiled_share:.0%} of the profiled one)" if diff.profiled_share is not None else ""
        lines.append(f"\nthe listed ops account for {diff.explained_share:.0%} of the measured change{of_profiled}")
    lines += [f"note: {note}" for note in diff.notes]
    return "\n".join(lines)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
