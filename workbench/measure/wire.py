"""A workload as plain data for another process: by name, by its rebuildable source, or pickled.

Part of `TrialRequest.to_wire`, the one form a trial takes to a worker, a paired session or a
torchrun rank. Names and sources stay readable JSON; only a workload that can be rebuilt from
neither (a class defined in a notebook cell) travels as cloudpickle bytes, base64 text so the
whole request stays JSON.
"""

from __future__ import annotations

import base64
from typing import Any

from workbench.workloads.base import Workload, WorkloadError


def workload_name(workload: Workload | str) -> str:
    return workload if isinstance(workload, str) else workload.name


def workload_to_wire(workload: Workload | str) -> dict[str, Any]:
    """{'name': ...}, {'source': ...} or {'pickled': base64 text}; `workload_from_wire` is the inverse."""
    if isinstance(workload, str):
        return {"name": workload}
    if isinstance(workload, Workload) and workload.source:
        return {"source": dict(workload.source)}
    if not isinstance(workload, Workload):
        raise WorkloadError(f"a workload is a Workload, a built-in name or 'package.module:attr', got {workload!r}")
    import cloudpickle

    try:
        data = bytes(cloudpickle.dumps(workload))
    except Exception as exc:
        raise WorkloadError(_unpicklable_message(workload, exc)) from None
    return {"pickled": base64.b64encode(data).decode("ascii")}


def workload_from_wire(wire: dict[str, Any]) -> Workload | str:
    from workbench.workloads import load_workload

    if "name" in wire:
        return str(wire["name"])
    if "source" in wire:
        source = wire["source"]
        return load_workload(source["name"], preset=source.get("preset") or "tiny", **source.get("options", {}))
    import cloudpickle

    workload = cloudpickle.loads(base64.b64decode(wire["pickled"]))
    if not isinstance(workload, Workload):
        raise WorkloadError(f"the workload payload held a {type(workload).__name__}, not a Workload")
    return workload


def _unpicklable_message(workload: Any, exc: Exception) -> str:
    import cloudpickle

    culprit = "the workload"
    for name in ("model_fn", "loss_fn", "forward_fn", "batch_fn", "dataset_fn", "collate_fn"):
        try:
            cloudpickle.dumps(getattr(workload, name, None))
        except Exception:
            culprit = f"its {name} ({getattr(workload, name)!r})"
            break
    return (
        f"workload '{getattr(workload, 'name', workload)}' cannot be sent to another process: {culprit} "
        f"cannot be pickled ({type(exc).__name__}: {exc}). Define it at module level and pass "
        "'package.module:function', or run with isolation='inline'"
    )
