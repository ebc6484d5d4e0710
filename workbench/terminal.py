"""Text rendering of results for the terminal. Formatting only: every figure comes from analysis."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from workbench.textfmt import format_bytes, format_ms, table

if TYPE_CHECKING:
    from workbench.analysis.compare import CandidateComparison, Comparison
    from workbench.api import ComparisonRun
    from workbench.measure.result import TrialResult


def run_summary(result: TrialResult, verbose: bool = False) -> str:
    """The terminal summary; a failure in the user's code shows their file:line and message
    (the whole traceback when `verbose`)."""
    from workbench.usererror import brief_error

    preset = f" [{result.preset}]" if result.preset else ""
    lines = [f"{result.workload}{preset} on {result.device.get('name', '?')} — status {result.status}"]
    if not result.ok:
        lines.append(brief_error(result.message, verbose))
        return "\n".join(lines)
    phases = ", ".join(f"{k} {v:.1f}" for k, v in result.phase_medians_ms().items())
    lines += [
        f"median step     {format_ms(result.median_step_ms)} ms  (IQR {format_ms(result.iqr_step_ms)} ms, {len(result.step_ms)} steps)",
        f"throughput      {result.throughput:.1f} samples/s" if result.throughput else "throughput      n/a",
        f"phases (median) {phases} ms",
        f"first step      {result.time_to_first_step_s or 0:.2f} s  (compile/capture {result.compile_time_s:.2f} s"
        + (f", {result.compile_cache} compile cache)" if result.compile_cache else ")"),
        f"peak memory     {format_bytes(result.peak_memory_bytes)}  [{result.memory_method}]",
        f"loss            {result.losses[0]:.4f} -> {result.losses[-1]:.4f}"
        if result.losses
        else "loss            n/a",
    ]
    lines += compile_lines(result.compile_report)
    lines += compiled_kernel_lines(
        (result.profile or {}).get("compiled"), (result.profile or {}).get("launches_per_step")
    )
    lines += utilization_lines(result)
    if result.applied:
        lines.append(
            "applied         " + "; ".join(f"{a['toggle']}={a['value']}: {a['detail']}" for a in result.applied)
        )
    return "\n".join(lines)


def compile_lines(report: dict[str, Any] | None, sites: int = 3) -> list[str]:
    """The compile report in a few lines: counts and stage times, then the first break and
    recompile sites with their file:line (the diagnosis says what to do about them)."""
    if not report:
        return []
    if not report.get("available"):
        return [f"compile         report {report.get('note') or 'not available'}"]
    breaks, recompiles = report.get("breaks") or [], report.get("recompiles") or []
    stages = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in (report.get("stages_s") or {}).items())
    lines = [
        f"compile         {report.get('graphs', 0)} graph(s), {len(breaks)} graph break(s), "
        f"{len(recompiles)} recompile(s)" + (f"; {stages}" if stages else "")
    ]
    for brk in breaks[:sites]:
        code = f" `{brk['code']}`" if brk.get("code") else ""
        lines.append(f"  break at {brk['where']}{code}: {brk['reason']} [{brk['reason_class']}]")
    for event in recompiles[:sites]:
        lines.append(f"  recompile of {event['function']} ({event['where']}): {event['words']}")
    if report.get("note"):
        lines.append(f"  note: {report['note']}")
    return lines


def compiled_kernel_lines(compiled: dict[str, Any] | None, launches: float | None, top: int = 5) -> list[str]:
    """What the compiler made of a profiled step: launches against eager, the heaviest generated
    kernels with the ops each fused, and the extern calls (matmul/conv libraries)."""
    if not compiled:
        return []
    eager = compiled.get("eager_launches_per_step")
    versus = f" (eager: {eager:g})" if eager is not None else f" (eager: n/a, {compiled.get('eager_note') or '?'})"
    count = f"{launches:g}" if launches is not None else "n/a"
    fused = compiled.get("fused") or []
    share = compiled.get("fused_share")
    lines = [
        f"kernels         {count} launches per step{versus}; {len(fused)} generated kernel(s)"
        + (f", {share:.0%} of op time" if share is not None else "")
    ]
    for row in fused[:top]:
        lines.append(f"  {row['name']}: {row['ms_per_step']:.3f} ms/step, fuses {' + '.join(row['ops'])}")
    extern = ", ".join(f"{row['name']} x{row['calls_per_step']:g}" for row in compiled.get("extern") or [])
    if extern:
        lines.append(f"  extern (library) calls: {extern}")
    if compiled.get("note"):
        lines.append(f"  note: {compiled['note']}")
    return lines


def comparison_table(outcome: ComparisonRun) -> str:
    comp = outcome.comparison
    base = comp.baseline
    rows = [[f"baseline: {base.label}", format_ms(base.median_step_ms), format_ms(base.iqr_step_ms), "1.00x", "",
             format_bytes(base.peak_memory_bytes), "", "", base.status]]  # fmt: skip
    for index, row in enumerate([*comp.candidates, *comp.bounds]):
        s = row.summary
        ci = f"[{row.speedup_ci[0]:.2f}, {row.speedup_ci[1]:.2f}]" if row.speedup_ci else ""
        numerics = {True: "ok", False: "MISMATCH", None: "n/a"}[row.numerics_ok]
        loss = f"{row.final_loss_delta:+.4f}" if row.final_loss_delta is not None else "n/a"
        label = s.label
        if index >= len(comp.candidates):  # the ideal loader cycles a few batches: other data by design
            label, numerics, loss = "ideal loader (staged batches)", "n/a", "n/a"
        status = s.status if s.status == "ok" else f"{s.status}: {s.message.splitlines()[0][:60]}"
        rows.append([
            label,
            format_ms(s.median_step_ms),
            format_ms(s.iqr_step_ms),
            f"{row.speedup:.2f}x" if row.speedup else "n/a",
            ci,
            f"{format_bytes(s.peak_memory_bytes)} ({_signed_bytes(row.peak_memory_delta_bytes)})",
            loss,
            numerics,
            verdict_text(row) + rank_mark(comp, index) if s.status == "ok" else status,
        ])  # fmt: skip
    headers = ["config", "median ms", "IQR ms", "speedup", f"{comp.confidence:.0%} CI", "peak memory (Δ)",
               "final-loss Δ", "numerics", "verdict"]  # fmt: skip
    add_utilization_columns(headers, rows, comp)
    add_layout_columns(headers, rows, comp)
    bound = getattr(outcome, "loader_bound", None)  # a comparison rebuilt from stored rows has none
    notes = [f"Ideal loader (batches staged on the device): {bound.sentence()}"] if bound is not None else []
    return table(headers, rows) + "\n" + "\n".join([*notes, *protocol_notes(comp), *compiled_candidate_lines(outcome)])


def compiled_candidate_lines(outcome: ComparisonRun) -> list[str]:
    """One line per compiled candidate: its compile report's counts and first break, and the compile's
    break-even — why a compiled configuration is (not) faster starts there (`workbench diagnose` says more)."""
    lines = []
    runs_of = getattr(outcome, "candidate_runs", None) or []  # a comparison rebuilt from stored rows has none
    for runs, row in zip(runs_of, outcome.comparison.candidates, strict=False):
        report = runs[0].compile_report if runs else None
        if not report:
            continue
        counts = compile_lines(report, sites=1)
        paid = "never" if row.break_even_steps is None else f"after {row.break_even_steps:,.0f} steps"
        detail = "; ".join(line.strip() for line in counts[1:])
        lines.append(
            f"compile report, {row.summary.label}: {counts[0].removeprefix('compile').strip()}; compile pays back "
            f"{paid}" + (f" ({detail})" if detail else "")
        )
    return lines


def verdict_text(row: CandidateComparison) -> str:
    """The verdict, with what an inconclusive one needs and the rounds a change in the host's load
    cost it: the CLI and the app print the same words."""
    if row.verdict_note:  # withheld: the host's load changed too often to trust the other rounds
        return f"inconclusive: {row.verdict_note}"
    text = _inconclusive_text(row) if row.verdict == "inconclusive" else row.verdict
    if row.load_changed_rounds and row.verdict != "failed":
        count = len(row.load_changed_rounds)
        text += f" ({count} round{'s' if count > 1 else ''} set aside: the host's load changed)"
    if row.interval_confidence is not None and row.verdict != "failed":
        text += f" ({row.interval_confidence:.0%} interval: the host was busy)"
    return text


def _inconclusive_text(row: CandidateComparison) -> str:
    """An inconclusive verdict with what it needs: the half-width reached and the rounds still needed."""
    more = f" — {row.rounds_needed} more rounds needed" if row.rounds_needed else ""
    width = f" at ±{row.half_width:.1%}" if row.half_width is not None else ""
    return f"inconclusive{width}{more}"


def rank_mark(comp: Comparison, index: int) -> str:
    """' — best' for the winner, ' — tied for best' for a candidate the winner does not beat."""
    if index == comp.winner:
        return " — best"
    return " — tied for best" if index in comp.tied else ""


def protocol_notes(comp: Comparison) -> list[str]:
    """How the verdicts were reached and how noisy it was (one line each)."""
    workers = "one worker" if comp.paired_workers <= 1 else f"{comp.paired_workers} workers in rotation"
    design = {
        "paired": f"paired rounds in {workers} (blocks of steps, order alternating)",
        "processes": "one fresh worker process per unit, order alternating",
    }.get(comp.design, comp.design)
    target = f", target ±{comp.precision:.1%}" if comp.precision else ""
    lines = [f"{comp.rounds} round(s): {design}{target}; {comp.stop_reason or 'done'}."]
    noise = comp.noise
    parts = []
    if noise.within_unit_cv is not None:
        parts.append(f"step-to-step {noise.within_unit_cv:.1%}")
    if noise.between_unit_sd is not None:
        parts.append(f"round-to-round {noise.between_unit_sd:.1%}")
    if noise.between_workers is not None:
        parts.append(f"worker-to-worker {noise.between_workers:.1%}")
    if noise.baseline_drift is not None:
        parts.append(f"baseline drift {noise.baseline_drift:.1%}")
    if noise.host_other_cores is not None:
        parts.append(f"other processes {noise.host_other_cores:.1f} cores")
    if noise.usual_load_cores is not None:
        parts.append(f"{noise.usual_load_cores:.1f} in a usual round")
    if parts:
        lines.append("noise: " + ", ".join(parts) + ".")
    lines += [f"warning: {text}" for text in noise.warnings]
    lines.append("speedup = baseline time ÷ candidate time, the paired rounds' Hodges–Lehmann centre (geometric "
                 "mean over trials when unpaired); 'inconclusive' = too few rounds for the noise: raise --budget or loosen --precision.")  # fmt: skip
    return lines


def _signed_bytes(value: int | None) -> str:
    if value is None:
        return "n/a"
    return ("+" if value >= 0 else "") + format_bytes(value)


def utilization_lines(result: TrialResult) -> list[str]:
    """The timed window's utilization and energy: what the trial used of its device, and who else was busy."""
    util = result.utilization or {}
    lines = []
    cpu = util.get("cpu")
    if cpu:
        spread = cpu.get("cores_used_spread")
        p = f", p10-p90 {spread['p10']:.2f}-{spread['p90']:.2f}" if spread and cpu.get("samples", 0) >= 3 else ""
        lines.append(
            f"CPU (window)    trial {cpu['cores_used']:.2f} of {cpu['cores_available']} cores ({cpu['util_pct']:.0f}%{p}); "
            f"host {cpu['host_pct']:.0f}% busy, other processes {cpu['other_cores']:.2f} cores"
        )
    gpu = util.get("gpu")
    if gpu:
        parts = [f"{name} {_spread_text(gpu.get(key), fmt)}" for key, name, fmt in _GPU_FIGURES if gpu.get(key)]
        lines.append(f"GPU {gpu['nvml_index']} (window) " + ", ".join(parts))
    energy = result.energy
    if energy and energy.get("available"):
        per_sample = energy.get("per_sample_j")
        lines.append(
            f"energy          {energy['per_step_j']:.3g} J/step"
            + (f", {per_sample:.3g} J/sample" if per_sample is not None else "")
            + f" ({energy['mean_power_w']:.0f} W mean over the window)"
        )
    elif energy:
        lines.append(f"energy          n/a: {energy.get('reason', '')}")
    return lines


