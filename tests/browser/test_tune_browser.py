"""The app's Tune tab in a real browser: JupyterLab + Playwright on the system Chromium.

A notebook cell shows the app on a workload whose step time is set by the OS clock (per sample,
batch 8 beats batch 4 by construction), its trials in the kernel's own process so the search takes
seconds. The test opens the Tune tab, narrows the space to the batch size, sets a short budget and
clicks Tune; a MutationObserver in the page records the trials table's row count at every change,
so rows are seen arriving one by one *before* the status says the search is done. Then the winner
line with its interval, the Pareto chart's points in BokehJS (`wb.ui.pareto`), and a second search cancelled with
the buttons back to idle. Screenshot: artifacts/browser/tune.png. Skips with the reason when
/usr/bin/chromium or the playwright package is missing; it never downloads a browser.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import CHROMIUM, CHROMIUM_FLAGS, jupyterlab, skip_reason

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
NOTEBOOK = "tune.ipynb"

if (_reason := skip_reason()) is not None:
    pytest.skip(_reason, allow_module_level=True)

import nbformat  # noqa: E402
from playwright.sync_api import Browser, Locator, Page, sync_playwright  # noqa: E402

# The app as a user shows it, with one change: the Tune tab's trials run in the kernel's process
# (inline, as tests/test_ui_tune.py runs them) so a search of three batch sizes fits in seconds; the
# workload, preset, device and window still come from the app's own widgets.
APP_CELL = f"""\
import sys
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tests")!r}]
from sleepy_workload import sleepy_workload
from workbench.protocol import Protocol
from workbench.ui import Workbench

wb = Workbench(sleepy_workload(), device="cpu", warmup=1, steps=4)
app_spec = wb.tune.spec
inline = {{"isolation": "inline", "track_memory": True, "protocol": Protocol(design="processes", precision=0.1),
          "store": None, "seed_from_diagnosis": False}}
