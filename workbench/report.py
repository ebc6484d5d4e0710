"""Text rendering of results for the terminal. Formatting only: every figure comes from analysis."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.textfmt import format_bytes, format_ms, table

if TYPE_CHECKING:
    from workbench.api import ComparisonRun
    from workbench.measure.result import TrialResult


def run_summary(result: TrialResult) -> str:
    lines = [f"{result.workload} [{result.preset}] on {result.device.get('name', '?')} — status {result.status}"]
    if not result.ok:
        lines.append(result.message.strip())
        return "\n".join(lines)
    phases = ", ".join(f"{k} {v:.1f}" for k, v in result.phase_medians_ms().items())
    lines += [
        f"median step     {format_ms(result.median_step_ms)} ms  (IQR {format_ms(result.iqr_step_ms)} ms, {len(result.step_ms)} steps)",
        f"throughput      {result.throughput:.1f} samples/s" if result.throughput else "throughput      n/a",
        f"phases (median) {phases} ms",
        f"first step      {result.time_to_first_step_s or 0:.2f} s  (compile/capture {result.compile_time_s:.2f} s)",
        f"peak memory     {format_bytes(result.peak_memory_bytes)}  [{result.memory_method}]",
        f"loss            {result.losses[0]:.4f} -> {result.losses[-1]:.4f}"
        if result.losses
        else "loss            n/a",
    ]
    if result.applied:
        lines.append(
            "applied         " + "; ".join(f"{a['toggle']}={a['value']}: {a['detail']}" for a in result.applied)
        )
    return "\n".join(lines)


def comparison_table(outcome: ComparisonRun) -> str:
    comp = outcome.comparison
    base = comp.baseline
    rows = [[f"baseline: {base.label}", format_ms(base.median_step_ms), format_ms(base.iqr_step_ms), "1.00x", "",
             format_bytes(base.peak_memory_bytes), "", "", base.status]]  # fmt: skip
    for row in comp.candidates:
        s = row.summary
        ci = f"[{row.speedup_ci[0]:.2f}, {row.speedup_ci[1]:.2f}]" if row.speedup_ci else ""
        numerics = {True: "ok", False: "MISMATCH", None: "n/a"}[row.numerics_ok]
        status = s.status if s.status == "ok" else f"{s.status}: {s.message.splitlines()[0][:60]}"
        rows.append([
            s.label,
            format_ms(s.median_step_ms),
            format_ms(s.iqr_step_ms),
            f"{row.speedup:.2f}x" if row.speedup else "n/a",
            ci,
            f"{format_bytes(s.peak_memory_bytes)} ({_signed_bytes(row.peak_memory_delta_bytes)})",
            f"{row.final_loss_delta:+.4f}" if row.final_loss_delta is not None else "n/a",
            numerics,
            f"{row.verdict}" if s.status == "ok" else status,
        ])  # fmt: skip
    headers = ["config", "median ms", "IQR ms", "speedup", f"{comp.confidence:.0%} CI", "peak memory (Δ)",
               "final-loss Δ", "numerics", "verdict"]  # fmt: skip
    note = f"\n{comp.repeats} repeat(s), interleaved; speedup = baseline median ÷ candidate median."
    return table(headers, rows) + note


def _signed_bytes(value: int | None) -> str:
    if value is None:
        return "n/a"
    return ("+" if value >= 0 else "") + format_bytes(value)
