"""Jupyter server extension: the workbench's JSON API behind Jupyter's own authentication.

Loaded automatically when the package is installed (`jupyter-config/` puts
`workbench.jupyter` in `jpserver_extensions`). Handlers live in `handlers.py`, what they
serve in `feed.py` and `sources.py`. Only this package imports jupyter_server/tornado,
so the core library stays importable without Jupyter.
"""

from __future__ import annotations

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """Tell jupyter_server which module holds `_load_jupyter_server_extension`."""
    return [{"module": "workbench.jupyter"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Register the routes on the server's web app (called once per server start)."""
    from workbench.jupyter.handlers import setup_handlers

    setup_handlers(serverapp.web_app)
    serverapp.log.info("Training Workbench API at %sworkbench/api/", serverapp.web_app.settings.get("base_url", "/"))


# Older jupyter_server/notebook names for the same hook.
load_jupyter_server_extension = _load_jupyter_server_extension
