"""The torchrun command line of a distributed trial, shared by the launcher and `export.to_command`.

One function builds torchrun's own arguments from the config, so the command a notebook
trial runs and the command printed for a cluster cannot drift apart. No torch import here.
"""

from __future__ import annotations

from workbench.config import TrainConfig

RANK_MODULE = "workbench.distributed"
"""`python -m workbench.distributed`: the rank-side entry point (`workbench/distributed/__main__.py`)."""

AGENT_MODULE = "workbench.distributed.agent"
"""torchrun as the launcher runs it: `torch.distributed.run` itself, plus a record of the failed ranks
(`workbench/distributed/agent.py`)."""

FAILURE_RECORD_ENV = "WORKBENCH_FAILURE_RECORD"
"""Where the agent writes, as JSON, each failed rank's exit code or signal, pid and time."""

RDZV_ID = "workbench"
"""Rendezvous id: the nodes of one run must agree on it; the printed command uses this one."""


def torchrun_args(config: TrainConfig) -> list[str]:
    """torchrun's arguments for `config`: --standalone on one node, c10d rendezvous across nodes.

    Single-node trials without an endpoint use --standalone (torchrun picks a free local port,
    so concurrent trials never collide); with `rdzv_endpoint`, every node meets there.
    """
    nproc = f"--nproc_per_node={config.nproc_per_node}"
    if config.nnodes == 1 and not config.rdzv_endpoint:
        return ["--standalone", "--nnodes=1", nproc]
    return [
        f"--nnodes={config.nnodes}",
        nproc,
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={config.rdzv_endpoint}",
        f"--rdzv_id={RDZV_ID}",
    ]
