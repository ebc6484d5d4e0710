"""The Diagnosis tab's Compile section in a real browser: a profiled inductor trial with one graph
break and a batch that changes size every step, drawn by Chromium.

The tab's header, findings and Compile section (the HTML the widgets hold) are written as one page,
as the timeline's browser test does, so this checks what a reader sees without a JupyterLab server:
the break's file:line (found with `inspect`), a recompile's failed guard in words, and each generated
kernel the profile recorded, with the ops it fused. A screenshot goes to artifacts/browser/compile.png.
"""

from __future__ import annotations

import html
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import CHROMIUM, CHROMIUM_FLAGS, skip_reason

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"

if (_reason := skip_reason()) is not None:
    pytest.skip(_reason, allow_module_level=True)

import compiled_workload  # noqa: E402
from playwright.sync_api import Page, sync_playwright  # noqa: E402

from workbench.config import TrainConfig  # noqa: E402
from workbench.measure.profile import ProfileOptions  # noqa: E402
from workbench.trials import run_trial  # noqa: E402
from workbench.ui.diagnosis_view import DiagnosisView  # noqa: E402


@pytest.fixture(scope="module")
def view() -> DiagnosisView:
    result = run_trial(
        compiled_workload.breaking_workload(),
        TrainConfig(compile="default"),
        isolation="inline",
        warmup=2,
        steps=3,
        track_memory=False,
        profile=ProfileOptions(scan_syncs=False, memory_timeline=False),
    )
    assert result.ok, result.message
    diagnosis = DiagnosisView()
    diagnosis.show(result, workload=compiled_workload.breaking_workload())
    return diagnosis


@pytest.fixture(scope="module")
def page(view: DiagnosisView, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    titles = "".join(f"<div class='finding'>{html.escape(f.title)}</div>" for f in view.diagnosis.findings)  # type: ignore[union-attr]
    body = f"<div>{view.header.value}</div>{titles}<div>{view.compile.value}</div>"
    path = tmp_path_factory.mktemp("page") / "compile.html"
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'></head><body>{body}</body></html>")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        page.goto(path.as_uri())
        yield page
        browser.close()


def test_the_compile_section_shows_the_break_the_recompile_and_the_kernels(view: DiagnosisView, page: Page) -> None:
    lines, first = inspect.getsourcelines(compiled_workload.BreakingNormGelu)
    line = first + next(i for i, text in enumerate(lines) if "graph_break()" in text)
    breaks = page.locator("table.workbench-compile-breaks")
    assert breaks.is_visible() and f"compiled_workload.py:{line}" in breaks.inner_text()
    assert "changed" in page.locator("table.workbench-compile-recompiles").inner_text()
    kernels = page.locator("table.workbench-compile-kernels").inner_text()
    fused = view.result.profile["compiled"]["fused"]  # type: ignore[union-attr,index]
    assert fused and all(k["name"] in kernels for k in fused[:8])
    assert "native_layer_norm" in kernels and "extern (library call)" in kernels
    assert "Graph breaks" in page.locator("div.finding").all_inner_texts()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "compile.png"), full_page=True)
