"""The Timeline tab's figures in a real browser: memory through a step (baseline and candidate), the
Gantt of a 20-step profiled window, and the A/B diff table, rendered by BokehJS in Chromium.

The tab's own Bokeh document (the one jupyter_bokeh sends to the notebook) is written as a
standalone page with BokehJS inline, so this checks the drawing without a JupyterLab server: the
data BokehJS holds equals the view's, the page renders within seconds, and a zoom of the Gantt
redraws within a frame budget. A screenshot goes to artifacts/browser/timeline.png.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from browser_support import CHROMIUM, CHROMIUM_FLAGS, skip_reason
from torch import nn

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
STEPS = 20

if (_reason := skip_reason()) is not None:
    pytest.skip(_reason, allow_module_level=True)

from playwright.sync_api import Page, sync_playwright  # noqa: E402

from workbench.config import TrainConfig  # noqa: E402
from workbench.measure.profile import ProfileOptions  # noqa: E402
from workbench.trials import run_trial  # noqa: E402
from workbench.ui.timeline_view import TimelineView  # noqa: E402
from workbench.workloads import Workload  # noqa: E402

# Per Bokeh model name in the page: its number of rows.
ROWS_JS = """(names) => names.map(n => { const m = Bokeh.documents[0].get_model_by_name(n);
    return m == null ? -1 : Object.values(m.data)[0].length; })"""


def _workload() -> Workload:
    return Workload.from_callables(
        model_fn=lambda: nn.Sequential(
            nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)
        ),
        batch_fn=lambda n, g: (torch.randn(n, 32, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out.float(), batch[1]),
        batch_size=32,
        name="timeline-browser-mlp",
    )


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> TimelineView:
    options = ProfileOptions(wait=0, warmup=1, active=STEPS, scan_syncs=False,
                             trace_dir=str(tmp_path_factory.mktemp("traces")))  # fmt: skip
    results = []
    for config in (TrainConfig(), TrainConfig(amp="bf16")):
        result = run_trial(_workload(), config, warmup=1, steps=5, isolation="inline", profile=options,
                           track_memory=False)  # fmt: skip
        assert result.status == "ok", result.message
        results.append(result)
    timeline = TimelineView()
    timeline.show(results[0], results[1])
    return timeline


@pytest.fixture(scope="module")
def page(view: TimelineView, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Page, float]]:
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    html = file_html(view.document.roots[0], INLINE, "Workbench timeline")
    html = html.replace("</body>", f"<div>{view.header.value}</div><div>{view.diff_table.value}</div></body>")
    path = tmp_path_factory.mktemp("page") / "timeline.html"
    path.write_text(html)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1100, "height": 1000})
        started = time.monotonic()
        page.goto(path.as_uri())
        page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0", timeout=60_000)
        page.locator(".bk-Canvas").nth(2).wait_for(state="attached", timeout=60_000)  # in Bokeh's shadow DOM
        yield page, time.monotonic() - started
        browser.close()


def test_timeline_and_diff_render_with_the_views_data(view: TimelineView, page: tuple[Page, float]) -> None:
    browser_page, load_s = page
    names = ["memory_baseline", "memory_candidate", "phases_baseline", "gantt"]
    expected = [len(view.memory["baseline"].data["t_ms"]), len(view.memory["candidate"].data["t_ms"]),
                len(view.phases["baseline"].data["x"]), len(view.gantt.data["left"])]  # fmt: skip
    assert browser_page.evaluate(ROWS_JS, names) == expected
    assert expected[0] > 10 and expected[2] == 4 and expected[3] > STEPS * 4
    # A 20-step window stays interactive: the page is drawn within seconds (BokehJS inline included).
    assert load_s < 20, f"the timeline took {load_s:.1f} s to render"
    table = browser_page.locator("table.workbench-diff")
    assert table.count() == 1 and "bfloat16" in table.inner_text()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser_page.screenshot(path=str(ARTIFACTS / "timeline.png"), full_page=True)


def test_zooming_the_gantt_redraws_quickly(page: tuple[Page, float]) -> None:
    browser_page, _ = page
    redraw_ms = browser_page.evaluate(
        """async () => {
            const fig = Bokeh.documents[0].roots()[0].children[1];
            const t0 = performance.now();
            for (let i = 0; i < 5; i++) {
                fig.x_range.start = i; fig.x_range.end = 20 + 5 * i;
                await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
            }
            return (performance.now() - t0) / 5;
        }"""
    )
    assert redraw_ms < 500, f"a Gantt zoom took {redraw_ms:.0f} ms to redraw"