wb.tune.spec = lambda: {{**app_spec(), "trial_options": inline}}
wb"""

# Records, at every DOM change inside the Tune tab, the trials table's row count and whether the
# status already says the search ended; a change that alters neither is not recorded. It also notes
# whether the best-so-far line showed before the end.
OBSERVE_JS = """(tab) => {
    window.__tuneSeen = [];
    window.__bestSoFarWhileRunning = false;
    const note = () => {
        const table = tab.querySelector('table.workbench-tune-trials');
        const rows = table ? table.querySelectorAll('tr').length - 1 : 0;
        const done = /done: /.test(tab.textContent);
        window.__bestSoFarWhileRunning ||= !done && /best so far by screening/.test(tab.textContent);
        const last = window.__tuneSeen[window.__tuneSeen.length - 1];
        if (!last || last.rows !== rows || last.done !== done) window.__tuneSeen.push({rows, done});
    };
    new MutationObserver(note).observe(tab, {subtree: true, childList: true, characterData: true});
}"""

# The Pareto chart (wb.ui.pareto, its figure named 'pareto') in every Bokeh document of the page: its
# points, summed over the renderers of each numerics verdict.
PARETO_JS = """() => (window.Bokeh ? Bokeh.documents : [])
    .map(d => d.get_model_by_name('pareto')).filter(m => m != null)
    .map(fig => fig.renderers.filter(r => (r.name || '').startsWith('numerics'))
        .reduce((n, r) => n + r.data_source.data.cost_ms.length, 0))"""
WINNER_JS = """() => (window.Bokeh ? Bokeh.documents : []).some(d => d.get_model_by_name('verified winner'))"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """JupyterLab on 127.0.0.1 and a free port, token off, settings isolated, the tune notebook in its root."""
    home = tmp_path_factory.mktemp("lab")
    root = home / "work"
    root.mkdir()
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(APP_CELL)], metadata=kernel)
    nbformat.write(notebook, root / NOTEBOOK)  # with a kernelspec: no kernel-picker dialog
    with jupyterlab(home, root) as url:
        yield url


@pytest.fixture(scope="module")
def tab(lab: str) -> Iterator[tuple[Page, Locator]]:
    """The page, and the app's Tune tab opened in it (the app's cell run)."""
    with sync_playwright() as p:
        browser: Browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        context = browser.new_context(viewport={"width": 1500, "height": 1000})
        page = context.new_page()
        page.goto(f"{lab}lab/workspaces/tune-test/tree/{NOTEBOOK}?reset")
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
        page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle$")).wait_for(timeout=120_000)
        cell = page.locator(".jp-NotebookPanel .jp-Cell").first
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Control+Enter")
        title = cell.locator(".lm-TabBar-tab:has(.lm-TabBar-tabLabel:text-is('Tune'))")
        title.wait_for(timeout=120_000)
        title.click()
        # The innermost box holding the tab's introduction is the Tune tab itself (outer boxes come first).
        yield page, cell.locator(".widget-vbox").filter(has_text="Search the levers").last
        context.close()
        browser.close()


def _button(tune: Locator, name: str, state: str = "") -> Locator:
    return tune.locator(f"button:text-is('{name}'){state}")


def _search_only(tune: Locator, searched: set[str]) -> None:
    """Every field in `searched` offers all of its values; every other one stays at its first."""
    selects = tune.locator(".widget-select-multiple")
    names = [selects.nth(i).locator("label").inner_text() for i in range(selects.count())]
    assert searched <= set(names), names
    for i, name in enumerate(names):
        select = selects.nth(i).locator("select")
        count = select.locator("option").count()
        select.select_option(index=list(range(count)) if name in searched else [0])


def test_trials_arrive_in_the_table_before_the_search_ends_then_the_winner(tab: tuple[Page, Locator]) -> None:
    page, tune = tab
    _search_only(tune, {"batch_size"})
    budget = tune.locator(".widget-inline-hbox:has(label:text-is('budget s')) input")
    budget.fill("30")
    budget.press("Enter")
    page.evaluate(OBSERVE_JS, tune.element_handle())
    _button(tune, "Tune").click()
    _button(tune, "Cancel", ":enabled").wait_for(timeout=20_000)
    done = tune.get_by_text("done: ")
    done.wait_for(timeout=120_000)
    assert "of 3 valid configurations" in done.inner_text()  # the narrowing reached the search
    seen = page.evaluate("() => window.__tuneSeen")

    during = [s["rows"] for s in seen if not s["done"] and s["rows"] > 0]
    assert len(set(during)) >= 2, f"the table did not gain rows while the search ran: {seen}"
    assert during == sorted(during), f"rows went missing while the search ran: {seen}"
    final = tune.locator("table.workbench-tune-trials tr").count() - 1
    assert final >= max(during), (final, seen)

    best = tune.get_by_text(re.compile(r"^(Winner|Fastest contender)"))
    line = best.locator("xpath=..").inner_text()
    assert re.search(r"batch_size=8\b", line), line  # the independent truth
    assert re.search(r"\d+\.\d\dx \[\d+\.\d\d, \d+\.\d\d\] over the baseline", line), line  # with its interval
    assert page.evaluate("() => window.__bestSoFarWhileRunning"), "no best-so-far line while the search ran"
    measured = tune.locator("table.workbench-tune-trials td:nth-child(4):text-is('ok')").count()
    assert measured > 0
    _button(tune, "Tune", ":enabled").wait_for(timeout=60_000)  # the search has returned: its chart is drawn
    assert _button(tune, "Cancel").is_disabled()
    # One point per measured trial in BokehJS's copy of the final chart, the verified winner starred.
    page.wait_for_function(f"() => ({PARETO_JS})().some(n => n === {measured})", timeout=10_000)
    page.wait_for_function(WINNER_JS, timeout=10_000)
    tune.locator(".bk-Canvas, canvas").first.scroll_into_view_if_needed()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "tune.png"), full_page=False)


def test_cancel_stops_a_search_and_returns_the_buttons_to_idle(tab: tuple[Page, Locator]) -> None:
    """Cancel while screening runs. A wider space (batch size × optimizer × layout: 24 configurations)
    and a longer window (the app's own steps field) keep this search going for many seconds, so the
    Cancel surely lands first."""
    page, tune = tab
    steps = page.locator(".jp-NotebookPanel .jp-Cell").first.locator(
        ".widget-inline-hbox:has(label:text-is('steps')) input"
    )
    steps.fill("40")
    steps.press("Enter")
    _search_only(tune, {"batch_size", "optimizer_impl", "channels_last"})
    budget = tune.locator(".widget-inline-hbox:has(label:text-is('budget s')) input")
    budget.fill("120")
    budget.press("Enter")
    _button(tune, "Tune").click()
    _button(tune, "Cancel", ":enabled").wait_for(timeout=20_000)  # the last search's table is cleared by now
    tune.locator("table.workbench-tune-trials tr:nth-child(2)").wait_for(timeout=60_000)  # screening runs
    assert _button(tune, "Tune").is_disabled()
    _button(tune, "Cancel").click()
    clicked = time.monotonic()
    _button(tune, "Tune", ":enabled").wait_for(timeout=30_000)  # set once the search's thread has ended
    idle_s = time.monotonic() - clicked
    status = tune.get_by_text(re.compile(r"^done: ")).inner_text()
    assert status.startswith("done: cancelled;"), status
    assert _button(tune, "Cancel").is_disabled()
    assert idle_s < 10, f"the buttons returned to idle {idle_s:.1f} s after Cancel"
    rows = tune.locator("table.workbench-tune-trials tr").count() - 1
    assert 1 <= rows < 24  # it stopped early
