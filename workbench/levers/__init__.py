"""Levers: one module per TrainConfig toggle (or family), applied in one documented order by `build()`."""

from workbench.levers.build import TrainStep, build
from workbench.levers.checkpointing import checkpointed_modules, find_targets, selective_policy
from workbench.levers.record import Applied

__all__ = ["Applied", "TrainStep", "build", "checkpointed_modules", "find_targets", "selective_policy"]
