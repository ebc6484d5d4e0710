"""The analytical views in a real browser: the app's History tab in JupyterLab and a report file opened
from disk, each plot drawn on a canvas by BokehJS and answering a hover on a point with its commit.

The fixture is a run history whose defaults configuration is 30% slower at commit C (regress flags
it); the History tab and the report must show that point and name its commit under the mouse. (The
Tune tab's `wb.ui.pareto` is driven in tests/browser/test_tune_browser.py.) Screenshots:
artifacts/browser/history-tab.png, report.png. Skips when Chromium or playwright is missing.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import CHROMIUM, CHROMIUM_FLAGS, jupyterlab, skip_reason

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
NOTEBOOK = "history.ipynb"

if (_reason := skip_reason()) is not None:
    pytest.skip(_reason, allow_module_level=True)
pytest.importorskip("holoviews")
sys.path.insert(0, str(ROOT / "tests"))

import nbformat  # noqa: E402
from playwright.sync_api import Page, sync_playwright  # noqa: E402
from test_store import COMMIT_C  # noqa: E402
from test_ui_views import TUNE_FIXTURE, regressed_store  # noqa: E402

import workbench as wb  # noqa: E402

APP_CELL = """\
from workbench.ui import Workbench

app = Workbench("bev-perception", device="cpu")
app"""

# Where the first point of the newest drawn renderer named `name` sits on the page (or null): BokehJS's
# own screen coordinates of the glyph, offset by its canvas.
POINT_JS = """(name) => {
    if (!window.Bokeh) return null;
    function* walk(v) { yield v; for (const k of (v.children ? v.children() : [])) yield* walk(k); }
    const drawn = [...Bokeh.index.roots].flatMap(v => [...walk(v)])
        .filter(v => v.model.name === name && v.glyph && v.glyph.sx && v.glyph.sx.length > 0);
    if (!drawn.length) return null;
    const view = drawn[drawn.length - 1];
    const canvas = (view.plot_view || view.parent).canvas_view.el.getBoundingClientRect();
    return {x: canvas.x + view.glyph.sx[0], y: canvas.y + view.glyph.sy[0]};
}"""


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, object]]:
    """The run history with the regression, and the regression check's report."""
    store, report, _ = regressed_store(tmp_path_factory.mktemp("history"))
    yield store.path, report
    store.close()


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        yield context.new_page()
        context.close()
        browser.close()


def hover_shows(page: Page, renderer: str, text: str) -> None:
    """Move the mouse onto the renderer's first point and wait for a tooltip naming `text`."""
    page.wait_for_function(f"() => ({POINT_JS})({json.dumps(renderer)}) !== null", timeout=60_000)
    point = page.evaluate(POINT_JS, renderer)
    page.mouse.move(point["x"] - 3, point["y"] - 3)
    page.mouse.move(point["x"], point["y"])
    page.get_by_text(text, exact=True).first.wait_for(state="visible", timeout=10_000)


def test_a_report_file_opens_from_disk_with_its_plots_drawn_and_hover_names_the_regressed_commit(
    history: tuple[Path, object], page: Page, tmp_path: Path
) -> None:
    path, report = history
    tune = json.loads(TUNE_FIXTURE.read_text())
    out = wb.report(tmp_path / "report.html", regression=report, store=path, workload="bev-perception", tune=tune)
    page.goto(out.as_uri())
    page.locator("canvas").first.wait_for(timeout=60_000)
    assert page.locator(".bk-Canvas").count() >= 2  # the history and the Pareto front, drawn
    assert page.get_by_text("Regression check: FAILED").is_visible()
    page.locator(".bk-Canvas").first.scroll_into_view_if_needed()
    hover_shows(page, "regression", COMMIT_C)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"))


@pytest.fixture(scope="module")
def lab(history: tuple[Path, object], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import os

    home = tmp_path_factory.mktemp("lab")
    root = home / "work"
    root.mkdir()
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(APP_CELL)], metadata=kernel)
    nbformat.write(notebook, root / NOTEBOOK)
    env = {**os.environ, "WORKBENCH_STORE": str(history[0]), "PYTHONPATH": str(ROOT)}
    with jupyterlab(home, root, env=env) as url:
        yield url


def test_the_history_tab_draws_the_selected_configuration_across_commits_and_hover_names_a_commit(
    lab: str, page: Page
) -> None:
    page.goto(f"{lab}lab/workspaces/history-test/tree/{NOTEBOOK}?reset")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle$")).wait_for(timeout=120_000)
    cell = page.locator(".jp-NotebookPanel .jp-Cell").first
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    title = cell.locator(".lm-TabBar-tab:has(.lm-TabBar-tabLabel:text-is('History'))")
    title.wait_for(timeout=180_000)
    title.click()
    runs = cell.locator("select").filter(has=page.locator("option", has_text="cccccccccc")).first
    label = next(o for o in runs.locator("option").all_inner_texts() if "cccccccccc" in o and "amp" not in o)
    runs.select_option(label=label)
    page.wait_for_function(
        "() => (window.Bokeh ? Bokeh.documents : []).some(d => d.get_model_by_name('history_series'))",
        timeout=60_000,
    )
    tab = cell.locator(".widget-vbox").filter(has=page.locator("text=Use as baseline")).last
    tab.locator(".bk-Canvas, canvas").first.wait_for(timeout=60_000)
    tab.locator(".bk-Canvas, canvas").first.scroll_into_view_if_needed()
    hover_shows(page, "defaults", "AMD EPYC")  # the hover names the device, with the commit
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "history-tab.png"))
