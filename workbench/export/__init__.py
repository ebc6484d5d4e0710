"""Take a configuration away: a paste-able plain-PyTorch snippet, JSON, or the CLI command.

One module per job: `snippet` (assembled from the levers' fragments), `jsonfmt`, `command`
and `nvtx` (the snippet's profiling ranges).
"""

from __future__ import annotations

from typing import Any

from workbench.callable_module import make_callable
from workbench.config import ConfigError, TrainConfig
from workbench.export.command import to_command
from workbench.export.jsonfmt import to_json
from workbench.export.nvtx import with_nvtx_ranges
from workbench.export.snippet import to_snippet
from workbench.levers.fragment import LINE_LENGTH

FORMATS = ("snippet", "json", "command")

__all__ = ["FORMATS", "LINE_LENGTH", "export_config", "to_command", "to_json", "to_snippet", "with_nvtx_ranges"]


def export_config(config: TrainConfig, fmt: str, **kwargs: Any) -> str:
    """`config` as a snippet, JSON or command line; `kwargs` go to the chosen exporter."""
    exporters = {"snippet": to_snippet, "json": to_json, "command": to_command}
    if fmt not in exporters:
        raise ConfigError(f"export format {fmt!r} is not valid; choose one of: {', '.join(FORMATS)}")
    return exporters[fmt](config, **kwargs)


make_callable(__name__, export_config)  # wb.export(config, "snippet"): the module is the public function