_GPU_FIGURES: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("util_pct", "util", lambda v: f"{v:.0f}%"),
    ("mem_util_pct", "mem-bandwidth util", lambda v: f"{v:.0f}%"),
    ("sm_clock_mhz", "SM clock", lambda v: f"{v:.0f} MHz"),
    ("mem_used_bytes", "memory used", lambda v: format_bytes(int(v))),
)


def _spread_text(figures: dict[str, float] | None, fmt: Callable[[float], str]) -> str:
    if not figures:
        return "n/a"
    return f"{fmt(figures['median'])} (p10-p90 {fmt(figures['p10'])}-{fmt(figures['p90'])})"


def add_utilization_columns(headers: list[str], rows: list[list[str]], comp: Comparison) -> None:
    """Append the utilization and energy columns: `rows[0]` is the baseline's, then one per candidate
    (and per bound after them, as `comparison_table` lists them)."""
    headers += ["utilization (Δ)", "energy/step (Δ)"]
    rows[0] += [utilization_cell(comp.baseline.utilization), energy_cell(comp.baseline.utilization)]
    for row, cand in zip(rows[1:], [*comp.candidates, *comp.bounds]):
        row += [
            utilization_cell(cand.summary.utilization, cand.utilization_delta),
            energy_cell(cand.summary.utilization, cand.utilization_delta),
        ]


