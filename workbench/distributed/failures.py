"""Which rank broke a distributed trial, and how: pure functions over what each rank left behind.

When one rank dies, the others fail soon after with errors that are only its echo (a gloo
"Connection reset by peer", an aborted NCCL communicator, a collective that timed out), and
the echo can even be reported first: a rank's own exception carries the time it was raised,
while a rank killed by a signal cannot say anything and is only seen gone a moment later.
So time alone cannot pick the culprit. The rule here: a communication error that matches one
of `CONSEQUENCE_PATTERNS`, or a SIGTERM after another rank failed (torchrun stopping the rest),
is never the root cause while another rank failed in a way of its own (an exception of its
own, an exit code, a signal); among those, the earliest is.
No torch import: the launcher and the tests use this on plain data.
"""

from __future__ import annotations

import dataclasses
import signal
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CONSEQUENCE_PATTERNS: tuple[tuple[str, str], ...] = (
    # gloo's TCP transport (pair.cc) when the peer's process is gone: its socket was closed or reset.
    ("connection reset by peer", "its connection to a rank that died was reset"),
    ("connection closed by peer", "its connection to a rank that died was closed"),
    ("broken pipe", "it wrote to a rank that had died"),
    ("connection refused", "it could not reach a rank that had died"),
    # The c10d TCPStore client when the store's host went away mid-request.
    ("failed to recv, got 0 bytes", "the rendezvous store went away"),
    # gloo's collective timeout: "Timed out waiting 1800000ms for recv operation to complete".
    ("timed out waiting", "a collective timed out waiting for another rank"),
    # ProcessGroupNCCL: the watchdog aborts the communicator after a peer's failure or a timeout.
    ("communicator was aborted", "its NCCL communicator was aborted after another rank failed"),
    ("watchdog caught collective operation timeout", "a collective timed out waiting for another rank"),
    ("some nccl operations have failed or timed out", "a collective failed or timed out with another rank"),
    # ncclRemoteError's own wording.
    ("remote process exited or there was a network error", "NCCL lost a rank that had died"),
)
"""(lower-case fragment of an error, why it is only a consequence). Matched against the
exception's message only, never a traceback (a frame's source line could match)."""

COMM_ERROR_TYPES = ("RuntimeError", "DistError", "DistBackendError", "DistNetworkError", "DistStoreError")
"""What gloo, NCCL and the c10d store raise into Python (torch.distributed's Dist*Error, RuntimeError)."""

_SIGNAL_WORDS = {
    "SIGSEGV": "segmentation fault",
    "SIGBUS": "bus error",
    "SIGFPE": "arithmetic error",
    "SIGILL": "illegal instruction",
    "SIGABRT": "aborted by native code: a failed check or std::terminate, often a CUDA or NCCL error",
    "SIGTERM": "asked to stop: by torchrun after another rank failed, a job scheduler or a user",
    "SIGINT": "interrupted",
}
STOPPED = "stopped when the job ended after an earlier failure"


def consequence_of(error: str) -> str | None:
    """Why `error` (an exception's "Type: message") only echoes another rank's failure; None if it does not.

    Only the types torch's collectives and store raise can be echoes: a user's own
    `ConnectionRefusedError` (say, from a data server) is a failure of its own.
    """
    kind, _, message = error.partition(":")
    if kind.strip() not in COMM_ERROR_TYPES:
        return None
    text = message.lower()
    return next((why for fragment, why in CONSEQUENCE_PATTERNS if fragment in text), None)


def describe_exit(exitcode: int) -> str:
    """A process's end in words: "exit code 7", "killed by signal SIGSEGV (segmentation fault)"."""
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        return f"killed by signal {-exitcode}"
    if name == "SIGKILL":  # nobody can catch it: the kernel's OOM killer or someone's kill -9
        return "killed by SIGKILL (the OOM killer or an external kill)"
    words = _SIGNAL_WORDS.get(name) or (signal.strsignal(-exitcode) or name).lower()
    return f"killed by signal {name} ({words})"


@dataclass
class RankFailure:
    """How one rank ended a failed (or hung) distributed trial: what `TrialResult.distributed` keeps."""

    rank: int
    how: str
    """'exception' (it raised), 'exit' (an exit code, no exception), 'signal', 'ended' (gone, how
    unknown), 'hung' (it stopped reporting) or 'waiting' (blocked on a hung rank)."""
    died_at: float | None = None
    """time.time() of its death: the rank's own clock for an exception; when the launcher saw its
    process end for an exit or a signal; None while alive (hung, waiting)."""
    exception: str | None = None
    """'Type: message' of the exception it raised."""
    where: str | None = None
    """'file:line in function' where that exception was raised (the innermost frame outside torch)."""
    traceback: str | None = None
    exitcode: int | None = None
    """The process's exit code as torchrun saw it: negative for a signal."""
    pid: int | None = None
    host: str | None = None
    position: str | None = None
    """Where it last reported being (step and phase)."""
    status: str = "error"
    """The trial status it stands for: 'error', 'oom' or 'timeout'."""
    consequence: str | None = None
    """Why this failure is an echo of another rank's, or None for a failure of its own."""

    @property
    def cause(self) -> str:
        """How it failed, in words: its exception and where, or its exit code or signal."""
        if self.how == "exception" and self.exception:
            first_line = (self.exception.splitlines() or [""])[0]
            return first_line + (f", at {self.where}" if self.where else "")
        if self.exitcode is not None:
            return describe_exit(self.exitcode)
        if self.how == "hung":
            return f"stopped reporting ({self.position})" if self.position else "never reported"
        if self.how == "waiting":
            return f"waiting ({self.position})" if self.position else "waiting"
        return "its process ended without an error or an exit code reported"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankFailure:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def first_failure(failures: Iterable[RankFailure]) -> RankFailure:
    """The root cause: the earliest failure of its own; only when every failure is an echo or a
    stop (`stopped_by_the_end`), the earliest of those."""
    ranked = list(failures)
    if not ranked:
        raise ValueError("first_failure needs at least one failure")
    own = [f for f in ranked if f.consequence is None and not stopped_by_the_end(f, ranked)]
    return min(own or ranked, key=lambda f: (f.died_at if f.died_at is not None else float("inf"), f.rank))


