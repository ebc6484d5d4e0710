"""`python -m workbench.distributed`: what every rank runs under torchrun.

Two ways in. The launcher (`run_trial` with strategy ddp/fsdp2) passes `--request` (the
trial's request in its wire form, resolved and checked by the launcher) and `--events` (the directory each rank reports into). On a cluster, the
command `export.to_command` prints runs the same code on every node with `--workload`/`--set`
arguments; rank 0 then prints the summary and writes `--out` JSON. Every rank reports its own
failure before exiting, so the parent can name the rank that broke the trial. Launched by the
launcher, a rank ends itself, its siblings and torchrun when the launcher dies (`lifeline`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.config import ConfigError
from workbench.distributed.channel import RankWriter
from workbench.measure.arguments import add_set_arg, add_window_args, request_from
from workbench.measure.outcome import status_of
from workbench.measure.request import TrialRequest
from workbench.workloads.base import WorkloadError

EXIT_INPUT_ERROR = 2
PG_TIMEOUT_S = 600.0
"""Collective timeout when no trial timeout is given: a rank left alone in a collective fails
after this long instead of waiting forever (torchrun then ends the others)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workbench.distributed", description=__doc__)
    parser.add_argument("--request", help="the trial in its wire form (TrialRequest.to_wire): a JSON file or text")
    parser.add_argument("--events", help="directory the ranks report into (launcher only)")
    add_window_args(parser)
    add_set_arg(parser)
    parser.add_argument("--out", help="rank 0 writes the TrialResult JSON here")
    parser.add_argument("--timeout", type=float, default=None, help="collective timeout in seconds")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "-1"))
    if rank < 0:
        print("python -m workbench.distributed runs under torchrun (see workbench export --format command)")
        return EXIT_INPUT_ERROR
    from workbench.measure.lifeline import end_with_launcher_from_env

    end_with_launcher_from_env()  # a killed launcher must not leave the ranks holding the devices
    writer = RankWriter(args.events, rank) if args.events else None
    send = writer.send if writer is not None else (lambda message: None)
    # Who this rank is, so the parent can see its process end if it dies without a word (a signal).
    send(("hello", os.getpid(), socket.gethostname(), time.time()))
    send(("progress", -1, "starting", time.time()))  # alive: the parent's start-up allowance ends
    try:
        code = _run(args, rank, send, standalone=writer is None)
        send(("done", code, time.time()))  # this rank's exit that follows is not a failure
        return code
    except (ConfigError, WorkloadError) as exc:
        send(("input_error", type(exc).__name__, str(exc), time.time()))
        if rank == 0 or writer is None:
            print(f"workbench distributed: error: {exc}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except BaseException as exc:
        send(("error", _failure_report(exc)))
        raise  # torchrun sees the failure and ends the other ranks
    finally:
        if writer is not None:
            writer.close()


def _run(args: argparse.Namespace, rank: int, send: Any, standalone: bool) -> int:
    import torch
    import torch.distributed as dist

    from workbench.distributed.rank_trial import RankContext, run_rank_trial

    request = _request(args)
    config = request.config
    device_type = torch.device(request.device).type if request.device is not None else None
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    if request.memory_limit_bytes:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (request.memory_limit_bytes, request.memory_limit_bytes))
    ctx = RankContext.from_env(device_type)
    expected = config.nproc_per_node * config.nnodes
    if expected != ctx.world_size:
        raise ConfigError(
            f"the config asks for nproc_per_node x nnodes = {expected} ranks, but torchrun started {ctx.world_size}; "
            "pass the same --nproc_per_node/--nnodes to torchrun as in the config"
        )
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    timeout = datetime.timedelta(seconds=request.timeout_s or PG_TIMEOUT_S)
    if ctx.device.type == "cuda":  # bind the NCCL communicator to this rank's GPU up front
        dist.init_process_group(ctx.backend, timeout=timeout, device_id=ctx.device)
    else:
        dist.init_process_group(ctx.backend, timeout=timeout)
    send(("progress", -1, "setup", time.time()))
    progress = (lambda step, phase: send(("progress", step, phase, time.time()))) if not standalone else _no_progress
    result = run_rank_trial(request, ctx, emit=_event_sink(rank, send, standalone), progress=progress)
    # Only after success: tearing down beside a failed peer can block (NCCL), and torchrun
    # ends a failed world anyway.
    dist.destroy_process_group()
    if standalone and rank == 0:
        _report(result, args.out)
    return 0 if result.ok or not standalone else 1


def _request(args: argparse.Namespace) -> TrialRequest:
    """The trial: the launcher's wire form (`--request`, a file or JSON text), or the command line's
    options read the way `workbench run` reads them (the command `export.to_command` prints)."""
    if args.request:
        text = args.request if args.request.lstrip().startswith("{") else Path(args.request).read_text()
        return TrialRequest.from_wire(json.loads(text))
    return request_from(args, timeout_s=args.timeout)


def _event_sink(rank: int, send: Any, standalone: bool) -> Any:
    """Rank 0's events go to the parent (launcher) or to a progress line (torchrun by hand)."""
    if rank != 0:
        return lambda event: None
    if not standalone:
        return lambda event: send(("event", event))
    from workbench.progress import ProgressLine

    return ProgressLine()


def _no_progress(step: int, phase: str) -> None:
    """Without a parent there is nobody to tell where this rank is."""


def _report(result: Any, out: str | None) -> None:
    from workbench.distributed.stats import rank_rows
    from workbench.terminal import run_summary

    print(run_summary(result))
    for row in rank_rows(result):
        compute = row.get("compute_ms")
        comm = f", compute {compute:.1f} ms, comm {row['comm_ms']:.1f} ms" if compute is not None else ""
        median = row.get("median_step_ms")
        print(f"rank {row['rank']:>3} on {row['host']}: median step {median or 0:.1f} ms{comm}")
    if out:
        with open(out, "w") as fh:
            fh.write(result.to_json(indent=2))


def _failure_report(exc: BaseException) -> dict[str, Any]:
    """This rank's exception as the parent's failure record wants it (`failures.RankFailure`)."""
    import sysconfig

    from workbench.distributed.failures import raise_site

    torch_module = sys.modules.get("torch")
    skip = [os.path.dirname(torch_module.__file__ or "") if torch_module else "", sysconfig.get_paths()["stdlib"]]
    return {
        "time": time.time(),
        "status": status_of(exc)[0],
        "exception": f"{type(exc).__name__}: {exc}".strip(),
        "where": raise_site(traceback.extract_tb(exc.__traceback__), skip),
        "traceback": traceback.format_exc(),
    }
