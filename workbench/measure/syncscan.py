"""Find the calls that make the host wait for the device, with the Python line that made each.

`.item()`, `float(t)`, `bool(t)`, a blocking copy either way between host and device
(`.to("cuda")` from host memory without `non_blocking=True` waits for the stream too) and
`nonzero` all stop the host until the GPU catches up, which empties the launch queue. A
TorchDispatchMode over one step sees every such op on any device (on CPU they cost nothing,
but the same line stalls a GPU), and the Python stack at that moment names the line to
change. The scan runs on its own step, outside the profiled window, because a Python dispatch
mode slows every op.
"""

from __future__ import annotations

import linecache
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Ops that copy a device value to the host (`.item()`, `float()`, `bool()`, printing a tensor).
_SCALAR_OPS = ("aten._local_scalar_dense",)
#: Ops whose output shape depends on device data, so the host must wait (CUDA only).
_DATA_DEPENDENT_OPS = ("aten.nonzero", "aten.masked_select", "aten.unique", "aten._unique2", "aten.repeat_interleave")

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_HERE = str(Path(__file__).resolve().parent)


def scan_syncs(run_step: Callable[[], Any], device_type: str, max_sites: int = 10) -> dict[str, Any]:
    """Run one step under the scanner; {'per_step', 'sites': [{op, source, code, via, count}]} or {'error'}."""
    mode = SyncCounter(device_type)
    try:
        with mode:
            run_step()
    except Exception as exc:  # the scan is evidence, not the trial: report, do not fail the trial
        return {"per_step": None, "sites": [], "error": f"{type(exc).__name__}: {exc}"}
    sites = sorted(mode.sites.values(), key=lambda site: site["count"], reverse=True)
    return {"per_step": float(sum(site["count"] for site in sites)), "sites": sites[:max_sites]}


class SyncCounter(TorchDispatchMode):
    """Counts host-synchronizing ops by (op, source line) while active.

    On a CPU trial nothing really waits, so a scalar read counts when the same line would stall
    a GPU: any `.item()` except the optimizers' own step counters, which PyTorch keeps on the
    host on GPUs too (unless capturable/fused). On CUDA only reads of device tensors count.
    """

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type
        self.sites: dict[tuple[str, str], dict[str, Any]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        kind = _sync_kind(func, args, kwargs or {}, out)
        if kind is not None:
            source, code, via, in_optimizer = _user_frame()
            host_scalar = kind == _ITEM and _device_type(args[0] if args else None) == "cpu"
            if host_scalar and (self.device_type != "cpu" or in_optimizer):
                return out
            site = self.sites.setdefault(
                (kind, source), {"op": kind, "source": source, "code": code, "via": via, "count": 0}
            )
            site["count"] += 1
        return out


_ITEM = "item (device→host scalar)"


def _sync_kind(func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> str | None:
    name = str(func)  # 'aten._local_scalar_dense.default'
    if name.startswith(_SCALAR_OPS):
        return _ITEM
    first = args[0] if args else None
    if _device_type(first) not in (None, "cpu") and name.startswith(_DATA_DEPENDENT_OPS):
        return f"{name.split('.')[1]} (data-dependent shape)"
    if name.startswith("aten._to_copy"):
        src, dst, non_blocking = first, out, kwargs.get("non_blocking", False)
    elif name.startswith("aten.copy_") and len(args) > 1:
        src, dst = args[1], first
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    else:
        return None
    # A non-blocking copy does not wait; a blocking one synchronizes the stream (ATen's
    # memcpy_and_sync), host→device included.
    if non_blocking:
        return None
    src_type, dst_type = _device_type(src), _device_type(dst)
    if dst_type == "cpu" and src_type not in (None, "cpu"):
        return "device→host copy"
    if src_type == "cpu" and dst_type not in (None, "cpu", "meta"):
        return "blocking host→device copy (use non_blocking=True)"
    return None


def _user_frame() -> tuple[str, str, str, bool]:
    """(source line, its code, the torch function below it, whether an optimizer step is on the stack).

    The source is the innermost frame outside torch and this package's measuring code: the line
    the user can change (for a GradScaler sync, the `scaler.step` call; `via` then names torch's side).
    """
    stack = traceback.extract_stack()
    in_optimizer = any(f"{_TORCH_DIR}/optim/" in frame.filename for frame in stack)
    via = ""
    for frame in reversed(stack):
        filename = frame.filename
        if _is_torch(filename) or filename.startswith(_HERE):
            if _is_torch(filename) and not via and not any(part in filename for part in _PLUMBING):
                via = f"{_short(filename)}:{frame.name}"
            continue
        code = (frame.line or linecache.getline(filename, frame.lineno or 0)).strip()
        return f"{_short(filename)}:{frame.lineno} in {frame.name}", code, via, in_optimizer
    return "<unknown>", "", via, in_optimizer


#: torch's own frames between an op and the dispatch mode: never the interesting "via".
_PLUMBING = ("/_dynamo/", "/_compile.py", "/utils/_python_dispatch.py")


def _device_type(value: Any) -> str | None:
    return getattr(getattr(value, "device", None), "type", None)


def _is_torch(filename: str) -> bool:
    return filename.startswith(_TORCH_DIR) or "<frozen" in filename


def _short(filename: str) -> str:
    """Path relative to the current directory or a sys.path entry, whichever is shortest."""
    candidates = [filename]
    for base in [str(Path.cwd()), *sys.path]:
        if base and filename.startswith(base.rstrip("/") + "/"):
            candidates.append(filename[len(base.rstrip("/")) + 1 :])
    return min(candidates, key=len)
