"""The workbench server extension through a real Jupyter server (pytest-jupyter): answers,
JSON shapes, bad arguments, and that a request without the server's token is refused.

pytest-jupyter serves under a base_url prefix (`/a%40b/`), so every test here also checks
that the routes follow the prefix. Its fixtures are imported into this module rather than
registered with `pytest_plugins`: a registered plugin's autouse fixtures (a fresh event
loop and a ServerApp clean-up around every test) would run around every test of the
suite. Hence also sync tests that drive the server's loop themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import tornado.web
from pytest_jupyter.jupyter_server import *  # noqa: F403  (fixtures for this module only, see above)
from tornado.httpclient import HTTPClientError, HTTPResponse

from workbench.jupyter import authcheck, sources
from workbench.jupyter.feed import MetricsFeed, sample_to_api
from workbench.jupyter.handlers import FEED_SETTING, ROUTES, MetricsHandler

QUICKSTART = Path(__file__).resolve().parent.parent / "notebooks" / "01_quickstart.ipynb"


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"workbench.jupyter": True}}}


@pytest.fixture(autouse=True)
def _stop_sampler(jp_serverapp: Any) -> Iterator[None]:
    yield
    jp_serverapp.web_app.settings[FEED_SETTING].stop()


@pytest.fixture
def api(jp_fetch: Any, jp_asyncio_loop: Any) -> Callable[..., HTTPResponse]:
    """GET `workbench/api/<path>` with the server's token, on the server's own event loop."""

    def fetch(*path: str, **params: Any) -> HTTPResponse:
        response: HTTPResponse = jp_asyncio_loop.run_until_complete(
            jp_fetch("workbench", "api", *path, params=params or None)
        )
        return response

    return fetch


def get_json(api: Callable[..., HTTPResponse], *path: str, **params: Any) -> Any:
    response = api(*path, **params)
    assert response.headers["Content-Type"].startswith("application/json")
    return json.loads(response.body)


def error_of(api: Callable[..., HTTPResponse], *path: str, **params: Any) -> tuple[int, str]:
    with pytest.raises(HTTPClientError) as caught:
        api(*path, **params)
    response = caught.value.response
    try:
        message = json.loads(response.body).get("message", "") if response is not None else ""
    except ValueError:  # no route matched: Jupyter's HTML 404 page
        message = ""
    return caught.value.code, message


# --- metrics ----------------------------------------------------------------------------


def test_metrics_serve_the_latest_sample_and_a_growing_history(api: Callable[..., HTTPResponse]) -> None:
    first = get_json(api, "metrics")
    assert first["api_version"] == 1 and first["rate_hz"] == 10
    deadline = time.monotonic() + 5
    reply = first
    while len(reply["history"]) < 5 and time.monotonic() < deadline:  # the first request starts the sampler
        time.sleep(0.2)
        reply = get_json(api, "metrics")
    history = reply["history"]
    assert len(history) >= 5, "the sampler did not produce samples at ~10 Hz"
    times = [s["t"] for s in history]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert abs(times[-1] - time.time()) < 5
    latest = reply["latest"]
    assert latest["t"] >= times[-1]
    host = latest["host"]
    assert host["ram_total_bytes"] == psutil.virtual_memory().total  # independent ground truth
    assert 0 < host["ram_used_bytes"] < host["ram_total_bytes"]
    assert 0 <= host["cpu_pct"] <= 100 and len(host["cpu_per_core_pct"]) == psutil.cpu_count()
    assert "cpu_per_core_pct" not in history[-1]["host"], "per-core lists stay out of the history"
    assert reply["gpu_available"] == bool(latest["gpus"])
    if not reply["gpu_available"]:
        assert reply["gpu_reason"], "without GPUs the reply must say why"

    newer = get_json(api, "metrics", since=times[-1])
    assert all(s["t"] > times[-1] for s in newer["history"])


def test_metrics_window_bounds_the_history(api: Callable[..., HTTPResponse]) -> None:
    get_json(api, "metrics")
    time.sleep(1.2)
    reply = get_json(api, "metrics", window=0.5)
    assert reply["history"], "half a second at 10 Hz holds samples"
    assert all(s["t"] >= reply["now"] - 0.5 for s in reply["history"])


@pytest.mark.parametrize(
    ("params", "fragment"),
    [({"window": "abc"}, "window must be a number"), ({"window": "100000"}, "between"), ({"since": "-1"}, "since")],
)
def test_metrics_reject_bad_arguments_with_400(
    api: Callable[..., HTTPResponse], params: dict[str, str], fragment: str
) -> None:
    code, _ = error_of(api, "metrics", **params)
    assert code == 400


def test_samples_turn_non_finite_and_missing_numbers_into_null() -> None:
    sample = {"t": 5, "gpus": [{"index": 0, "name": "X", "util_pct": float("nan"), "mem_total_bytes": 8}], "host": {}}
    api = sample_to_api(sample)
    assert api["gpus"][0]["util_pct"] is None and api["gpus"][0]["mem_used_bytes"] is None
    assert api["gpus"][0]["mem_total_bytes"] == 8 and api["host"]["cpu_pct"] is None
    json.dumps(api, allow_nan=False)


class _FakeMonitor:
    def __init__(self, rate_hz: float, history_s: float) -> None:
        self.running = False

    def start(self) -> None:
        self.running = True

    def close(self) -> None:
        self.running = False

    def samples(self, since: float) -> list[dict[str, Any]]:
        return []

    def latest(self) -> None:
        return None

    def gpu_status(self) -> tuple[bool, str]:
        return False, "fake"


def test_the_sampler_starts_on_demand_and_stops_when_nobody_asks() -> None:
    monitors: list[_FakeMonitor] = []

    def factory(rate_hz: float, history_s: float) -> _FakeMonitor:
        monitors.append(_FakeMonitor(rate_hz, history_s))
        return monitors[-1]

    feed = MetricsFeed(idle_stop_s=0.3, monitor_factory=factory)
    assert not feed.running and not monitors
    feed.snapshot()
    assert feed.running and monitors[0].running
    deadline = time.monotonic() + 5
    while feed.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not feed.running and not monitors[0].running
    feed.snapshot()  # the next request starts a fresh one
    assert len(monitors) == 2 and monitors[1].running
    feed.stop()


# --- capabilities, runs, notebooks ----------------------------------------------------


def test_capabilities_report_this_device_with_reasons(
    api: Callable[..., HTTPResponse], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A `workbench/` folder in the server's working directory (a user's notebooks) must not be
    # what the device probe imports: `python -m` would put that directory first on sys.path.
    decoy = tmp_path / "workbench"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("")
    (decoy / "cli.py").write_text('print(\'{"device": "decoy", "toggles": {}}\')')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sources, "_capabilities", None)  # probe now, not from an earlier test's cache
    monkeypatch.setattr(sources, "_probe", None)
    report = get_json(api, "capabilities")
    device = report["device"]
    assert device != "decoy", "the probe imported a workbench/ folder from the working directory"
    assert device["type"] in ("cpu", "cuda")
    assert device["cpu_cores"] == len(os.sched_getaffinity(0))
    assert report["toggles"]["amp"]["fp32"] == {"available": True, "reason": ""}
    for values in report["toggles"].values():
        for availability in values.values():
            assert availability["available"] or availability["reason"], "an unavailable value must say why"


def test_runs_without_a_store_are_an_empty_list_with_a_note(
    api: Callable[..., HTTPResponse], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "none-yet.sqlite"))
    reply = get_json(api, "runs")
    assert reply["runs"] == [] and "no runs saved yet" in reply["note"]
    assert not (tmp_path / "none-yet.sqlite").exists(), "reading must not create a store"
    monkeypatch.setenv("WORKBENCH_STORE", "off")
    reply = get_json(api, "runs")
    assert reply["runs"] == [] and "off" in reply["note"]


def test_runs_list_stored_trials_newest_first(
    api: Callable[..., HTTPResponse], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from test_store import fake_result  # the run store's own "finished trial" fixture

    from workbench.store import Store

    path = tmp_path / "history.sqlite"
    with Store(path) as store:
        store.save_run([fake_result([100.0, 102.0]), fake_result([50.0, 51.0])], kind="compare", labels=["a", "b"])
    monkeypatch.setenv("WORKBENCH_STORE", str(path))
    reply = get_json(api, "runs")
    assert [r["label"] for r in reply["runs"]] == ["b", "a"]
    assert reply["runs"][0]["median_step_ms"] == pytest.approx(50.5) and reply["store"] == str(path)
    assert len((get_json(api, "runs", limit=1))["runs"]) == 1
    assert (error_of(api, "runs", limit=0))[0] == 400


def test_runs_from_a_shared_postgresql_history_never_show_its_password(
    api: Callable[..., HTTPResponse], monkeypatch: pytest.MonkeyPatch, postgres_url: str
) -> None:
    from test_store import fake_result

    from workbench.store import Store

    with Store(postgres_url) as store:
        store.save_run([fake_result([100.0, 102.0])], kind="compare", labels=["a"])
    with_password = postgres_url.replace("postgres@", "postgres:s3cret@")  # trust login ignores it
    monkeypatch.setenv("WORKBENCH_STORE", with_password)
    reply = get_json(api, "runs")
    assert [r["label"] for r in reply["runs"]] == ["a"]
    assert reply["store"] == postgres_url.replace("postgres@", "postgres:***@") and "s3cret" not in json.dumps(reply)


WATCHED_LOOP = """
import sys, time, torch
import workbench as wb

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with wb.watch(model, opt, name="terminal-job", store=sys.argv[1], flush_s=0.2, warmup=1) as w:
    for i in range(int(sys.argv[2])):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        w.step(loss=float("nan") if i == 3 else loss)
        time.sleep(0.01)
