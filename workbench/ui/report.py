"""The report you can attach: one standalone HTML file with the comparison table, the verdicts and
the analytical views, for a pull request or a CI artifact.

One Bokeh document written with BokehJS inline: it opens from disk with no server and no internet.
Tables and verdicts are the terminal's own text (`workbench.terminal`, `analysis.regress`), so the
file and the CLI say the same words; the pictures are the `workbench.ui.views`.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.store.text import format_run
from workbench.terminal import comparison_table
from workbench.ui.views import data_pipeline, history, op_diff, pareto, ranks, render
from workbench.ui.views.base import ViewError, opened_store

if TYPE_CHECKING:
    from workbench.analysis.regress import RegressionReport
    from workbench.analysis.trace_diff import TraceDiff
    from workbench.protocol import ComparisonRun
    from workbench.store import Store
    from workbench.tune import TuneResult


def write_report(
    path: str | os.PathLike[str],
    *,
    comparison: ComparisonRun | None = None,
    regression: RegressionReport | None = None,
    tune: TuneResult | dict[str, Any] | None = None,
    store: Store | str | os.PathLike[str] | None = None,
    workload: str | None = None,
    run: int | None = None,
    op_diff_of: TraceDiff | None = None,
    ranks_of: Any = None,
    data_of: Any = None,
    loader_bound: Any = None,
    title: str = "Training Workbench report",
) -> Path:
    """Write the report to `path` and return it. Each argument given adds its section: the comparison table
    and verdicts (`comparison`, or a stored comparison `run` id), a regression check's table
    (`regression`), the step time per commit of `workload` from `store` (the regressions marked), the
    tuner's Pareto front (`tune`), an op diff, per-rank figures (a distributed trial or a watched job)
    and the data pipeline. Nothing given is an error, not an empty file."""
    sections = report_sections(
        comparison=comparison,
        regression=regression,
        tune=tune,
        store=store,
        workload=workload,
        run=run,
        op_diff_of=op_diff_of,
        ranks_of=ranks_of,
        data_of=data_of,
        loader_bound=loader_bound,
    )
    if not sections:
        raise ViewError(
            "a report needs something to show: a comparison, a regression check, a tune result, "
            "a workload's history, an op diff, ranks or data-pipeline figures"
        )
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models.widgets import Div
    from bokeh.resources import INLINE

    models: list[Any] = [Div(text=f"<h1>{html.escape(title)}</h1>")]
    for heading, text, view in sections:
        models.append(Div(text=f"<h2>{html.escape(heading)}</h2>"))
        if text:
            models.append(Div(text=f"<pre class='workbench-report-text'>{html.escape(text)}</pre>"))
        if view is not None:
            models.append(render(view))
    out = Path(path)
    try:
        out.write_text(file_html(column(*models), INLINE, title), encoding="utf-8")
    except OSError as exc:
        raise ViewError(f"cannot write the report to {out}: {exc.strerror or exc}") from None
    return out


def report_sections(**given: Any) -> list[tuple[str, str, Any]]:
    """(heading, text, view or None) for each part given, in reading order."""
    sections: list[tuple[str, str, Any]] = []
    if given["comparison"] is not None:
        sections.append(("Comparison", comparison_table(given["comparison"]), None))
    if given["run"] is not None:
        sections.append((f"Stored run {given['run']}", stored_run_text(given["store"], given["run"]), None))
    regression = given["regression"]
    if regression is not None:
        from workbench.analysis.regress import format_report

        sections.append(
            (f"Regression check: {'FAILED' if regression.regressed else 'passed'}", format_report(regression), None)
        )
    if given["workload"] is not None:
        view = history(given["store"], given["workload"], regressions=regression)
        sections.append((f"Step time across commits: {given['workload']}", "", view))
    if given["tune"] is not None:
        sections.append(("Tuned configurations", "", pareto(given["tune"])))
    if given["op_diff_of"] is not None:
        sections.append(
            ("Where the step time moved", "\n".join(given["op_diff_of"].notes), op_diff(given["op_diff_of"]))
        )
    if given["ranks_of"] is not None:
        sections.append(("Ranks", "", ranks(given["ranks_of"])))
    if given["data_of"] is not None or given["loader_bound"] is not None:
        sections.append(("Data pipeline", "", data_pipeline(given["data_of"], given["loader_bound"])))
    return sections


def stored_run_text(store: Any, run_id: int) -> str:
    """The stored run's table (its configurations and the comparison's verdicts); a clear error if absent."""
    with opened_store(store) as db:
        trials = db.trials(run_id=int(run_id))
        if not trials:
            raise ViewError(f"no stored trials in run {run_id} of {db.path} (`workbench history` lists runs)")
        return format_run(trials)
