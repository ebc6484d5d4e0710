"""Parent side of a distributed trial: launch torchrun, relay rank 0's events, end it cleanly.

`run_trial` sends a config with strategy ddp/fsdp2 here. torchrun (`python -m
torch.distributed.run`, PyTorch's own launcher) starts the ranks in a new session, so one
signal ends torchrun, every rank and their loader workers. The ranks report through
per-rank files (`channel.py`): rank 0's events become this caller's `on_event` stream and its
final `TrialResult`; every rank reports its pid, its position each phase and its own exception.
A failed trial names the first rank to fail (`failures.py`): its exception, or the exit code or
signal torchrun recorded (`agent.py`) at the time this process saw it die (`exits.py`), with the
other ranks' echoes listed under it; a silent world (a hang) is killed after `timeout_s` with
the rank that fell behind named. Every rank's record is kept in `TrialResult.distributed`. Multi-node runs are not
launched from here: each node runs the command `export.to_command` prints.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, TrainConfig
from workbench.distributed.channel import RankReader
from workbench.distributed.command import AGENT_MODULE, FAILURE_RECORD_ENV, RANK_MODULE, torchrun_args
from workbench.distributed.exits import ExitWatch
from workbench.distributed.failures import (
    RankFailure,
    assemble_failures,
    explain_failures,
    hang_failures,
)
from workbench.measure.events import EventSink
from workbench.measure.follow import STARTUP_GRACE_S, EventRelay
from workbench.measure.lifeline import LAUNCHER_PID_ENV
from workbench.measure.request import TrialRequest
from workbench.measure.result import TrialResult
from workbench.measure.wire import workload_name
from workbench.workloads.base import Workload

DEFAULT_TIMEOUT_S = 300.0
"""Silence (no rank reports anything) that ends a distributed trial when the caller sets none:
distributed trials always have a timeout, because a hung rank blocks all the others."""
POLL_S = 0.05
KILL_GRACE_S = 3.0
LOG_TAIL_CHARS = 3000
SETTLE_S = 10.0
"""After the first sign of a failure, how long to wait for torchrun to end the other ranks and
write its record before deciding without it (a rank that ignores SIGTERM holds torchrun 30 s)."""
FAILURE_RECORD = "failures.json"
REQUEST_FILE = "request.json"
"""The trial's request in its wire form (`TrialRequest.to_wire`), which every rank reads."""
_WHERE = {
    "starting": "starting up (imports, process group)",
    "setup": "building the model and its data",
    "data": "loading data or in forward",
    "forward": "in backward",
    "backward": "in the optimizer step",
    "optimizer": "between steps",
    "profile": "in the profiled window",
}


def run_distributed_trial(
    request: TrialRequest, on_event: EventSink | None = None, cancel: threading.Event | None = None
) -> TrialResult:
    """Run `request.config` (strategy ddp/fsdp2) as `config.nproc_per_node` ranks on this node."""
    from workbench.device import device_info

    request = request.resolved()  # refuse bad input before paying for torchrun (once: the ranks trust it)
    config = request.config
    if request.isolation != "process":
        raise ConfigError(
            f"strategy={config.strategy} always runs in torchrun processes; isolation='inline' is for "
            "single-process debugging (set strategy=none, or isolation='process')"
        )
    if request.profile is not None:
        raise ConfigError(
            f"profile is not available with strategy={config.strategy} yet; a distributed trial always "
            "profiles a short window itself (compute vs communication in result.distributed)"
        )
    if config.nnodes > 1:
        raise ConfigError(
            f"nnodes={config.nnodes}: a multi-node trial is started on every node by torchrun, not from here; "
            "run the command `workbench export --format command` prints on each node"
        )
    timeout = float(request.timeout_s) if request.timeout_s is not None else DEFAULT_TIMEOUT_S
    dev = request.torch_device()
    _check_layout(request.workload, request.preset, config)
    directory = Path(tempfile.mkdtemp(prefix="workbench-dist-"))
    # The ranks' collective timeout is the parent's silence limit plus a minute, so the parent acts first.
    wire = replace(request, timeout_s=timeout + 60.0).to_wire()
    (directory / REQUEST_FILE).write_text(json.dumps(wire))
    command = rank_command(config, directory)
    log = open(directory / "torchrun.log", "wb")  # noqa: SIM115 - closed in finally, after the process
    env = {**rank_environment(config, dev.type), FAILURE_RECORD_ENV: str(directory / FAILURE_RECORD)}
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        relay = EventRelay(workload_name(request.workload), config, on_event)
        follower = _Follower(process, directory, config, relay, timeout)
        relay.partial.device = device_info(dev).to_dict()  # a timeout or crash still says where it ran
        result = follower.follow(cancel)
        if follower.finished is not None:
            _wait_quietly(process, KILL_GRACE_S * 3)  # the ranks tear down their group and exit
        if result.distributed is not None:
            result.distributed["command"] = shlex.join(command)
            result.distributed["launch_s"] = relay.started_s
        return result
    finally:
        _stop(process)
        log.close()
        shutil.rmtree(directory, ignore_errors=True)


