"""Workloads: built-in autonomous-driving models with size presets, and users' own."""

from workbench.workloads.base import Workload, WorkloadError, default_forward, map_tensors, move_batch, output_loss
from workbench.workloads.catalog import register
from workbench.workloads.registry import DEFAULT_WORKLOAD, PRESETS, builtin_workloads, load_workload

__all__ = [
    "DEFAULT_WORKLOAD",
    "PRESETS",
    "Workload",
    "WorkloadError",
    "builtin_workloads",
    "default_forward",
    "load_workload",
    "map_tensors",
    "move_batch",
    "output_loss",
    "register",
]
