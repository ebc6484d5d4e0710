"""Levers: one module per TrainConfig toggle (or family), each declaring `LEVER = Lever(...)`;
`registry.LEVERS` holds them in the order `build()` applies them."""

from workbench.levers.base import Lever
from workbench.levers.build import TrainStep, build
from workbench.levers.checkpointing import checkpointed_modules, find_targets, selective_policy
from workbench.levers.record import Applied
from workbench.levers.registry import LEVERS, capabilities, capabilities_report, check_config, lever_of

__all__ = [
    "LEVERS",
    "Applied",
    "Lever",
    "TrainStep",
    "build",
    "capabilities",
    "capabilities_report",
    "check_config",
    "checkpointed_modules",
    "find_targets",
    "lever_of",
    "selective_policy",
]