def add_layout_columns(headers: list[str], rows: list[list[str]], comp: Comparison) -> None:
    """Parameters per rank and collectives per step, when a distributed configuration is compared."""
    summaries = [comp.baseline, *(cand.summary for cand in comp.candidates)]
    if not any(s.layout for s in summaries):
        return
    headers += ["params/rank", "collectives/step (count × bytes)"]
    for row, summary in zip(rows, summaries):
        layout = summary.layout or {}
        held = layout.get("parameter_bytes_per_rank")
        row += [
            format_bytes(held) if held is not None else "whole",
            collectives_text(layout.get("collectives")),
        ]


COLLECTIVE_SHORT = {"all_gather": "AG", "reduce_scatter": "RS", "all_reduce": "AR", "broadcast": "BC"}


def collectives_text(collectives: dict[str, dict[str, int]] | None) -> str:
    """'AG 15 × 3.1 MiB, RS 12 × 2.0 MiB': each collective's count and total bytes in one step."""
    if not collectives:
        return "n/a"
    return ", ".join(
        f"{COLLECTIVE_SHORT.get(kind, kind)} {entry['count']} × {format_bytes(entry['bytes'])}"
        for kind, entry in sorted(collectives.items())
    )


def utilization_cell(util: dict[str, Any] | None, delta: dict[str, Any] | None = None) -> str:
    """'GPU 92% (+35), mem-bw 40% (+5)' on a GPU; '0.97 of 2 cores (+0.10), host 98%' on a CPU."""
    if not util:
        return "n/a"
    delta = delta or {}
    if util.get("gpu_util_pct") is not None:
        text = f"GPU {util['gpu_util_pct']:.0f}%{_signed(delta.get('gpu_util_pct'), '{:+.0f}')}"
        if util.get("gpu_mem_util_pct") is not None:
            text += f", mem-bw {util['gpu_mem_util_pct']:.0f}%{_signed(delta.get('gpu_mem_util_pct'), '{:+.0f}')}"
        return text
    if util.get("cpu_cores_used") is None:
        return "n/a"
    cores = util.get("cpu_cores_available")
    of = f" of {cores:.0f}" if cores else ""
    host = f", host {util['host_pct']:.0f}%" if util.get("host_pct") is not None else ""
    return f"{util['cpu_cores_used']:.2f}{of} cores{_signed(delta.get('cpu_cores_used'), '{:+.2f}')}{host}"


def energy_cell(util: dict[str, Any] | None, delta: dict[str, Any] | None = None) -> str:
    if not util or util.get("energy_per_step_j") is None:
        return "n/a"
    return f"{util['energy_per_step_j']:.3g} J{_signed((delta or {}).get('energy_per_step_j'), '{:+.3g}')}"


def _signed(value: float | None, fmt: str) -> str:
    return "" if value is None else f" ({fmt.format(value)})"
