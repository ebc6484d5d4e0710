"""The Compile section of the Diagnosis tab: a compiled trial's graph breaks, recompiles, compile
time by stage and the kernels the compiler made, as HTML.

Drawing only: the figures are the compile report (`measure.compile_report`) and the profile's
compiled-step summary (`measure.compiled_kernels`) as the trial recorded them; what to do about
them is the diagnosis's findings, shown above this section.
"""

from __future__ import annotations

import html
from typing import Any

from workbench.measure.result import TrialResult

_CELL = "style='text-align:left;padding:0 8px'"


def compile_section_html(result: TrialResult, rows: int = 8) -> str:
    """'' for a trial that did not compile; else the section, each part only where it has data."""
    report = result.compile_report
    if not report:
        return ""
    profile = result.profile or {}
    parts = [f"<b>Compile</b> ({html.escape(_counts(report))})"]
    if report.get("note"):
        parts.append(f"<span style='color:#666'>{html.escape(report['note'])}</span>")
    if report.get("stages_s"):
        stages = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in report["stages_s"].items())
        parts.append(f"compile time by stage: {html.escape(stages)}")
    breaks = [
        [b["where"], b.get("code") or b.get("function", ""), b["reason"], b["reason_class"]]
        for b in report.get("breaks") or []
    ]
    parts.append(_table("compile-breaks", "Graph breaks", ("where", "code", "reason", "class"), breaks[:rows]))
    recompiles = [[r["function"], r["where"], r["words"], r["fix"]] for r in report.get("recompiles") or []]
    parts.append(
        _table("compile-recompiles", "Recompiles", ("function", "where", "guard that failed", "fix"), recompiles[:rows])
    )
    parts.append(_kernels_html(profile, rows))
    return "<div class='workbench-compile'>" + "<br>".join(p for p in parts if p) + "</div>"


def _counts(report: dict[str, Any]) -> str:
    return (
        f"{report.get('graphs', 0)} graph(s), {len(report.get('breaks') or [])} graph break(s), "
        f"{len(report.get('recompiles') or [])} recompile(s)"
    )


def _kernels_html(profile: dict[str, Any], rows: int) -> str:
    compiled = profile.get("compiled") or {}
    if not compiled:
        why = (
            "the profile ran no compiled graph's code (a backend that generates none, such as 'eager')"
            if profile
            else "run with profiling to see what the compiler generated"
        )
        return f"<span style='color:#666'>kernels: {why}</span>"
    launches, eager = profile.get("launches_per_step"), compiled.get("eager_launches_per_step")
    head = f"launches per step: {launches:g}" if launches is not None else "launches per step: n/a"
    head += f" (eager: {eager:g})" if eager is not None else ""
    body = [
        [k["name"], f"{k['ms_per_step']:.3f}", f"{k['calls_per_step']:g}", " + ".join(k["ops"])]
        for k in compiled.get("fused") or []
    ]
    body += [
        [k["name"], f"{k['ms_per_step']:.3f}", f"{k['calls_per_step']:g}", "extern (library call)"]
        for k in compiled.get("extern") or []
    ]
    table = _table(
        "compile-kernels", "Kernels the compiler made", ("kernel", "ms/step", "calls/step", "fuses"), body[:rows]
    )
    note = f"<br><span style='color:#666'>{html.escape(compiled['note'])}</span>" if compiled.get("note") else ""
    return html.escape(head) + "<br>" + table + note


def _table(css: str, title: str, columns: tuple[str, ...], body: list[list[Any]]) -> str:
    if not body:
        return ""
    head = "".join(f"<th {_CELL}>{html.escape(c)}</th>" for c in columns)
    cells = "".join("<tr>" + "".join(f"<td {_CELL}>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in body)
    return f"<b>{html.escape(title)}</b><table class='workbench-{css}'><tr>{head}</tr>{cells}</table>"
