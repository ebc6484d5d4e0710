"""torch.compile of the model (forward; backward is compiled through AOTAutograd).

Applied after every change to the module (memory format, checkpoint wrapping) so dynamo traces
the final forward, including the checkpointed regions, and before CUDA graphs so a graph
captures the compiled kernels. Autocast and SDPA-backend contexts are entered around each call,
so they are active when dynamo traces and become part of the compiled graph.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workbench.config import COMPILE_MODES_WITH_CUDA_GRAPHS, ConfigError, TrainConfig
from workbench.device import ALWAYS, Availability
from workbench.levers.base import Lever, Space, SpaceContext, Table
from workbench.levers.fragment import Snippet, call, q
from workbench.levers.record import Applied

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep


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


def compile_availability(value: str, dev: torch.device) -> Availability:
    if value == "off":
        return ALWAYS
    if dev.type == "cpu" and value in COMPILE_MODES_WITH_CUDA_GRAPHS:
        if value == "reduce-overhead":
            return Availability(
                False, "reduce-overhead works by capturing CUDA graphs; on CPU it would silently equal 'default'"
            )
        return Availability(True, "on CPU max-autotune tunes CPU kernels only (no CUDA graphs); expect long compiles")
    if dev.type == "cpu" and not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return Availability(False, "inductor needs a C++ compiler on CPU; install g++ (apt-get install g++)")
    if dev.type == "cuda" and importlib.util.find_spec("triton") is None:
        return Availability(False, "inductor needs Triton on CUDA; pip install triton")
    return ALWAYS


@functools.lru_cache(maxsize=1)
def known_backends() -> tuple[str, ...]:
    import torch._dynamo

    return tuple(torch._dynamo.list_backends(exclude_tags=()))


def _availability(dev: torch.device) -> Table:
    from workbench.config import field_choices

    return {
        "compile": {v: compile_availability(v, dev) for v in field_choices("compile") or ()},
        "compile_fullgraph": dict.fromkeys(field_choices("compile_fullgraph") or (), ALWAYS),
    }


def _check(config: TrainConfig, dev: torch.device) -> None:
    if config.compile != "off" and config.compile_backend not in known_backends():
        raise ConfigError(
            f"compile_backend '{config.compile_backend}' is not registered; choose one of: {', '.join(known_backends())}"
        )


def compile_lines(config: TrainConfig) -> list[str]:
    """The `return torch.compile(...)` lines; mode only for inductor, only when not default."""
    args = ["model"]
    lines = ["    # Compile last: it traces the final forward. Compilation runs on the first call."]
    if config.compile != "default":
        if config.compile_backend == "inductor":
            args.append(f"mode={q(config.compile)}")
        else:
            lines.append(f"    # No mode={q(config.compile)}: only the inductor backend takes a mode.")
    if config.compile_fullgraph:
        args.append("fullgraph=True  # fail on graph breaks instead of running them eagerly")
    if config.compile_dynamic is not None:
        args.append(f"dynamic={config.compile_dynamic}")
    if config.compile_backend != "inductor":
        args.append(f"backend={q(config.compile_backend)}")
    return [*lines, *call("return torch.compile", args, indent=4)]


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    if config.compile == "off":
        return
    snippet.model_return = compile_lines(config)
    snippet.loader_args.append("drop_last=True  # a short last batch would recompile/break the graph")


def _space(ctx: SpaceContext) -> Space:
    """'off' and 'default': the other modes compile for minutes; widen to them explicitly."""
    return {"compile": ctx.compile_modes}


def searched_compile_modes(caps: Mapping[str, Mapping[Any, Availability]]) -> tuple[Any, ...]:
    """The compile values the default space tries (other levers join only when compile does)."""
    return tuple(v for v in ("off", "default") if caps["compile"][v].available)


def _apply(step: TrainStep) -> None:
    """Last among the module changes: it traces the final (wrapped) forward with the contexts of
    the levers before it active, so they are compiled in."""
    if step.config.compile != "off":
        step.model, record = apply_compile(step.model, step.config)
        step.applied.append(record)


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    if name == "compile":
        return "torch.compile of the model" + ("" if value == "default" else f", mode {value}")
    if name == "compile_fullgraph":
        return "compile fails on graph breaks instead of running them eagerly"
    if name == "compile_dynamic":
        return {True: "compile for dynamic shapes", False: "compile for static shapes only"}.get(value)
    mode = "" if config.compile == "default" else " (no mode: only inductor takes one)"
    return f"compile with the {value} backend{mode}"


LEVER = Lever(
    name="compile",
    fields=("compile", "compile_fullgraph", "compile_dynamic", "compile_backend"),
    summary="torch.compile the model: fused kernels, fewer launches; pays back its compile time on long runs",
    availability=_availability,
    open_fields=("compile_dynamic", "compile_backend"),
    check=_check,
    snippet=_snippet,
    space=_space,
    fixed=dict.fromkeys(
        ("compile_fullgraph", "compile_dynamic", "compile_backend"),
        "compile's options stay the baseline's: the tuner searches the compile mode; set them in the baseline",
    ),
    apply=_apply,
    describe=_describe,
)
