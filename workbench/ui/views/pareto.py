"""`pareto`: every tuned configuration as its objective (step time, or time per sample) against peak
memory, the front and the winner.

The front is the tuner's own (`TuneResult.pareto`, on the objective's cost and peak memory) and the
winner its verification rung's: this view draws them, it decides nothing. A point's colour is its
numerics verdict against the baseline; hover shows how its configuration differs from the baseline's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.config import ConfigError, TrainConfig
from workbench.tune.objective import Objective, cost_ms
from workbench.ui.views.base import (
    FRONT_COLOR,
    HEIGHT,
    NUMERICS_COLORS,
    WIDTH,
    WINNER_COLOR,
    ViewError,
    hv,
    not_measured,
)

if TYPE_CHECKING:
    from workbench.tune import TuneResult

VDIMS = ["peak_mib", "numerics", "config", "step_ms", "status", "trial"]
_MIB = float(2**20)


def pareto(result: TuneResult | dict[str, Any]) -> Any:
    """Screened configurations of a search (a `TuneResult` or its `to_dict()`): the objective's cost
    against peak memory, coloured by numerics verdict, the Pareto front drawn, the verified winner
    starred, the baseline a diamond. A trial refused for its numerics or its memory is placed by its
    cost when the `TuneResult` still holds its measurement."""
    data = _as_dict(result)
    rows = pareto_rows(data)
    if not rows:
        return not_measured("tuned configurations", "no screened trial has both a cost and a peak memory")
    h = hv()
    layers = [
        h.Scatter([r for r in rows if r["numerics"] == verdict], "cost_ms", VDIMS, label=f"numerics {verdict}").opts(
            color=color, size=9, tools=["hover"]
        )
        for verdict, color in NUMERICS_COLORS.items()
        if any(r["numerics"] == verdict for r in rows)  # no empty legend entries
    ]
    front = sorted((r for r in rows if r["on_front"]), key=lambda r: r["cost_ms"])
    layers.insert(0, h.Curve(front, "cost_ms", VDIMS, label="Pareto front").opts(color=FRONT_COLOR, line_width=2))
    base = baseline_point(data)
    if base is not None:
        marker = h.Scatter([base], "cost_ms", VDIMS, label="baseline")
        layers.append(marker.opts(color="black", marker="diamond", size=12, tools=["hover"]))
    winner = winner_point(data, rows)
    if winner is not None:
        marker = h.Scatter([winner], "cost_ms", VDIMS, label="verified winner")
        layers.append(marker.opts(color=WINNER_COLOR, marker="star", size=20, tools=["hover"]))
    unit = (data.get("objective") or {}).get("unit", "ms per step or per sample")
    return h.Overlay(layers).opts(
        title=f"{data.get('workload', '')}: tuned configurations (objective vs peak memory)",
        width=WIDTH,
        height=HEIGHT,
        xlabel=f"objective, {unit} (compile amortized; lower is better)",
        ylabel="peak memory MiB",
        legend_position="top_right",
        padding=0.1,  # the best points sit on the axes' ends: keep them inside the frame
    )


def pareto_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per screened trial with a cost and a peak memory; `on_front` from the tuner's front."""
    front = {t["number"] for t in data.get("pareto") or []}
    base = _baseline_config(data)
    return [
        {
            "cost_ms": t["cost_ms"],
            "peak_mib": t["peak_memory_bytes"] / _MIB,
            "numerics": numerics_verdict(t["status"]),
            "config": config_diff(t["config"], base),
            "step_ms": t.get("median_step_ms"),
            "status": t["status"],
            "trial": t["number"],
            "on_front": t["number"] in front,
        }
        for t in data.get("trials") or []
        if t.get("cost_ms") is not None and t.get("peak_memory_bytes") is not None
    ]


def numerics_verdict(status: str) -> str:
    """'mismatch' when the losses left the baseline's, 'ok' when the check passed (an over-memory
    trial passed it first), 'not checked' for a trial stopped before it (pruned, failed)."""
    if status == "numerics":
        return "mismatch"
    return "ok" if status in ("ok", "over-memory") else "not checked"


def config_diff(config: dict[str, Any], baseline: TrainConfig) -> str:
    """'amp: fp32 → bf16; channels_last: False → True' (or the fields themselves when unreadable)."""
    try:
        changed = baseline.diff(TrainConfig.from_dict(config))
    except ConfigError:
        return ", ".join(f"{k}={v}" for k, v in config.items())
    return "; ".join(f"{k}: {_word(a)} → {_word(b)}" for k, (a, b) in changed.items()) or "the baseline's"


def _word(value: Any) -> str:
    return "default" if value is None else str(value)  # None: the workload's own (e.g. its batch size)


def baseline_point(data: dict[str, Any]) -> dict[str, Any] | None:
    base = data.get("baseline") or {}
    if base.get("cost_ms") is None or base.get("peak_memory_bytes") is None:
        return None
    return {
        "cost_ms": base["cost_ms"],
        "peak_mib": base["peak_memory_bytes"] / _MIB,
        "numerics": "ok",
        "config": "the baseline's",
        "step_ms": base.get("median_step_ms"),
        "status": "baseline",
        "trial": -1,
    }


def winner_point(data: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The verification rung's winner, at its screening point, its verified speedup in the hover; None
    when nothing beat the baseline significantly (or it was never screened, e.g. a recommendation)."""
    best = data.get("best") or {}
    if not best.get("winner"):
        return None
    screened = {t["number"] for t in data.get("trials") or [] if t.get("config") == best.get("config")}
    point = next((r for r in rows if r["trial"] in screened), None)
    if point is None:
        return None
    ci = best.get("speedup_ci")
    speedup = f"{best['speedup']:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
    verified = best.get("numerics_ok")
    numerics = point["numerics"] if verified is None else ("ok" if verified else "mismatch")
    return {**point, "status": f"verified winner: {speedup} ({best.get('verdict', '')})", "numerics": numerics}


def _baseline_config(data: dict[str, Any]) -> TrainConfig:
    try:
        return TrainConfig.from_dict((data.get("baseline") or {}).get("config") or {})
    except ConfigError:
        return TrainConfig()


def _as_dict(result: Any) -> dict[str, Any]:
    if isinstance(result, dict):
        if "trials" not in result:
            raise ViewError("pareto() takes a TuneResult or its to_dict(); this dict has no 'trials'")
        return result
    if hasattr(result, "to_dict") and hasattr(result, "pareto"):
        return with_refused_costs(result)
    raise ViewError(f"pareto() takes a TuneResult (wb.tune(...)) or its to_dict(), got {type(result).__name__}")


def with_refused_costs(result: TuneResult) -> dict[str, Any]:
    """`result.to_dict()` with the objective's cost filled in for trials that ran but were refused
    (numerics, memory), from their measurement by the tuner's own cost: they are drawn, not dropped."""
    data = result.to_dict()
    objective: Objective = result.objective
    for item, trial in zip(data["trials"], result.trials):
        if item["cost_ms"] is None and trial.result is not None and trial.result.ok:
            item["cost_ms"] = cost_ms(trial.result, objective)
    return data
