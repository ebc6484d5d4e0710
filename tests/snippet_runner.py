"""Run an exported snippet the way a user would, on a workbench workload's model, loss and batches.

The contract test compares this against a trial of the same configuration: the snippet is
executed as a file of the user's (it seeds torch and sets its flags at import), the model is
built after it, and each step gets the next `GRAD_ACCUMULATION` batches of the workload's own
deterministic loader, in the order a trial draws them. What the snippet resolved is read from
the objects it made and the process state it left, with the name a trial's `applied` records use.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.config import TrainConfig
from workbench.workloads import Workload

_RUNS = itertools.count()


@dataclass
class SnippetRun:
    losses: list[float]
    """The mean micro-batch loss `train_step` returned, one per step."""
    resolved: dict[str, Any]
    """toggle -> value for what the snippet set up, named as a trial's `applied` records name them."""
    namespace: dict[str, Any]


def run_snippet(code: str, workload: Workload, config: TrainConfig, steps: int, path: Path) -> SnippetRun:
    """Import `code` as the module `path` and train `workload` for `steps` steps with its functions.

    A real module, as the user's file would be: torch.compile looks the snippet's globals up
    through `sys.modules` when it traces a function of it (the checkpointed forward). Each run
    gets a new module name: torch keeps looking a name up after the run, and must not find an
    earlier snippet there.
    """
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(f"{path.stem}_{next(_RUNS)}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)  # torch.manual_seed(SEED) and the flags
        return _train(vars(module), workload, config, steps)
    finally:
        del sys.modules[spec.name]


def _train(namespace: dict[str, Any], workload: Workload, config: TrainConfig, steps: int) -> SnippetRun:
    model = workload.model_fn()  # right after the seed, as a trial builds it
    optimize = namespace["optimize_model"]
    if "checkpoint_target" in inspect.signature(optimize).parameters:  # exported with target 'auto'
        model = optimize(model, checkpoint_target=workload.checkpoint_target)
    else:
        model = optimize(model)
    optimizer = namespace["make_optimizer"](model)
    data = workload.batches(config)  # the trial's loader: its batches, in its order
    losses = []
    for _ in range(steps):
        batches = [next(data) for _ in range(namespace["GRAD_ACCUMULATION"])]
        loss = namespace["train_step"](model, optimizer, batches, workload.loss_fn, workload.forward_fn)
        losses.append(float(loss))
    return SnippetRun(losses, resolved_by(optimizer), namespace)


def resolved_by(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer and precision flags the snippet's step ran with, as `applied` values.

    The kernel strategy comes from the optimizer's own flags; where neither is set, from the
    helper torch.optim's `step()` itself calls to pick one.
    """
    from torch.optim.optimizer import _default_to_fused_or_foreach

    group = optimizer.param_groups[0]
    if group.get("fused"):
        impl = "fused"
    elif group.get("foreach") is None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        impl = "foreach" if _default_to_fused_or_foreach(params, False, use_fused=False)[1] else "for-loop"
    else:
        impl = "foreach" if group["foreach"] else "for-loop"
    name = {torch.optim.AdamW: "adamw", torch.optim.SGD: "sgd"}[type(optimizer)]
    return {
        "optimizer": f"{name}/{impl}",
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "intra_op_threads": torch.get_num_threads(),
    }
