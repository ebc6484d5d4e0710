"""A config as indented JSON: every field, loadable with `TrainConfig.from_json`."""

from __future__ import annotations

import json

from workbench.config import ConfigError, TrainConfig


def to_json(config: TrainConfig) -> str:
    """Indented JSON of every field; `TrainConfig.from_json` loads it back."""
    try:
        return json.dumps(config.to_dict(), indent=2)
    except TypeError as exc:  # only `extra` can hold arbitrary objects
        raise ConfigError(f"extra holds a value JSON cannot store: {exc}") from None
