"""The trial's command-line options, declared once: `workbench run/compare/...` and the torchrun
rank entry (`python -m workbench.distributed`, the cluster command `export` prints) read the
same flags the same way, with `TrialRequest`'s defaults.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from workbench.config import TrainConfig, parse_overrides
from workbench.measure.request import TrialRequest
from workbench.workloads.registry import DEFAULT_WORKLOAD, PRESETS


def add_set_arg(p: argparse.ArgumentParser, help: str | None = None) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V[,K=V]", help=help)


def add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, help="built-in name or package.module:function")
    p.add_argument("--preset", default=TrialRequest.preset, choices=PRESETS)


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when present)")


def add_warmup_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--warmup", type=int, default=TrialRequest.warmup,
                   help=f"untimed warm-up steps (default {TrialRequest.warmup})")  # fmt: skip


def add_window_args(
    p: argparse.ArgumentParser, steps: int = TrialRequest.steps, steps_help: str = "timed steps"
) -> None:
    """What is measured and for how long: workload, preset, steps, warm-up, device."""
    add_workload_args(p)
    p.add_argument("--steps", type=int, default=steps, help=f"{steps_help} (default {steps})")
    add_warmup_arg(p)
    add_device_arg(p)


def config_from(overrides: Sequence[str], base: TrainConfig | None = None) -> TrainConfig:
    """Every --set at once, validated together: `--set prefetch_factor=4 --set num_workers=2` is one
    valid configuration, whatever the order (later flags win for the same field)."""
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


def request_from(args: argparse.Namespace, **options: Any) -> TrialRequest:
    """The trial these flags ask for (`add_window_args` and `--set`), with `options` on top."""
    return TrialRequest.of(args.workload, config_from(args.overrides), warmup=args.warmup, steps=args.steps,
                           preset=args.preset, device=args.device, **options)  # fmt: skip
