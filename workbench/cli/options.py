"""The options several commands share (the trial window, the run history, the comparison
protocol, `--set`) and the one reading of each into the API's arguments.

Defaults are read from the objects that own them (`TrialRequest` for the window, `Protocol`
for the comparison), so the help text, the app and the API cannot drift apart.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from workbench.config import ConfigError, TrainConfig
from workbench.measure.request import TrialRequest
from workbench.protocol import Protocol
from workbench.workloads.registry import DEFAULT_WORKLOAD, PRESETS

EXIT_FAILED_TRIAL = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit code 2."""


def add_set_arg(p: argparse.ArgumentParser, help: str | None = None) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V[,K=V]", help=help)


def add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, help="built-in name or package.module:function")
    p.add_argument("--preset", default="tiny", choices=PRESETS)


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when present)")


def add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress line")


def add_trial_args(
    p: argparse.ArgumentParser, steps: int = TrialRequest.steps, steps_help: str = "timed steps"
) -> None:
    """The trial window; its defaults are `TrialRequest`'s, the same as the API's and the app's."""
    add_workload_args(p)
    p.add_argument("--steps", type=int, default=steps, help=f"{steps_help} (default {steps})")
    add_warmup_arg(p)
    add_device_arg(p)
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="end a trial that makes no progress for S seconds once started (status 'timeout'); "
                        "the worker's start-up gets 60 s more")  # fmt: skip
    add_output_args(p)


def add_warmup_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--warmup", type=int, default=TrialRequest.warmup,
                   help=f"untimed warm-up steps (default {TrialRequest.warmup})")  # fmt: skip


def add_store_arg(p: argparse.ArgumentParser, saving: bool = False) -> None:
    p.add_argument("--store", default=None, metavar="PATH",
                   help="run history file (default: $WORKBENCH_STORE, else the user data dir)")  # fmt: skip
    if saving:
        p.add_argument("--no-store", action="store_true", help="do not save the trials to the run history")


def store_arg(args: argparse.Namespace) -> Any:
    """The API's `store=` for these flags: None with --no-store, a path with --store, else the default."""
    from workbench.store import DEFAULT_STORE

    if getattr(args, "no_store", False):
        return None
    return args.store or DEFAULT_STORE


def add_protocol_args(p: argparse.ArgumentParser, budget_s: float = Protocol.budget_s, design: bool = True) -> None:
    """The comparison protocol's controls (`workbench.protocol.Protocol`), with its defaults."""
    add_precision_arg(p, help=f"stop when every speedup interval is within ±F (default {Protocol.precision:g} = "
                              f"±{Protocol.precision * 100:g}%%)")  # fmt: skip
    p.add_argument("--budget", type=float, default=budget_s, metavar="S",
                   help=f"seconds the comparison may take before it stops adding rounds (default {budget_s:g})")  # fmt: skip
    if design:  # regress always measures fresh processes: its other side is stored
        p.add_argument("--design", default=Protocol.design, choices=("auto", "paired", "processes"),
                       help="auto: paired rounds where honest, else one fresh process per unit")  # fmt: skip
        p.add_argument("--paired-workers", type=int, default=None, metavar="N",
                       help="paired design: workers the rounds rotate between, so no one worker's bias decides "
                            f"(default {Protocol.paired_workers}; 1 saves a worker's memory)")  # fmt: skip
    p.add_argument("--confidence", type=float, default=Protocol.confidence,
                   help=f"interval confidence (default {Protocol.confidence:g})")  # fmt: skip


def add_precision_arg(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--precision", type=float, default=Protocol.precision, metavar="F", help=help)


def protocol_from(args: argparse.Namespace, **fixed: Any) -> Protocol:
    """The `Protocol` these flags ask for; `fixed` sets what the command decides itself."""
    if getattr(args, "paired_workers", None) is not None:
        fixed = {"paired_workers": args.paired_workers, **fixed}
    return Protocol(precision=args.precision, budget_s=args.budget, design=getattr(args, "design", "processes"),
                    confidence=args.confidence, **fixed)  # fmt: skip


def config_from(overrides: Sequence[str], base: TrainConfig | None = None) -> TrainConfig:
    """Every --set at once, validated together: `--set prefetch_factor=4 --set num_workers=2` is one
    valid configuration, whatever the order (later flags win for the same field)."""
    from workbench.config import parse_overrides

    config = base or TrainConfig()
    changes: dict[str, Any] = {}
    for text in overrides:
        parsed = parse_overrides(text)
        extra = {**changes.get("extra", {}), **parsed.pop("extra", {})}
        changes.update(parsed)
        if extra:
            changes["extra"] = extra
    if "extra" in changes:
        changes["extra"] = {**config.extra, **changes["extra"]}
    return config.replace(**changes)


def check_on_device(configs: Sequence[TrainConfig], device: str | None, labels: Sequence[str]) -> None:
    """Refuse any configuration this device cannot run before the first trial measures (and stores) anything."""
    from workbench.device import resolve_device
    from workbench.levers import check_config

    dev = resolve_device(device)
    for config, label in zip(configs, labels):
        try:
            check_config(config, dev)
        except ConfigError as exc:
            raise ConfigError(f"{label}: {exc}") from None
