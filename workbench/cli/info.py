"""`workbench export`, `workbench workloads` and `workbench capabilities`: commands that measure nothing."""

from __future__ import annotations

import argparse
import json
from typing import Any

from workbench.cli.options import UsageError, add_set_arg, config_from
from workbench.workloads.registry import DEFAULT_WORKLOAD, PRESETS


def add_commands(sub: Any) -> None:
    export = sub.add_parser("export", help="write a configuration as a Python snippet, JSON or a command line")
    add_set_arg(export)
    export.add_argument("--format", default="snippet", choices=("snippet", "json", "command"))
    export.add_argument("--device", default="cuda", help="device the snippet targets (default cuda)")
    export.add_argument("--workload", default=DEFAULT_WORKLOAD, help="for --format command")
    export.add_argument("--preset", default="tiny", choices=PRESETS, help="for --format command")
    export.add_argument("--nvtx", action="store_true",
                        help="snippet: wrap each step and phase in NVTX ranges (Nsight Systems shows them)")  # fmt: skip
    export.set_defaults(handler=_cmd_export)

    workloads = sub.add_parser("workloads", help="list built-in workloads")
    workloads.add_argument("--json", action="store_true")
    workloads.set_defaults(handler=_cmd_workloads)

    caps = sub.add_parser("capabilities", help="what this device supports, with reasons")
    caps.add_argument("--device", default=None)
    caps.add_argument("--json", action="store_true")
    caps.set_defaults(handler=_cmd_capabilities)


def _cmd_export(args: argparse.Namespace) -> int:
    from workbench.export import export_config

    config = config_from(args.overrides)
    if args.nvtx and args.format != "snippet":
        raise UsageError(f"--nvtx marks the snippet's steps; it does not apply to --format {args.format}")
    if args.format == "snippet":
        print(export_config(config, "snippet", device=args.device, nvtx=args.nvtx))
    elif args.format == "command":
        from workbench.workloads import load_workload

        load_workload(args.workload, preset=args.preset, **config.extra)  # a command that cannot run is no export
        print(export_config(config, "command", workload=args.workload, preset=args.preset))
    else:
        print(export_config(config, "json"))
    return 0


def _cmd_workloads(args: argparse.Namespace) -> int:
    from workbench.textfmt import table
    from workbench.workloads import builtin_workloads

    items = builtin_workloads()
    if args.json:
        print(
            json.dumps(
                [{"name": w.name, "description": w.description, "presets": list(PRESETS)} for w in items.values()],
                indent=2,
            )
        )
        return 0
    print(
        table(
            ["workload", "presets", "description"], [[w.name, "/".join(PRESETS), w.description] for w in items.values()]
        )
    )
    print("\nYour own: --workload package.module:function (returning a workbench Workload).")
    return 0


def _cmd_capabilities(args: argparse.Namespace) -> int:
    from workbench.levers import capabilities_report

    report = capabilities_report(args.device)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    from workbench.textfmt import format_bytes, table

    dev = report["device"]
    print(
        f"{dev['type']}: {dev['name']} (x{dev['count']}, {dev['cpu_cores']} CPU cores, memory {format_bytes(dev['total_memory_bytes'])})"
    )
    rows: list[list[Any]] = []
    for name, values in report["toggles"].items():
        for value, availability in values.items():
            mark = "yes" if availability["available"] else "NO"
            rows.append([f"{name}={value}", mark, availability["reason"]])
    print(table(["toggle", "available", "reason / note"], rows))
    return 0