"""


def test_watch_lists_jobs_from_other_processes_with_their_newest_step(
    api: Callable[..., HTTPResponse], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "history.sqlite"
    monkeypatch.setenv("WORKBENCH_STORE", str(path))
    assert "no watched job yet" in get_json(api, "watch")["note"]
    script = tmp_path / "job.py"
    script.write_text(WATCHED_LOOP)
    root = str(Path(__file__).resolve().parents[1])
    for steps in (4, 12):  # two jobs, as from a terminal: their own processes
        subprocess.run([sys.executable, str(script), str(path), str(steps)], check=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": root})  # fmt: skip
    reply = get_json(api, "watch")
    newest, older = reply["jobs"]
    assert newest["name"] == older["name"] == "terminal-job" and newest["run_id"] > older["run_id"]
    assert newest["status"] == older["status"] == "ended" and newest["last_step"] == 12
    assert newest["step"]["step"] == 12 and newest["step"]["step_ms"] > 0 and newest["rank"] is None
    assert older["step"]["step"] == 4 and older["step"]["loss"] is None, "a NaN loss is null in strict JSON"
    assert len(get_json(api, "watch", limit=1)["jobs"]) == 1
    assert error_of(api, "watch", limit=0)[0] == 400


SLOW_LOADER_JOB = """
import signal, sys, time, torch
import workbench as wb
# Ctrl-C from the test raises KeyboardInterrupt here even when the suite runs in the background
# (`cmd &` starts it, and so this job, with SIGINT ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def loader():
    while True:
        time.sleep(0.03)  # the job's bottleneck: its data
        yield torch.randn(4, 8)