def rank_command(config: TrainConfig, directory: Path) -> list[str]:
    """`python -m workbench.distributed.agent ... -m workbench.distributed --request ... --events ...`: torchrun
    (`torch.distributed.run` with its own arguments) that also records how each failed rank ended."""
    launcher = [sys.executable, "-m", AGENT_MODULE, *torchrun_args(config)]
    return [*launcher, "-m", RANK_MODULE, "--request", str(directory / REQUEST_FILE), "--events", str(directory)]


def rank_environment(config: TrainConfig, device_type: str) -> dict[str, str]:
    """The caller's environment, plus its import path (a notebook's modules must import in the
    ranks, as with spawn) and, on CPU, the cores shared out between the ranks."""
    env = dict(os.environ)
    env[LAUNCHER_PID_ENV] = str(os.getpid())  # the ranks end themselves (and torchrun) when we die
    package_root = str(Path(__file__).resolve().parents[2])
    paths = [package_root, *(p or os.getcwd() for p in sys.path), *env.get("PYTHONPATH", "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p and os.path.isdir(p)))
    if device_type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        env["OMP_NUM_THREADS"] = str(max(1, cores // config.nproc_per_node))
    return env


def _check_layout(workload: Workload | str, preset: str, config: TrainConfig) -> None:
    """The global batch must split evenly over the data shards, and the model over the tensor-parallel
    degree: refuse here, before any process starts."""
    from workbench.distributed.sharding import local_batch_size
    from workbench.levers.tensor_parallel import check_model_parallel
    from workbench.workloads import load_workload

    wl = load_workload(workload, preset=preset, **config.extra) if isinstance(workload, str) else workload
    local_batch_size(wl.effective_batch_size(config), config.nproc_per_node * config.nnodes // config.tensor_parallel)
    check_model_parallel(wl, config)


class _Follower:
    """Reads the ranks' reports until the trial finishes, fails, falls silent or is cancelled."""

    def __init__(
        self, process: subprocess.Popen[bytes], directory: Path, config: TrainConfig, relay: EventRelay, timeout: float
    ) -> None:
        self.process, self.directory, self.timeout, self.relay = process, directory, timeout, relay
        self.strategy = config.strategy
        self.readers = [RankReader(directory, rank) for rank in range(config.nproc_per_node)]
        self.positions: dict[int, tuple[int, str]] = {}
        self.ranks: dict[int, dict[str, Any]] = {}
        """What each rank said of itself at start: pid, host."""
        self.errors: dict[int, dict[str, Any]] = {}
        self.done: set[int] = set()
        self.exits = ExitWatch()

    @property
    def finished(self) -> TrialResult | None:
        return self.relay.finished

    def follow(self, cancel: threading.Event | None) -> TrialResult:
        try:
            return self._follow(cancel)
        finally:
            self.exits.close()

    def _follow(self, cancel: threading.Event | None) -> TrialResult:
        last_news = time.monotonic()
        failing_since: float | None = None
        while True:
            if cancel is not None and cancel.is_set():
                return self.relay.end("cancelled", "cancelled by the caller; torchrun and its ranks were stopped")
            exited = self.process.poll() is not None  # read *after* this, so nothing written is missed
            self.exits.wait(0)  # a rank writes before it exits: its last words are read below
            if self._read():
                last_news = time.monotonic()
            if self.relay.finished is not None:
                return self.relay.finished
            if failing_since is None and (self.errors or set(self.exits.ended) - self.done):
                failing_since = time.monotonic()  # the first sign; torchrun now ends the other ranks
            # Decide once torchrun has ended every rank and written its record (who died how), so
            # an echo reported first (a peer's "Connection reset") is not taken for the cause.
            if failing_since is not None and (exited or time.monotonic() - failing_since > SETTLE_S):
                return self._failed()
            if exited:  # without a word from any rank: torchrun's record, or its log
                return self._failed()
            allowed = self.timeout + (0.0 if self.positions else STARTUP_GRACE_S)
            if failing_since is None and time.monotonic() - last_news > allowed:
                return self._hung()
            self.exits.wait(POLL_S)  # wakes at once when a rank's process ends, to stamp the time

    def _read(self) -> bool:
        news = False
        for rank, reader in enumerate(self.readers):
            for message in reader.read():
                news = True
                self._handle(rank, message)
        return news

    def _handle(self, rank: int, message: tuple[Any, ...]) -> None:
        if self.relay.handle(message):
            return
        if message[0] == "progress":
            self.positions[rank] = (int(message[1]), str(message[2]))
        elif message[0] == "hello":
            self.ranks[rank] = {"pid": int(message[1]), "host": str(message[2])}
            self.exits.add(rank, int(message[1]))
        elif message[0] == "error":
            self.errors.setdefault(rank, dict(message[1]))
        elif message[0] == "done":
            self.done.add(rank)

    def _failed(self) -> TrialResult:
        """End with the first rank to fail named, and every rank's failure kept in `distributed`; with
        nothing known of any rank, with torchrun's exit code and the end of its log."""
        started = bool(self.ranks)
        for rank, (step, phase) in self.positions.items():
            self.ranks.setdefault(rank, {})["position"] = _position(step, phase)
        failures = assemble_failures(
            errors=self.errors, ended=self.exits.ended, torchrun=self._failure_record(), finished=self.done,
            ranks=self.ranks,
        )  # fmt: skip
        if not failures:
            return self.relay.end("error", self._exit_message())
        root, message = explain_failures(failures)
        if not started:  # they died starting up (an import): what they printed is all there is
            message += f"\n\ntorchrun's log ends:\n{self._log_tail()}"
        self._keep(failures, root)
        return self.relay.end("oom" if root.status == "oom" else "error", message)

    def _hung(self) -> TrialResult:
        message = self._silence_message()
        if self.positions:
            suspect = self._suspect()
            positions = {rank: _position(*where) for rank, where in self.positions.items()}
            failures = hang_failures(len(self.readers), suspect, positions, self.ranks)
            self._keep(failures, failures[suspect])
        return self.relay.end("timeout", message)

    def _keep(self, failures: list[RankFailure], root: RankFailure) -> None:
        """Per-rank records on the result (the store keeps `distributed` whole)."""
        self.relay.partial.distributed = {
            "strategy": self.strategy,
            "world_size": len(self.readers),
            "first_failed_rank": root.rank,
            "rank_failures": [failure.to_dict() for failure in failures],
        }

    def _failure_record(self) -> dict[int, dict[str, Any]]:
        """torchrun's record of the failed ranks (exit code or signal); empty until it has exited."""
        try:
            data = json.loads((self.directory / FAILURE_RECORD).read_text())
        except (OSError, ValueError):
            return {}
        return {int(rank): dict(entry) for rank, entry in data.items()}

    def _suspect(self) -> int:
        missing = [rank for rank in range(len(self.readers)) if rank not in self.positions]
        if missing:
            return missing[0]
        return min(self.positions, key=lambda rank: (self.positions[rank][0], _phase_order(self.positions[rank][1])))

    def _silence_message(self) -> str:
        if not self.positions:
            return (
                f"no rank reported within {self.timeout + STARTUP_GRACE_S:g} s of launch; "
                f"torchrun was stopped. Its log ends:\n{self._log_tail()}"
            )
        where = "; ".join(f"rank {rank} {_position(*at)}" for rank, at in sorted(self.positions.items()))
        behind = self._suspect()
        suspect = (
            f"rank {behind} never reported" if behind not in self.positions else f"rank {behind} is furthest behind"
        )
        return (
            f"no progress from any rank for {self.timeout:g} s; torchrun and its ranks were stopped. "
            f"{suspect}: the others wait for it in a collective. Last positions: {where}"
        )

    def _exit_message(self) -> str:
        return f"torchrun exited with code {self.process.returncode} before the trial finished; its log ends:\n{self._log_tail()}"

    def _log_tail(self) -> str:
        try:
            text = (self.directory / "torchrun.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return text[-LOG_TAIL_CHARS:].strip() or "(empty log)"


def _position(step: int, phase: str) -> str:
    return f"{f'at step {step}, ' if step >= 0 else ''}{_WHERE.get(phase, phase)}"


def _phase_order(phase: str) -> int:
    order = list(_WHERE)
    return order.index(phase) if phase in order else len(order)


def _wait_quietly(process: subprocess.Popen[bytes], seconds: float) -> None:
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass  # _stop ends it


def _stop(process: subprocess.Popen[bytes]) -> None:
    """End torchrun's whole session (ranks, loader workers): SIGTERM, a grace period, SIGKILL."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            try:  # torchrun is gone; anything left in its group (a stuck rank) goes too
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break
