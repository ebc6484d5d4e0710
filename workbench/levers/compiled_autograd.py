"""Compiled autograd: capture the backward at run time and compile it as one more graph.

AOTAutograd already compiles the backward of each compiled forward graph; compiled autograd
captures the whole autograd graph of a step at `.backward()` (hooks, graph breaks' glue and
accumulate-grad included) and hands it to the compiler. It may fuse more, or just add compile
time and recompiles: measure, never assume. The switch is a private PyTorch API
(`torch._dynamo.compiled_autograd`); this is the one module that touches it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from workbench.config import ConfigError, TrainConfig
from workbench.device import ALWAYS, Availability
from workbench.levers.amp import ContextFactory
from workbench.levers.base import Lever, Space, SpaceContext, Table
from workbench.levers.compile import compile_availability
from workbench.levers.fragment import Snippet, call, comment, q
from workbench.levers.record import Applied

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep


class CompiledAutogradUnavailable(ConfigError):
    """This PyTorch has no compiled autograd where the workbench looks for it."""


def compiled_autograd_api() -> Any:
    """`torch._dynamo.compiled_autograd`, checked to still have `_enable`; a clear error if it moved."""
    try:
        from torch._dynamo import compiled_autograd
    except ImportError as exc:
        raise CompiledAutogradUnavailable(
            f"torch._dynamo.compiled_autograd is not importable in torch {torch.__version__} ({exc}); "
            "set compiled_autograd=false"
        ) from None
    if not callable(getattr(compiled_autograd, "_enable", None)):
        raise CompiledAutogradUnavailable(
            f"torch {torch.__version__} has no torch._dynamo.compiled_autograd._enable (the private API moved); "
            "set compiled_autograd=false, and update workbench/levers/compiled_autograd.py"
        )
    return compiled_autograd


def backward_compiler(config: TrainConfig) -> Any:
    """The compiler for the captured backward: the forward's own backend (and mode, for inductor)."""
    kwargs: dict[str, Any] = {"backend": config.compile_backend, "fullgraph": config.compile_fullgraph}
    if config.compile_backend == "inductor" and config.compile != "default":
        kwargs["mode"] = config.compile
    return torch.compile(**kwargs)


def apply_compiled_autograd(config: TrainConfig) -> tuple[ContextFactory | None, Applied | None]:
    """A context factory to enter around `.backward()`; (None, None) when the lever is off."""
    if not config.compiled_autograd:
        return None, None
    api = compiled_autograd_api()
    compiler = backward_compiler(config)  # one compiler for every step: its graphs are cached

    @contextmanager
    def context() -> Iterator[None]:
        with warnings.catch_warnings():
            # Capturing reads `.grad` of the graph's fake non-leaf tensors and PyTorch warns about
            # it (torch 2.13); the warning is about its own internals, not the user's model.
            warnings.filterwarnings("ignore", message=".*grad attribute of a Tensor that is not a leaf.*")
            with api._enable(compiler):
                yield

    detail = (
        f"torch._dynamo.compiled_autograd._enable(torch.compile(backend={config.compile_backend!r})) around "
        "each backward: the step's whole autograd graph is captured and compiled (recompiles when it changes)"
    )
    return context, Applied("compiled_autograd", True, detail)


def compiled_autograd_availability(dev: torch.device) -> Availability:
    compiled = compile_availability("default", dev)
    if not compiled.available:
        return Availability(
            False, f"compiles the backward with torch.compile, which cannot run here: {compiled.reason}"
        )
    try:
        compiled_autograd_api()
    except CompiledAutogradUnavailable as exc:
        return Availability(False, str(exc))
    return Availability(True, "needs compile on; adds a backward compile (and recompiles when the graph changes)")


def _availability(dev: torch.device) -> Table:
    return {"compiled_autograd": {False: ALWAYS, True: compiled_autograd_availability(dev)}}


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    if not config.compiled_autograd:
        return
    snippet.imports.add("from torch._dynamo import compiled_autograd")
    why = (
        "Compiled autograd: train_step captures each backward's whole autograd graph and compiles it "
        "with this compiler (the forward's backend). A private PyTorch API."
    )
    args = [f"backend={q(config.compile_backend)}"]
    if config.compile_backend == "inductor" and config.compile != "default":
        args.append(f"mode={q(config.compile)}")
    if config.compile_fullgraph:
        args.append("fullgraph=True")
    code = "\n".join(call("BACKWARD_COMPILER = torch.compile", args, indent=0))
    snippet.statements.append("\n".join([*comment(why, indent="# "), code]))
    snippet.backward_contexts.append("compiled_autograd._enable(BACKWARD_COMPILER)")


def _space(ctx: SpaceContext) -> Space:
    return {} if ctx.compile_modes == ("off",) else {"compiled_autograd": ctx.available("compiled_autograd")}


def _apply(step: TrainStep) -> None:
    """A context around each backward; after compile, whose compiled forward makes that graph."""
    backward_compile, record = apply_compiled_autograd(step.config)
    if backward_compile is not None and record is not None:
        step.backward_contexts.append(backward_compile)
        step.applied.append(record)


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    return "each backward's whole autograd graph captured and compiled too"


LEVER = Lever(
    name="compiled_autograd",
    fields=("compiled_autograd",),
    summary="compile each step's whole backward graph too: may fuse more where graph breaks split it",
    availability=_availability,
    snippet=_snippet,
    space=_space,
    apply=_apply,
    describe=_describe,
)