with wb.watch(model, opt, name="panel-job", store=sys.argv[1], flush_s=0.2, warmup=1) as w:
    for step, batch in zip(range(2000), w.batches(loader())):
        model(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        w.step()
"""


def test_a_post_asks_a_running_job_for_a_profiled_window_and_the_list_shows_its_finding(
    api: Callable[..., HTTPResponse], jp_fetch: Any, jp_asyncio_loop: Any, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    import signal

    path = tmp_path / "history.sqlite"
    monkeypatch.setenv("WORKBENCH_STORE", str(path))
    script = tmp_path / "job.py"
    script.write_text(SLOW_LOADER_JOB)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    job = subprocess.Popen([sys.executable, str(script), str(path)], env=env)

    def post(run: int, **params: Any) -> HTTPResponse:
        response: HTTPResponse = jp_asyncio_loop.run_until_complete(
            jp_fetch("workbench", "api", "watch", str(run), "profile", method="POST", body="", params=params or None)
        )
        return response

    try:
        jobs: list[dict[str, Any]] = []
        for _ in range(300):
            jobs = get_json(api, "watch")["jobs"] if path.exists() else []
            if jobs and jobs[0]["last_step"] >= 3:
                break
            time.sleep(0.1)
        run = jobs[0]["run_id"]
        assert json.loads(post(run, steps=3).body)["steps"] == 3
        shown = None
        for _ in range(300):
            shown = get_json(api, "watch")["jobs"][0]["profile"]
            if shown and shown["status"] in ("done", "failed"):
                break
            time.sleep(0.1)
        assert shown is not None and shown["status"] == "done" and shown["finding"] == "Data loading bound", shown
        assert "worker" in shown["fix"] and shown["last_step"] - shown["first_step"] == 2
        with pytest.raises(HTTPClientError) as bad:
            post(run, steps=0)
        assert bad.value.code == 400
        with pytest.raises(HTTPClientError) as unknown:
            post(run + 99)
        assert unknown.value.code == 404
    finally:
        job.send_signal(signal.SIGINT)
        job.wait(timeout=30)
    with pytest.raises(HTTPClientError) as ended:
        post(run)
    assert ended.value.code == 409 and b"only a running job" in (ended.value.response.body or b"")


def test_the_quickstart_template_is_served_with_outputs_cleared(api: Callable[..., HTTPResponse]) -> None:
    if not QUICKSTART.is_file():
        pytest.fail(f"{QUICKSTART} is missing: 'New tuning notebook' has nothing to copy")
    reply = get_json(api, "notebooks", "quickstart")
    assert reply["name"] == "01_quickstart.ipynb"
    notebook = reply["content"]
    source = json.loads(QUICKSTART.read_text())
    assert notebook["nbformat"] == 4 and len(notebook["cells"]) == len(source["cells"])
    assert [c["source"] for c in notebook["cells"]] == [c["source"] for c in source["cells"]]
    code_cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert code_cells and all(c["outputs"] == [] and c["execution_count"] is None for c in code_cells)


@pytest.mark.parametrize(
    "name", ["nope", "../../pyproject.toml", "..%2F..%2Fpyproject.toml", "/etc/passwd", "QUICKSTART"]
)
def test_only_allow_listed_templates_are_read(api: Callable[..., HTTPResponse], name: str) -> None:
    code, _ = error_of(api, "notebooks", name)
    assert code == 404


# --- authentication ---------------------------------------------------------------------


def test_a_post_without_the_token_is_refused(http_server_client: Any, jp_asyncio_loop: Any, jp_base_url: str) -> None:
    url = f"{jp_base_url}workbench/api/watch/1/profile"
    response = jp_asyncio_loop.run_until_complete(
        http_server_client.fetch(url, method="POST", body="", raise_error=False)
    )
    assert response.code == 403, response.body


@pytest.mark.parametrize("path", ["metrics", "capabilities", "runs", "watch", "notebooks/quickstart"])
def test_requests_without_the_token_are_refused(
    http_server_client: Any, jp_asyncio_loop: Any, jp_base_url: str, jp_serverapp: Any, path: str
) -> None:
    url = f"{jp_base_url}workbench/api/{path}"
    response = jp_asyncio_loop.run_until_complete(http_server_client.fetch(url, raise_error=False))
    assert response.code == 403, response.body
    assert b"cpu_pct" not in response.body and b"toggles" not in response.body
    assert not jp_serverapp.web_app.settings[FEED_SETTING].running, "a refused request must not start the sampler"


def test_every_route_verb_is_authenticated_and_the_check_catches_one_that_is_not() -> None:
    assert authcheck.unauthenticated_verbs(cls for _, cls in ROUTES) == []
    assert authcheck.main([]) == 0

    class Leaky(MetricsHandler):
        def post(self) -> None:  # no decorator: the check must name it
            pass

        @tornado.web.authenticated
        def put(self) -> None:
            pass

    assert authcheck.unauthenticated_verbs([Leaky], own=__name__) == [f"{__name__}.{Leaky.__qualname__}.post"]


def test_the_server_extension_does_not_import_torch() -> None:
    # The Jupyter server stays light: device probing runs in a child process (sources.py).
    code = "import sys, workbench.jupyter.handlers; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
    assert sources.TEMPLATES == {"quickstart": "01_quickstart.ipynb"}
