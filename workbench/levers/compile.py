"""torch.compile of the model (forward; backward is compiled through AOTAutograd).

Applied after every change to the module (memory format, checkpoint wrapping) so dynamo traces
the final forward, including the checkpointed regions, and before CUDA graphs so a graph
captures the compiled kernels. Autocast and SDPA-backend contexts are entered around each call,
so they are active when dynamo traces and become part of the compiled graph.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.levers.record import Applied


def apply_compile(model: nn.Module, config: TrainConfig) -> tuple[nn.Module, Applied]:
    """`torch.compile(model, ...)` with the config's mode/fullgraph/dynamic/backend.

    Only inductor takes a `mode`; other backends ('eager', 'aot_eager', user backends) would
    receive it as an unexpected keyword, so it is left out and the record says so.
    """
    kwargs: dict[str, Any] = {
        "fullgraph": config.compile_fullgraph,
        "dynamic": config.compile_dynamic,
        "backend": config.compile_backend,
    }
    notes: list[str] = []
    if config.compile_backend == "inductor":
        kwargs["mode"] = None if config.compile == "default" else config.compile
    elif config.compile != "default":
        notes.append(f"mode '{config.compile}' not passed: only the inductor backend takes a mode")
    compiled = torch.compile(model, **kwargs)
    assert isinstance(compiled, nn.Module)  # torch.compile of a module returns an OptimizedModule
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    detail = f"torch.compile({type(model).__name__}, {shown}); compiles on the first step"
    if notes:
        detail += "; " + "; ".join(notes)
    return compiled, Applied("compile", config.compile, detail)
