"""The notebook app in a real browser: JupyterLab + Playwright on the system Chromium.

Opens the quickstart, runs its set-up and app cells, types a longer window into the
app, clicks "Run baseline", and reads the step-time chart's ColumnDataSource out of
BokehJS in the page (`window.Bokeh.documents`) while the trial runs: it must gain
points before the trial ends. A second check displays an app whose trial finished
*before* its view existed — streaming into a BokehModel before its front-end view exists once left
the chart blank for good — and the chart must still fill.
Screenshots go to artifacts/browser/. Skips with the reason when /usr/bin/chromium or
the playwright package is missing; it never downloads a browser.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import CHROMIUM, CHROMIUM_FLAGS, jupyterlab, skip_reason

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
NOTEBOOK = "01_quickstart.ipynb"
LIVE_STEPS = 500


if (_reason := skip_reason()) is not None:
    pytest.skip(_reason, allow_module_level=True)

from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402

# Every step_time_points source in the page (one per displayed app): its number of points.
POINTS_JS = """() => (window.Bokeh ? Bokeh.documents : [])
    .map(d => d.get_model_by_name('step_time_points')).filter(m => m != null)
    .map(m => m.data.step_ms.length)"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """JupyterLab on 127.0.0.1 and a free port, token off, settings isolated, the quickstart in its root."""
    home = tmp_path_factory.mktemp("lab")
    root = home / "work"
    root.mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, root / NOTEBOOK)
    with jupyterlab(
        home,
        root,
        {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(ROOT / ".inductor-cache")),
        },
    ) as url:
        yield url


@pytest.fixture(scope="module")
def page(lab: str) -> Iterator[Page]:
    with sync_playwright() as p:
        browser: Browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        context = browser.new_context(viewport={"width": 1500, "height": 1000})
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=lab.rstrip("/"))
        page = context.new_page()
        page.goto(f"{lab}lab/workspaces/app-test/tree/{NOTEBOOK}?reset")
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
        page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle$")).wait_for(timeout=120_000)
        yield page
        context.close()
        browser.close()


def _shot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"app-{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path


def _points(page: Page) -> list[int]:
    return list(page.evaluate(POINTS_JS))


def _run_cell(page: Page, index: int) -> None:
    cell = page.locator(".jp-NotebookPanel .jp-Cell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")


def test_step_time_chart_gains_points_while_the_trial_runs(page: Page) -> None:
    _run_cell(page, 1)  # imports and settings
    _run_cell(page, 3)  # the app
    app = page.locator(".jp-NotebookPanel .jp-Cell").nth(3)
    app.locator("button:has-text('Run baseline')").wait_for(timeout=120_000)  # the Tune tab's buttons are hidden
    page.wait_for_function(f"() => ({POINTS_JS})().length > 0", timeout=60_000)
    steps = app.locator(".widget-inline-hbox:has(label:text-is('steps')) input")
    steps.fill(str(LIVE_STEPS))  # far more than the test waits for: the trial is surely still running
    steps.press("Enter")
    app.locator("button:has-text('Run baseline')").click()

    seen: list[int] = []
    deadline = time.monotonic() + 400  # a loaded 2-core machine runs a tiny step in 0.1-10 s
    while time.monotonic() < deadline and len(set(seen) - {0}) < 3:
        seen.append(max(_points(page), default=0))
        time.sleep(0.25)
    assert len(set(seen) - {0}) >= 3, f"the chart did not gain points while the trial ran: {seen}"
    assert max(seen) < LIVE_STEPS
    app.locator(".bk-Canvas, canvas").first.scroll_into_view_if_needed()
    _shot(page, "live")

    app.locator("button:has-text('Cancel')").filter(visible=True).click()  # and Cancel works (the Tune tab has its own)
    app.locator(":text('#1: cancelled')").wait_for(timeout=60_000)
    _shot(page, "cancelled")


def test_chart_fills_when_the_trial_finished_before_the_view_existed(page: Page) -> None:
    """Data streamed before the view exists (once a blank chart for good), made certain: all data is sent before the browser view exists."""
    before = _points(page)
    cells = page.locator(".jp-NotebookPanel .jp-Cell")
    last = cells.count() - 1
    cells.nth(last).click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")  # a new code cell below
    code = (
        "late = Workbench('bev-perception', preset=PRESET, warmup=1, steps=3)\nlate.run_baseline(); late.wait()\nlate"
    )
    editor = page.locator(".jp-NotebookPanel .jp-Cell").nth(last + 1).locator(".jp-InputArea-editor")
    editor.click()
    page.keyboard.insert_text(code)
    page.keyboard.press("Control+Enter")
    page.wait_for_function(f"() => ({POINTS_JS})().length > {len(before)}", timeout=400_000)
    page.wait_for_function(f"() => ({POINTS_JS})().slice({len(before)}).some(n => n === 3)", timeout=30_000)
    late = page.locator(".jp-NotebookPanel .jp-Cell").nth(last + 1)
    late.locator(".bk-Canvas, canvas").first.scroll_into_view_if_needed()
    _shot(page, "late-view")
    late.locator("table.wb-table").scroll_into_view_if_needed()
    _shot(page, "table")


def test_copy_and_insert_the_exported_snippet(page: Page) -> None:
    cells = page.locator(".jp-NotebookPanel .jp-Cell")
    app = cells.filter(has_text="late = Workbench").first
    index = next(i for i in range(cells.count()) if "late = Workbench" in cells.nth(i).inner_text())
    copy = app.locator("button:has-text('Copy snippet')").filter(visible=True)  # not the Tune tab's export
    copy.scroll_into_view_if_needed()
    copy.click()
    app.locator("button:has-text('Copied')").filter(visible=True).wait_for(timeout=10_000)
    clipboard = page.evaluate("() => navigator.clipboard.readText()")
    assert "def optimize_model" in clipboard
    count = cells.count()
    app.locator("button:has-text('Insert as next cell')").filter(visible=True).click()
    page.wait_for_function(
        f"() => document.querySelectorAll('.jp-NotebookPanel .jp-Cell').length > {count}", timeout=20_000
    )
    inserted = cells.nth(index + 1)
    # The editor renders only the lines in view (the snippet is long): its opening lines, the same
    # as the clipboard's, show that this cell holds the snippet.
    opening = clipboard.splitlines()[:2]
    deadline = time.monotonic() + 20  # the command fills the new cell's editor a moment after creating it
    while not all(line in inserted.inner_text() for line in opening) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(line in inserted.inner_text() for line in opening), (opening, inserted.inner_text()[:300])
    _shot(page, "inserted")


def test_the_diagnosis_tab_shows_a_compiled_runs_compile_section(page: Page) -> None:
    """A compiled, profiled baseline run from the app: its Diagnosis tab has the Compile section (counts,
    compile time by stage). backend='eager' keeps the compile to dynamo's capture (seconds)."""
    _run_cell(page, 1)  # imports and settings (run again after the tests above: harmless)
    cells = page.locator(".jp-NotebookPanel .jp-Cell")
    last = cells.count() - 1
    cells.nth(last).click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")  # a new code cell below
    code = (
        "from workbench.config import TrainConfig\n"
        "compiled = Workbench('bev-perception', preset=PRESET, warmup=1, steps=2)\n"
        "compiled.profile_box.value = True\n"
        "compiled.run_baseline(TrainConfig(compile='default', compile_backend='eager')); compiled.wait()\n"
        "compiled"
    )
    editor = cells.nth(last + 1).locator(".jp-InputArea-editor")
    editor.click()
    page.keyboard.insert_text(code)
    page.keyboard.press("Control+Enter")
    out = page.locator(".jp-NotebookPanel .jp-Cell").nth(last + 1)
    out.locator(".lm-TabBar-tab:has-text('Diagnosis')").first.click(timeout=400_000)
    section = out.locator(".workbench-compile")
    section.wait_for(state="visible", timeout=400_000)
    text = section.inner_text()
    assert "Compile" in text and "graph break(s)" in text and "compile time by stage: dynamo" in text, text
    section.scroll_into_view_if_needed()
    _shot(page, "compile-section")
