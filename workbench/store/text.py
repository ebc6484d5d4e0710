"""`workbench history` as a terminal table. Formatting only: the figures are the stored summaries."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from workbench.store.core import HistoryRow
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
