"""HTTP handlers and the one route table of the workbench API, under `{base_url}workbench/api/`.

Every verb carries `@tornado.web.authenticated` (`scripts/check-auth` fails CI otherwise),
so a request without the server's token or cookie gets 403 before any handler code runs.
Handlers only parse query arguments and write JSON; what they serve comes from
`feed.py` and `sources.py`. No argument is ever used as a path or as code. One write, and only
one: `POST watch/<run>/profile` adds a profile request row to the run history (the watched job
takes it at its next flush); Jupyter's XSRF check guards it like any POST.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from workbench.jupyter import sources
from workbench.jupyter.feed import DEFAULT_WINDOW_S, MAX_WINDOW_S, MetricsFeed

API_PREFIX = "workbench/api"
FEED_SETTING = "workbench_metrics_feed"
MAX_RUNS = 500


class _WorkbenchHandler(APIHandler):
    """Shared helpers: bounded numeric query arguments and JSON replies."""

    def float_arg(self, name: str, default: float | None, low: float, high: float) -> float | None:
        raw = self.get_query_argument(name, None)
        if raw is None or raw == "":
            return default
        try:
            value = float(raw)
        except ValueError:
            raise tornado.web.HTTPError(400, reason=f"{name} must be a number, got {raw[:40]!r}") from None
        if not low <= value <= high:
            raise tornado.web.HTTPError(400, reason=f"{name} must be between {low:g} and {high:g}, got {value:g}")
        return value

    def reply(self, payload: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(payload, allow_nan=False))

    def fail(self, error: sources.SourceError) -> None:
        self.set_status(error.status)
        self.reply({"message": str(error)})


class MetricsHandler(_WorkbenchHandler):
    """Latest device sample and the history after `since` (Unix s), at most `window` s back."""

    @tornado.web.authenticated
    async def get(self) -> None:
        since = self.float_arg("since", None, 0.0, 1e12)
        window = self.float_arg("window", DEFAULT_WINDOW_S, 0.1, MAX_WINDOW_S) or DEFAULT_WINDOW_S
        feed: MetricsFeed = self.settings[FEED_SETTING]
        # In a thread: the first request opens NVML and starts the sampler, and a full window is
        # thousands of samples to copy — neither should stall the server's event loop.
        self.reply(await asyncio.to_thread(feed.snapshot, since=since, window_s=window))


class CapabilitiesHandler(_WorkbenchHandler):
    """`workbench capabilities --json`: the device and every toggle value's availability with a reason."""

    @tornado.web.authenticated
    async def get(self) -> None:
        try:
            self.reply(await sources.capabilities())
        except sources.SourceError as error:
            self.fail(error)


class RunsHandler(_WorkbenchHandler):
    """The newest stored trials from the run store (`limit`, default 50), newest first."""

    @tornado.web.authenticated
    async def get(self) -> None:
        limit = int(self.float_arg("limit", 50, 1, MAX_RUNS) or 50)
        try:
            self.reply(await asyncio.to_thread(sources.list_runs, limit))
        except sources.SourceError as error:
            self.fail(error)


class WatchHandler(_WorkbenchHandler):
    """The newest watched jobs (`limit`, default 20) with their state and newest step."""

    @tornado.web.authenticated
    async def get(self) -> None:
        limit = int(self.float_arg("limit", 20, 1, MAX_RUNS) or 20)
        try:
            self.reply(await asyncio.to_thread(sources.list_watched, limit))
        except sources.SourceError as error:
            self.fail(error)


class WatchProfileHandler(_WorkbenchHandler):
    """`POST watch/<run id>/profile?steps=N`: ask a running watched job to profile its next N steps."""

    @tornado.web.authenticated
    async def post(self, run_id: str) -> None:
        steps = int(self.float_arg("steps", 5, 1, 50) or 5)
        try:
            self.reply(await asyncio.to_thread(sources.request_watch_profile, int(run_id), steps))
        except sources.SourceError as error:
            self.fail(error)


class NotebookTemplateHandler(_WorkbenchHandler):
    """A packaged notebook (nbformat JSON) by template name, for "New tuning notebook"."""

    @tornado.web.authenticated
    def get(self, name: str) -> None:
        try:
            self.reply(sources.notebook_template(name))
        except sources.SourceError as error:
            self.fail(error)


#: The route table: (path under `{base_url}workbench/api/`, handler). The only place routes are declared.
ROUTES: list[tuple[str, type[APIHandler]]] = [
    ("metrics", MetricsHandler),
    ("capabilities", CapabilitiesHandler),
    ("runs", RunsHandler),
    ("watch", WatchHandler),
    (r"watch/([0-9]+)/profile", WatchProfileHandler),
    (r"notebooks/([a-z0-9_-]+)", NotebookTemplateHandler),
]


def setup_handlers(web_app: tornado.web.Application, feed: MetricsFeed | None = None) -> MetricsFeed:
    """Add the routes under the server's base_url (so a `/user/<name>/` prefix just works)."""
    base_url = web_app.settings.get("base_url", "/")
    feed = feed or MetricsFeed()
    web_app.settings[FEED_SETTING] = feed
    handlers = [(url_path_join(base_url, API_PREFIX, path) + "/?$", handler) for path, handler in ROUTES]
    web_app.add_handlers(".*$", handlers)
    return feed
