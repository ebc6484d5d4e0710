"""`workbench history` and a stored run as terminal tables. Formatting only: the figures are the stored summaries."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from workbench.config import ConfigError, TrainConfig
from workbench.store.core import HistoryRow
from workbench.store.records import StoredTrial
from workbench.textfmt import format_ms, table


def format_history(rows: Sequence[HistoryRow], path: Path | str) -> str:
    if not rows:
        return f"no stored trials match (history: {path})"
    body = [
        [
            row.run_id,
            row.id,
            time.strftime("%Y-%m-%d %H:%M", time.localtime(row.started_at or row.saved_at)),
            row.commit_label,
            f"{row.workload} [{row.preset}]" if row.preset else row.workload,
            _clip(row.config_label, 48),
            row.label or row.kind,
            format_ms(row.median_step_ms),
            format_ms(row.iqr_step_ms),
            row.steps,
            row.status if row.status == "ok" else f"{row.status}: {_clip(row.message.strip().splitlines()[0], 40)}"
            if row.message.strip() else row.status,
        ]
        for row in rows
    ]  # fmt: skip
    headers = ["run", "trial", "started", "commit", "workload", "config", "role", "median ms", "IQR ms", "steps",
               "status"]  # fmt: skip
    return table(headers, body) + f"\n{len(rows)} trial(s), newest first; history: {path}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_run(trials: Sequence[StoredTrial]) -> str:
    """A stored comparison run as a table: each configuration once, with the calibrated figures the
    comparison attached when it ended (speedup, interval, verdict); a trial without them says so."""
    if not trials:
        return "no stored trials in this run"
    seen: dict[str, StoredTrial] = {}
    for trial in trials:
        seen.setdefault(trial.label or trial.result.trial_id, trial)
    body = []
    for label, trial in seen.items():
        figures = trial.result.comparison or {}
        speedup, ci = figures.get("speedup"), figures.get("speedup_ci")
        body.append(
            [
                label,
                _clip(TrainConfig.from_dict(trial.result.config).describe() if _readable(trial) else "?", 48),
                format_ms(trial.result.median_step_ms),
                f"{speedup:.2f}x" if speedup else ("1.00x" if figures.get("role") == "baseline" else "n/a"),
                f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "",
                figures.get("verdict") or ("" if figures else "no comparison figures stored"),
            ]
        )
    return table(["role", "config", "median ms", "speedup", "CI", "verdict"], body)


def _readable(trial: StoredTrial) -> bool:
    try:
        TrainConfig.from_dict(trial.result.config)
    except ConfigError:  # stored by a version with other fields
        return False
    return True
