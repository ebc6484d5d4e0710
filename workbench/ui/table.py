"""The comparison table: the protocol's figures as HTML rows — formatting only, no statistics.

One row per configuration: the baseline first, then each candidate with its speedup
and interval, verdict (with the rounds behind it and the winner marked), memory delta,
numerics flag, compile time, break-even steps and config diff. A trial that failed (OOM, exception, timeout, cancel) is a row that says so
with its message, so one bad candidate never hides the others.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from workbench.analysis.compare import CandidateComparison, Comparison, TrialSummary, summarize
from workbench.analysis.merge import merge_comparisons
from workbench.measure.result import TrialResult
from workbench.ui.runs import Entry

_MIB = float(2**20)
HEADERS = (
    "",
    "configuration",
    "status",
    "median step",
    "speedup [95% CI]",
    "verdict",
    "Δ peak memory",
    "numerics",
    "compile",
    "break-even",
    "changed vs baseline",
    "utilization (Δ)",
    "energy/step (Δ)",
)
_VERDICT_COLORS = {"faster": "#1b7e3c", "slower": "#b00020", "no significant difference": "#666",
                   "inconclusive": "#a36a00", "failed": "#b00020"}  # fmt: skip
_CSS = (
    "<style>.wb-table{border-collapse:collapse;font-size:12px;margin-top:4px}"
    ".wb-table th,.wb-table td{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}"
    ".wb-table th{background:#f4f4f4}.wb-table tr.failed td{background:#fdecea}"
    ".wb-swatch{display:inline-block;width:10px;height:10px;border-radius:2px}</style>"
)


def comparison_for(entries: Sequence[Entry]) -> Comparison | None:
    """The current baseline and the candidates compared against it (`merge_comparisons`); None before any."""
    baseline = next((e for e in entries if e.role == "baseline" and e.results()), None)
    if baseline is None:
        return None
    runs = [e.comparison for e in entries if e.role == "candidate" and e.baseline is baseline]
    return merge_comparisons(baseline.results(), [c for c in runs if c is not None])


def render_table(entries: Sequence[Entry], comparison: Comparison | None) -> str:
    finished = [e for e in entries if e.results()]
    if not finished:
        return "<i>No finished trials yet: run a baseline, then candidates.</i>"
    current = next((e for e in entries if e.role == "baseline" and e.results()), None)
    rows: list[str] = []
    for entry in finished:
        if entry.role == "baseline" and comparison is not None and entry is current:
            rows.append(_row(entry, comparison.baseline, None))
        elif entry.role == "candidate" and comparison is not None and entry.row in comparison.candidates:
            assert entry.row is not None
            rows.append(_row(entry, None, entry.row, _mark(comparison, comparison.candidates.index(entry.row))))
        else:  # no comparison (yet), or compared against an earlier baseline that a newer one replaced
            rows.append(_row(entry, summarize(entry.results()), None))
    note = "" if comparison is not None else "<div><i>Run a baseline and a candidate to compare them.</i></div>"
    head = "".join(f"<th>{h}</th>" for h in HEADERS)
    return f"{_CSS}{note}<table class='wb-table'><tr>{head}</tr>{''.join(rows)}</table>{_notes(comparison)}"


def _mark(comparison: Comparison, index: int) -> str:
    if index == comparison.winner:
        return " <b title='the fastest significantly faster candidate with sound numerics'>★ best</b>"
    return " <i>(tied for best)</i>" if index in comparison.tied else ""


def _notes(comparison: Comparison | None) -> str:
    """The protocol's notes (rounds, noise, warnings): the same lines the CLI prints."""
    if comparison is None:
        return ""
    from workbench.terminal import protocol_notes

    lines = protocol_notes(comparison)
    return "<div style='font-size:11px;color:#555'>" + "<br>".join(html.escape(x) for x in lines) + "</div>"


def _row(entry: Entry, summary: TrialSummary | None, cand: CandidateComparison | None, mark: str = "") -> str:
    s = cand.summary if cand is not None else summary
    assert s is not None
    failed = s.status != "ok"
    cells = [
        f"<span class='wb-swatch' style='background:{entry.color}'></span>",
        f"<b>{html.escape(_role(entry))}</b><br>{html.escape(s.label)}",
        _status(s),
        _median(s),
    ]
    if cand is None:
        cells += [
            "—",
            "—" if entry.role == "baseline" else "<i>no baseline</i>",
            "—",
            "—",
            _compile(s.compile_time_s),
            "—",
            "—",
        ]
    else:
        cells += [
            _speedup(cand),
            _verdict(cand) + mark,
            _memory_delta(cand.peak_memory_delta_bytes),
            _numerics(cand),
            _compile(s.compile_time_s),
            _break_even(cand),
            _diff(cand.config_diff),
        ]
    cells += _utilization_cells(s, cand)
    klass = " class='failed'" if failed else ""
    return f"<tr{klass}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _role(entry: Entry) -> str:
    return "baseline" if entry.role == "baseline" else f"candidate {entry.key}"