def stopped_by_the_end(failure: RankFailure, failures: Iterable[RankFailure]) -> bool:
    """A rank that ended by SIGTERM, or with no cause known, after another rank had failed: torchrun
    stops every rank at the first failure, so its end says nothing of its own."""
    if not (failure.how == "ended" or failure.exitcode == -signal.SIGTERM) or failure.died_at is None:
        return False
    return any(o is not failure and o.died_at is not None and o.died_at < failure.died_at for o in failures)


def explain_failures(failures: list[RankFailure]) -> tuple[RankFailure, str]:
    """The first rank to fail, and the trial's message: that rank and how, the others under it (the
    ranks stopped after it marked as consequences), then its traceback."""
    root = first_failure(failures)
    for f in failures:
        if f is not root and f.consequence is None and stopped_by_the_end(f, failures):
            f.consequence = STOPPED
    lines = [f"rank {root.rank} failed first: {root.cause}{_when(root)}"]
    others = sorted((f for f in failures if f is not root), key=lambda f: (f.died_at or float("inf"), f.rank))
    echoes = [f for f in others if f.consequence is not None]
    independent = [f for f in others if f.consequence is None]
    if echoes:
        lines.append("then, as a consequence:")
        lines += [f"  rank {f.rank}: {f.cause}{_after(f, root)} ({f.consequence})" for f in echoes]
    if independent:
        lines.append("also failed, later:")
        lines += [f"  rank {f.rank}: {f.cause}{_after(f, root)}" for f in independent]
    if root.traceback:
        lines += ["", f"rank {root.rank}'s traceback:", root.traceback.rstrip()]
    return root, "\n".join(lines)


def assemble_failures(
    *,
    errors: Mapping[int, Mapping[str, Any]],
    ended: Mapping[int, float],
    torchrun: Mapping[int, Mapping[str, Any]],
    finished: Iterable[int],
    ranks: Mapping[int, Mapping[str, Any]],
) -> list[RankFailure]:
    """One `RankFailure` per rank that did not finish, from what each source knows.

    errors: the ranks' own reports {rank: {time, status, exception, where, traceback}};
    ended: when the launcher saw each rank's process end; torchrun: its record of the failed
    workers {rank: {exitcode, pid, timestamp, message}}; finished: ranks that returned normally;
    ranks: what each rank said of itself at start {rank: {pid, host, position}}.
    """
    done = set(finished)
    out = []
    for rank in sorted((set(errors) | set(ended) | set(torchrun)) - done):
        own, record, info = errors.get(rank), torchrun.get(rank) or {}, ranks.get(rank) or {}
        exitcode = record.get("exitcode")
        failure = RankFailure(
            rank,
            "exception" if own else "ended" if exitcode is None else "signal" if exitcode < 0 else "exit",
            exitcode=exitcode,
            pid=info.get("pid") or record.get("pid"),
            host=info.get("host"),
            position=info.get("position"),
        )
        if own:
            failure.died_at = float(own["time"])
            failure.exception, failure.where = own.get("exception"), own.get("where")
            failure.traceback, failure.status = own.get("traceback"), str(own.get("status", "error"))
            failure.consequence = consequence_of(failure.exception or "")
        else:
            seen = ended.get(rank)
            failure.died_at = seen if seen is not None else record.get("timestamp")
            failure.traceback = record.get("message") or None  # an error file torchrun read (a crash before ours)
        out.append(failure)
    return out


def hang_failures(
    world_size: int, suspect: int, positions: Mapping[int, str], ranks: Mapping[int, Mapping[str, Any]]
) -> list[RankFailure]:
    """A hung world as per-rank records: `suspect` stopped reporting, the others wait for it."""
    out = []
    for rank in range(world_size):
        info = ranks.get(rank) or {}
        failure = RankFailure(rank, "hung" if rank == suspect else "waiting", status="timeout")
        failure.pid, failure.host, failure.position = info.get("pid"), info.get("host"), positions.get(rank)
        if rank != suspect:
            failure.consequence = f"waiting for rank {suspect} in a collective"
        out.append(failure)
    return out


def raise_site(frames: Sequence[traceback.FrameSummary], skip: Sequence[str]) -> str | None:
    """'file:line in function' of the innermost frame outside `skip` (torch's own code, the
    standard library): the line of the user's code, or ours, from which the error came."""
    for frame in reversed(frames):
        if not any(frame.filename.startswith(prefix) for prefix in skip if prefix):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    last = frames[-1] if frames else None
    return f"{last.filename}:{last.lineno} in {last.name}" if last else None


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"


def _when(f: RankFailure) -> str:
    parts = [f"at {_clock(f.died_at)}" if f.died_at is not None else "", f"pid {f.pid}" if f.pid else ""]
    if f.host:
        parts.append(f"on {f.host}")
    text = ", ".join(p for p in parts if p)
    return f" ({text})" if text else ""


def _after(f: RankFailure, root: RankFailure) -> str:
    if f.died_at is None or root.died_at is None:
        return ""
    return f", {f.died_at - root.died_at:+.3f} s"
