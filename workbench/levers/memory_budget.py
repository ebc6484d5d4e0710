"""Activation memory budget: let torch.compile's partitioner choose what to recompute in backward.

A continuous alternative to full/selective checkpointing: at budget b the min-cut partitioner
keeps b of the activations its runtime-optimal plan would save and recomputes the cheapest rest
(a 0-1 knapsack over the ops' FLOPs). It only acts where AOTAutograd partitions a compiled graph,
so it is a compile lever. The knob is a private PyTorch config
(`torch._functorch.config.activation_memory_budget`); this is the one module that touches it.
Dynamo does not guard its compiled code on this setting: in one process a second model of the
same class reuses the first one's graph and its partitioning. Trials run in fresh workers, so
each compiles its own, and the comparison protocol never pairs configurations that differ in it
(`protocol.UNGUARDED_BY_DYNAMO`); an inline trial after another compiled one of the same workload
does not compile its own.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch

from workbench.config import ConfigError, TrainConfig
from workbench.device import Availability
from workbench.levers.amp import ContextFactory
from workbench.levers.base import Lever, Space, SpaceContext, Table
from workbench.levers.compile import compile_availability
from workbench.levers.fragment import Snippet, comment
from workbench.levers.record import Applied

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep

CONFIG_NAME = "activation_memory_budget"


class MemoryBudgetUnavailable(ConfigError):
    """This PyTorch has no activation memory budget where the workbench looks for it."""


def functorch_config() -> Any:
    """`torch._functorch.config`, checked to still carry the budget; a clear error if it moved."""
    try:
        import torch._functorch.config as config
    except ImportError as exc:
        raise MemoryBudgetUnavailable(
            f"torch._functorch.config is not importable in torch {torch.__version__} ({exc}); "
            "activation_memory_budget needs torch >= 2.4: upgrade torch or set activation_memory_budget=1.0"
        ) from None
    if not hasattr(config, CONFIG_NAME):
        raise MemoryBudgetUnavailable(
            f"torch {torch.__version__} has no torch._functorch.config.{CONFIG_NAME} (the private API moved); "
            "set activation_memory_budget=1.0, and update workbench/levers/memory_budget.py"
        )
    return config


def apply_activation_memory_budget(budget: float) -> tuple[ContextFactory | None, Applied | None]:
    """A context factory setting the budget while the compiled forward is traced; (None, None) at 1.0.

    The partitioner reads the budget when the first call compiles the forward and its backward
    together, so the context must surround the forward call (it does, in `TrainStep`), and it
    is scoped to the step: an inline trial leaves the process's global setting untouched.
    """
    if budget >= 1.0:
        return None, None
    config = functorch_config()

    def context() -> AbstractContextManager[object]:
        patched: AbstractContextManager[object] = config.patch(**{CONFIG_NAME: float(budget)})
        return patched

    detail = (
        f"torch._functorch.config.{CONFIG_NAME}={budget} while the forward compiles: the partitioner keeps "
        f"{budget:.0%} of the default plan's saved activations and recomputes the cheapest rest in backward"
    )
    return context, Applied("activation_memory_budget", budget, detail)


MEMORY_BUDGETS_SHOWN = (1.0, 0.75, 0.5, 0.25, 0.0)
"""activation_memory_budget values `capabilities()` lists (any value from 0 to 1 is valid)."""


def memory_budget_availability(budget: float, dev: torch.device) -> Availability:
    if budget >= 1.0:
        return Availability(True, "off: the compiler saves what is fastest to keep (PyTorch's default)")
    compiled = compile_availability("default", dev)
    if not compiled.available:
        return Availability(False, f"acts through torch.compile, which cannot run here: {compiled.reason}")
    try:
        functorch_config()
    except MemoryBudgetUnavailable as exc:
        return Availability(False, str(exc))
    return Availability(
        True, f"needs compile on: keeps {budget:.0%} of the compiled graph's saved activations, recomputes the rest"
    )


def _availability(dev: torch.device) -> Table:
    return {"activation_memory_budget": {b: memory_budget_availability(b, dev) for b in MEMORY_BUDGETS_SHOWN}}


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    """A compiler setting that must hold before the first compiled call."""
    if config.activation_memory_budget >= 1.0:
        return
    snippet.imports.add("import torch._functorch.config")
    why = (
        f"Activation memory budget: torch.compile's partitioner keeps {config.activation_memory_budget:.0%} "
        "of the activations its fastest plan would save and recomputes the cheapest rest in backward. "
        "A private PyTorch setting: it is read when the first call compiles."
    )
    code = f"torch._functorch.config.activation_memory_budget = {config.activation_memory_budget!r}"
    snippet.statements.append("\n".join([*comment(why, indent="# "), code]))


def _space(ctx: SpaceContext) -> Space:
    """Off (the baseline's) and one step, where compile is searched."""
    if ctx.compile_modes == ("off",):
        return {}
    return {"activation_memory_budget": ctx.available("activation_memory_budget", (1.0, 0.5))}


def _apply(step: TrainStep) -> None:
    """Read when the first forward compiles forward and backward together: a context around
    forward, like autocast, so it is compiled in."""
    budget, record = apply_activation_memory_budget(step.config.activation_memory_budget)
    if budget is not None:
        step.compile_contexts.append(budget)
    if record is not None:
        step.applied.append(record)


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    return "share of the compiled graph's saved activations kept; the rest recomputed"


LEVER = Lever(
    name="activation_memory_budget",
    fields=("activation_memory_budget",),
    summary="let compile's partitioner recompute the cheapest activations: a memory dial between full and none",
    availability=_availability,
    snippet=_snippet,
    space=_space,
    apply=_apply,
    describe=_describe,
)
