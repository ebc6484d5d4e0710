"""Optimizations: one module per TrainConfig toggle, applied in one documented order by `build()`."""

from workbench.optimizations.build import TrainStep, build
from workbench.optimizations.checkpointing import checkpointed_modules, find_targets, selective_policy
from workbench.optimizations.record import Applied

__all__ = ["Applied", "TrainStep", "build", "checkpointed_modules", "find_targets", "selective_policy"]