def _status(s: TrialSummary) -> str:
    if s.status == "ok":
        return "ok" + (f" ×{s.repeats}" if s.repeats > 1 else "")
    first, _, rest = s.message.strip().partition("\n")
    detail = (
        f"<details><summary>details</summary><pre style='white-space:pre-wrap;max-width:60em'>{html.escape(rest.strip())}</pre></details>"
        if rest.strip()
        else ""
    )
    return f"<b style='color:#b00020'>{html.escape(s.status)}</b>: {html.escape(first[:300])}{detail}"


def _median(s: TrialSummary) -> str:
    if s.median_step_ms is None:
        return "—"
    iqr = f" (IQR {s.iqr_step_ms:.1f})" if s.iqr_step_ms is not None else ""
    return f"{s.median_step_ms:.1f} ms{iqr}"


def _speedup(c: CandidateComparison) -> str:
    if c.speedup is None:
        return "—"
    ci = f" [{c.speedup_ci[0]:.2f}, {c.speedup_ci[1]:.2f}]" if c.speedup_ci else ""
    return f"<b>{c.speedup:.2f}×</b>{ci}"


def _verdict(cand: CandidateComparison) -> str:
    from workbench.terminal import verdict_text

    units = f"<br><small>{cand.units} rounds</small>" if cand.units else ""
    color = _VERDICT_COLORS.get(cand.verdict, "#000")
    return f"<span style='color:{color}'>{html.escape(verdict_text(cand))}</span>{units}"


def _memory_delta(delta: int | None) -> str:
    if delta is None:
        return "n/a"
    return f"{delta / _MIB:+,.1f} MiB"


def _numerics(c: CandidateComparison) -> str:
    ok = c.numerics.ok
    if ok is None:
        mark = "?"
    elif ok:
        mark = "<span style='color:#1b7e3c'>✔ ok</span>"
    else:
        mark = "<b style='color:#b00020'>✘ differs</b>"
    return f"<span title='{html.escape(c.numerics.note)}'>{mark}</span>"


def _compile(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds else "—"


def _break_even(c: CandidateComparison) -> str:
    if not c.summary.compile_time_s:
        return "—"
    return "never" if c.break_even_steps is None else f"{c.break_even_steps:,.0f} steps"


def _diff(diff: dict[str, tuple[Any, Any]]) -> str:
    if not diff:
        return "<i>same config</i>"
    return "<br>".join(
        f"<code>{html.escape(k)}</code>: {html.escape(str(a))} → {html.escape(str(b))}" for k, (a, b) in diff.items()
    )


def _utilization_cells(s: TrialSummary, cand: CandidateComparison | None) -> list[str]:
    """The timed windows' utilization and energy, with the change against the baseline: the CLI's words."""
    from workbench.terminal import energy_cell, utilization_cell

    delta = cand.utilization_delta if cand is not None else None
    reason = (s.utilization or {}).get("energy_reason", "")
    energy = f"<span title='{html.escape(reason)}'>{html.escape(energy_cell(s.utilization, delta))}</span>"
    return [html.escape(utilization_cell(s.utilization, delta)), energy]


def render_ranks(result: TrialResult | None) -> str:
    """Per-rank step times of a distributed trial (stragglers show here); empty for one process."""
    from workbench.distributed.stats import rank_rows

    rows = rank_rows(result) if result is not None else []
    if not rows:
        return ""

    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1f}"

    columns = [
        ("median step ms", "median_step_ms"),
        ("data ms", "median_data_ms"),
        ("forward ms", "median_forward_ms"),
        ("backward ms", "median_backward_ms"),
        ("optimizer ms", "median_optimizer_ms"),
        ("waits for others ms", "median_sync_wait_ms"),
        ("compute ms", "compute_ms"),
        ("exposed comm ms", "exposed_comm_ms"),
    ]
    body = "".join(
        f"<tr><td>{row['rank']}</td><td>{html.escape(str(row.get('host', '')))}</td>"
        + "".join(f"<td>{ms(row.get(key))}</td>" for _, key in columns)
        + "</tr>"
        for row in rows
    )
    head = "<tr><th>rank</th><th>host</th>" + "".join(f"<th>{name}</th>" for name, _ in columns) + "</tr>"
    return f"<b>Per rank — {html.escape(result.workload if result else '')}</b><table>{head}{body}</table>"
