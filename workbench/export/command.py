"""The command line that measures a config: `workbench run --set ...`, or torchrun around it."""

from __future__ import annotations

import json
import shlex
from typing import Any

from workbench.config import ConfigError, TrainConfig, field_names, parse_overrides
from workbench.measure.request import TrialRequest
from workbench.workloads.registry import DEFAULT_WORKLOAD


def to_command(
    config: TrainConfig,
    *,
    workload: str = DEFAULT_WORKLOAD,
    preset: str = TrialRequest.preset,
    steps: int = TrialRequest.steps,
    warmup: int = TrialRequest.warmup,
    nproc_per_node: int | None = None,
) -> str:
    """The `workbench run` command that measures `config` (one `--set` per non-default field).

    With `nproc_per_node`, the `torchrun` form that starts one worker per process. A config
    with strategy ddp/fsdp2 gives the command every node runs: `torchrun` with the config's
    rendezvous arguments (`--standalone` on one node) around `-m workbench.distributed`, the
    rank entry point. Fields are emitted in declaration order; the CLI reads every `--set`
    together and validates the result, as this function checks it reads back.
    """
    if config.launches_ranks:
        from workbench.distributed.command import RANK_MODULE, torchrun_args

        if nproc_per_node is not None and nproc_per_node != config.nproc_per_node:
            raise ConfigError(
                f"nproc_per_node={nproc_per_node} disagrees with the config's {config.nproc_per_node}; "
                "set it in the config (nproc_per_node=...) for a distributed strategy"
            )
        head = ["torchrun", *torchrun_args(config), "-m", RANK_MODULE]
    elif nproc_per_node is None:
        head = ["workbench", "run"]
    elif isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ConfigError(f"nproc_per_node must be a positive integer, got {nproc_per_node!r}")
    else:
        head = ["torchrun", f"--nproc_per_node={nproc_per_node}", "-m", "workbench.cli", "run"]
    argv = [*head, "--workload", workload, "--preset", preset]
    argv += ["--steps", str(steps), "--warmup", str(warmup)]
    changes: dict[str, Any] = {}
    for item in _override_items(config):
        try:  # read back as the CLI will: a comma or edge whitespace in a value does not survive
            changes.update(parse_overrides(item))
        except ConfigError as exc:
            raise ConfigError(f"--set {item!r} would not parse back ({exc}); export as JSON instead") from None
        argv += ["--set", item]
    try:  # the CLI validates every --set together, so fields that need each other may come in any order
        rebuilt = TrainConfig().replace(**changes)
    except ConfigError as exc:
        raise ConfigError(f"these --set overrides would not parse back ({exc}); export as JSON instead") from None
    if rebuilt != config:
        diff = ", ".join(f"{k}: {v[1]!r} would become {v[0]!r}" for k, v in rebuilt.diff(config).items())
        raise ConfigError(f"this config cannot be written as --set overrides ({diff}); export as JSON instead")
    return " ".join(shlex.quote(arg) for arg in argv)


def _override_items(config: TrainConfig) -> list[str]:
    """'name=value' for each non-default field, in declaration order; extra as 'extra.KEY=VALUE'."""
    changed = TrainConfig().diff(config)
    items: list[str] = []
    for name in field_names():
        if name not in changed:
            continue
        if name == "extra":
            # One --set for all entries: a --set replaces the whole extra dict, it does not merge.
            items.append(",".join(f"extra.{key}={_extra_text(value)}" for key, value in config.extra.items()))
        else:
            items.append(f"{name}={cli_text(getattr(config, name))}")
    return items


def cli_text(value: Any) -> str:
    """A field value as `parse_value` reads it back: true/false, none, numbers, bare strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value is None else str(value)


def _extra_text(value: Any) -> str:
    """An extra value as `parse_overrides` reads it back: JSON, except strings JSON would not parse."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError:
            return value  # stays a string when parsed back; no quotes needed
    return json.dumps(value)
