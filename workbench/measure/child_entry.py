"""What a worker process runs first, however it was started (a fresh interpreter or a fork of
the pre-imported fork server): tie its life to the parent's, read its job from the request
pipe, apply the memory limit, run the job."""

from __future__ import annotations

from multiprocessing.connection import Connection

from workbench.measure.lifeline import end_with


def run_child(request_fd: int, reply_fd: int, parent_pid: int, spare: bool = False) -> None:
    """Serve one job: a cloudpickled `(job, args, memory_limit)` arrives on `request_fd`;
    `job(requests, replies, *args)` runs with both pipe ends as connections."""
    end_with(parent_pid)  # first: a parent killed during our start-up must not leave us running
    import cloudpickle

    requests = Connection(request_fd, writable=False)
    replies = Connection(reply_fd, readable=False)
    if spare:  # import what every job needs now, while the parent measures nothing
        import torch  # noqa: F401

        import workbench.measure.trial  # noqa: F401

        replies.send(("imported",))
    try:
        job, args, memory_limit = cloudpickle.loads(requests.recv_bytes())
    except Exception as exc:
        replies.send(("fatal", f"the worker could not read its job: {type(exc).__name__}: {exc}"))
        return
    if memory_limit is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    job(requests, replies, *args)
