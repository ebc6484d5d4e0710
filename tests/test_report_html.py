"""The report you can attach: `wb.report(...)`, `workbench report` and `workbench regress --report` write
one standalone HTML file — no server, no resource fetched from the network — holding the verdicts as
the terminal prints them and the views' plotted data (the flagged commit, the tuner's front)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from test_regress import repeated_history, write_suite  # noqa: F401  (the regression fixture: commit C is 30% slower)
from test_store import COMMIT_C, fake_result
from test_ui_views import TUNE_FIXTURE

pytest.importorskip("holoviews")

import workbench as wb
from workbench.cli import main
from workbench.store import Store

#: An attribute that makes a browser fetch something: a script, a stylesheet, an image, a frame.
EXTERNAL_RESOURCE = re.compile(r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*["']?(?:https?:)?//""", re.I)


@pytest.fixture
def history_target(tmp_path: Path) -> str:
    """The regression fixture's history in a SQLite file: the report is what these tests check, not the
    store's backend (`test_regress` runs the same history on both)."""
    return str(tmp_path / "history.sqlite")


def assert_standalone(html: str) -> None:
    assert not EXTERNAL_RESOURCE.search(html), "a resource would be fetched from the network"
    assert "Bokeh.embed.embed_items" in html and "cdn.bokeh.org" not in html  # BokehJS itself is inline


def plotted_values(html: str) -> str:
    """The embedded document's JSON (the data every plot draws), as text to search."""
    match = re.search(r'<script type="application/json" id="[^"]+">\s*(.*?)\s*</script>', html, re.S)
    assert match, "the report embeds its document"
    return match.group(1)


def test_wb_report_writes_the_verdicts_and_the_views_into_one_standalone_file(
    repeated_history: Store,  # noqa: F811
    tmp_path: Path,
) -> None:
    path = wb.report(
        tmp_path / "report.html",
        store=repeated_history,
        workload="bev-perception",
        tune=json.loads(TUNE_FIXTURE.read_text()),
        title="PR 123",
    )
    html = path.read_text()
    assert_standalone(html)
    data = plotted_values(html)
    assert "PR 123" in html and "Step time across commits: bev-perception" in data
    assert COMMIT_C in data and "Pareto front" in data and "verified winner" in data


def test_regress_report_is_written_when_the_gate_fails_with_the_regression_marked(
    repeated_history: Store,  # noqa: F811
    tmp_path: Path,
    capsys: Any,
) -> None:
    out = tmp_path / "report.html"
    suite = write_suite(tmp_path)
    assert (
        main(["regress", "--suite", suite, "--from-store", "--store", str(repeated_history.path), "--report", str(out)])
        == 1
    )
    assert "report written" in capsys.readouterr().err
    html = out.read_text()
    assert_standalone(html)
    data = plotted_values(html)
    assert "Regression check: FAILED" in data and "REGRESSION" in data
    flagged = re.search(r'"name":"regression","data_source".*?"name":"(?:Legend|GlyphRenderer)"', data)
    assert flagged is not None and COMMIT_C in flagged.group(0), "the regressed commit is the marked point"

    passing = tmp_path / "passing.html"
    assert (
        main(
            [
                "regress",
                "--suite",
                suite,
                "--from-store",
                "--store",
                str(repeated_history.path),
                "--threshold",
                "0.5",
                "--report",
                str(passing),
            ]
        )
        == 0
    )
    assert not passing.exists(), "a gate that passes writes no report"


def test_workbench_report_reads_a_stored_run_and_refuses_an_empty_or_unknown_request(
    repeated_history: Store,  # noqa: F811
    tmp_path: Path,
    capsys: Any,
) -> None:
    out = tmp_path / "run.html"
    store = str(repeated_history.path)
    assert main(["report", "-o", str(out), "--store", store, "--run", "3", "--workload", "bev-perception"]) == 0
    html = out.read_text()
    assert_standalone(html)
    assert "Stored run 3" in plotted_values(html)
    capsys.readouterr()
    assert main(["report", "-o", str(tmp_path / "x.html"), "--store", store]) == 2
    assert "say what to report" in capsys.readouterr().err
    assert main(["report", "-o", str(tmp_path / "x.html"), "--store", store, "--run", "99"]) == 2
    assert "no stored trials in run 99" in capsys.readouterr().err
    tuned = tmp_path / "tuned.html"
    assert main(["report", "-o", str(tuned), "--store", store, "--tune", str(TUNE_FIXTURE)]) == 0
    assert "verified winner" in plotted_values(tuned.read_text())
    (tmp_path / "bad.json").write_text("{")
    assert main(["report", "-o", str(tuned), "--tune", str(tmp_path / "bad.json")]) == 2
    assert "is not the JSON of `workbench tune --json`" in capsys.readouterr().err
    with pytest.raises(wb.ui.ViewError, match="needs something to show"):
        wb.report(tmp_path / "nothing.html")


def test_the_report_holds_a_comparisons_table_an_op_diff_ranks_and_the_data_pipeline(tmp_path: Path) -> None:
    import random

    from test_stragglers import simulate
    from test_trace_diff import _op, _trial

    from workbench.analysis.compare import compare_trials
    from workbench.analysis.stragglers import check_stragglers
    from workbench.analysis.trace_diff import diff_trials
    from workbench.config import TrainConfig
    from workbench.protocol import ComparisonRun
    from workbench.terminal import comparison_table

    baseline = [fake_result([100.0 + i, 101.0 + i, 99.0 + i]) for i in range(4)]
    faster = [fake_result([60.0 + i, 61.0 + i, 59.0 + i], config=TrainConfig(channels_last=True)) for i in range(4)]
    run = ComparisonRun(compare_trials(baseline, [faster]), baseline, [faster])
    eager = _trial("a", [10.0] * 5, [_op("aten::mm", 4.0, 3), _op("aten::relu", 2.0)])
    fused = _trial("b", [7.0] * 5, [_op("aten::mm", 4.0, 3), _op("cpp_fused_relu_0", 0.4)])
    check = check_stragglers(simulate(4, 40, random.Random(1), slow=2, phase="data", delay_ms=12.0))
    diff = diff_trials(eager, fused)
    path = wb.report(tmp_path / "all.html", comparison=run, op_diff_of=diff, ranks_of=check, data_of=fake_result())
    html = path.read_text()
    assert_standalone(html)
    data = plotted_values(html)
    (row,) = [line for line in comparison_table(run).splitlines() if line.startswith("channels_last=True")]
    assert "faster" in row and " 1.6" in row  # ~100 ms / ~60 ms, as the terminal prints it
    assert row.split("  ")[0] in data and "faster" in data
    assert "aten::relu" in data and "cpp_fused_relu_0" in data
    assert "rank 2 (straggler)" in data and "not measured" in data


def test_the_old_text_module_path_warns_forwards_and_leaves_wb_report_callable(
    repeated_history: Store,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`workbench.report` held the terminal's text helpers until they moved to `workbench.terminal`:
    the old import still works for one release, with a warning, and importing it (which binds the
    package's `report` to the module) does not take `wb.report(...)` away."""
    import sys

    from workbench import terminal

    sys.modules.pop("workbench.report", None)
    with pytest.warns(DeprecationWarning, match="workbench.report is deprecated: import from workbench.terminal"):
        from workbench.report import run_summary, verdict_text
    assert run_summary is terminal.run_summary and verdict_text is terminal.verdict_text
    path = wb.report(tmp_path / "after-import.html", store=repeated_history, workload="bev-perception")
    assert_standalone(path.read_text())
