"""The JupyterLab extension in a real browser: JupyterLab with the installed prebuilt
extension, driven by Playwright on the system Chromium — once at `/` and once under a
`/user/someone/` prefix (the JupyterHub layout nvdashboard broke under).

Checks: the "Workbench" side panel's charts receive new points, the status bar shows
utilization, the launcher card and the panel button create and open a copy of the
quickstart notebook, and no workbench API request fails. Screenshots go to
`artifacts/browser/`. Skips (with the reason) without /usr/bin/chromium or the
`playwright` package; it never downloads a browser.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser_support import CHROMIUM, CHROMIUM_FLAGS, free_port, skip_reason, stop, wait_ready

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "browser"
PANEL_ID = "training-workbench-panel"
TEMPLATE = "01_quickstart.ipynb"


if (_reason := skip_reason()) is not None:
    pytest.skip(_reason, allow_module_level=True)

from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402


@dataclass
class Lab:
    url: str
    """http://127.0.0.1:PORT{base_url}"""
    token: str
    root: Path
    log: Path


@pytest.fixture(scope="module", params=["/", "/user/someone/"], ids=["root", "prefixed"])
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A JupyterLab server on a free port, isolated from the user's settings and workspaces."""
    base_url: str = request.param
    home = tmp_path_factory.mktemp("lab")
    root = home / "work"
    root.mkdir()
    # No "get Jupyter news?" toast over the screenshots (and no request to the internet for it).
    notification = home / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port, token = free_port(), secrets.token_hex(16)
    lab = Lab(f"http://127.0.0.1:{port}{base_url}", token, root, home / "lab.log")
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "WORKBENCH_STORE": str(home / "history.sqlite"),
    }
    command = [
        sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", f"--ServerApp.base_url={base_url}",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={home / 'settings'}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
        "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    with lab.log.open("wb") as log:
        proc = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(lab.url, proc, lab.log, lab.token)
        yield lab
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, lab: Lab, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A fresh JupyterLab page (its own workspace, reset) that records failed workbench API calls."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    failures: list[str] = []
    page.on(
        "response",
        lambda r: failures.append(f"{r.status} {r.url}") if "workbench/api" in r.url and r.status >= 400 else None,
    )
    page.on("requestfailed", lambda r: failures.append(f"failed {r.url}") if "workbench/api" in r.url else None)
    workspace = re.sub(r"\W", "-", request.node.name)
    page.goto(f"{lab.url}lab/workspaces/{workspace}?reset&token={lab.token}")
    page.wait_for_selector(".jp-LauncherCard", timeout=60_000)
    yield page
    context.close()
    assert not failures, f"workbench API requests failed: {failures}"


def _shot(page: Page, lab: Lab, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    prefix = "prefixed" if "/user/" in lab.url else "root"
    page.screenshot(path=str(ARTIFACTS / f"{prefix}-{name}.png"))


def _chart_state(page: Page) -> list[dict[str, Any]]:
    states: list[dict[str, Any]] = page.eval_on_selector_all(
        ".jp-WorkbenchChart",
        "els => els.map(e => ({device: e.dataset.device, points: Number(e.dataset.points),"
        " lastT: Number(e.dataset.lastT), lines: e.querySelectorAll('polyline').length}))",
    )
    return states


def test_side_panel_charts_receive_live_points(page: Page, lab: Lab) -> None:
    page.click(f'li[data-id="{PANEL_ID}"]')
    page.wait_for_selector(f"#{PANEL_ID} .jp-WorkbenchChart polyline", timeout=20_000)
    first = _chart_state(page)
    expected = _expected_devices(lab)
    assert [c["device"] for c in first] == expected
    time.sleep(3.5)  # the panel polls once a second; the server samples at 10 Hz
    later = _chart_state(page)
    for before, after in zip(first, later):
        # The newest drawn point moved on by about the time waited (the point count alone can
        # stand still once the 2-minute window is full).
        assert after["lastT"] - before["lastT"] >= 2.0, f"no new data in {after['device']} over 3.5 s"
        assert after["points"] >= 2 and after["lines"] >= 1
    status = page.inner_text(".jp-WorkbenchStatus")
    assert re.fullmatch(r"(CPU \d+% · RAM \d+%|GPU( \d+)? \d+% · mem \d+%)", status), status
    _shot(page, lab, "panel")


def test_launcher_card_and_panel_button_open_copies_of_the_quickstart(page: Page, lab: Lab) -> None:
    page.click('.jp-LauncherCard:has-text("New tuning notebook")')
    _wait_notebook_tab(page, TEMPLATE)
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=30_000)
    copy = json.loads((lab.root / TEMPLATE).read_text())
    assert copy["nbformat"] == 4 and copy["cells"], "the copy on disk is a notebook with cells"
    cells = page.locator(".jp-NotebookPanel:visible .jp-Cell")
    cells.nth(len(copy["cells"]) - 1).wait_for(timeout=30_000)
    assert cells.count() == len(copy["cells"]), "the notebook on screen has the template's cells"
    # A kernel starts for it (the template names one): the notebook is usable, not just on disk.
    page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle$")).wait_for(timeout=60_000)
    _shot(page, lab, "notebook")

    # Again from the panel's button: a second copy beside the first, never over it.
    page.click(f'li[data-id="{PANEL_ID}"]')
    page.click(f"#{PANEL_ID} .jp-WorkbenchPanel-new")
    _wait_notebook_tab(page, "01_quickstart-1.ipynb")
    assert (lab.root / "01_quickstart-1.ipynb").is_file()
    assert json.loads((lab.root / TEMPLATE).read_text()) == copy, "the first copy was left as it was"


def _wait_notebook_tab(page: Page, name: str) -> None:
    page.wait_for_selector(f'.lm-DockPanel-tabBar .lm-TabBar-tab:has-text("{name}")', timeout=30_000)


def _expected_devices(lab: Lab) -> list[str]:
    """What the charts should show, read independently from the server's metrics endpoint."""
    with urllib.request.urlopen(f"{lab.url}workbench/api/metrics?token={lab.token}", timeout=10) as reply:
        latest = json.loads(reply.read())["latest"]
    gpus = latest["gpus"] if latest else []
    return [f"gpu{g['index']}" for g in gpus] if gpus else ["host"]
