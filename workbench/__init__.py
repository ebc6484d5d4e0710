"""Training Workbench: make PyTorch training fast — measure, compare, diagnose, tune, export.

The public API is this one namespace::

    import workbench as wb

    config = wb.TrainConfig(amp="bf16", channels_last=True)
    result = wb.run_trial("bev-perception", config, steps=10)
    run = wb.compare("bev-perception", wb.TrainConfig(), [config])
    print(wb.export(config, "snippet"))

Names resolve on first use, so `import workbench` stays cheap (no torch) for the JupyterLab server
extension and the GPU machine's preflight; modules below may move, these names stay put.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench import export, tune, ui
    from workbench.analysis.diagnose import diagnose_trial as diagnose
    from workbench.api import loader_bound, workers_enough
    from workbench.api import run_comparison as compare
    from workbench.config import ConfigError, TrainConfig
    from workbench.estimate import estimate_memory
    from workbench.levers import capabilities
    from workbench.measure.result import TrialResult
    from workbench.protocol import Protocol
    from workbench.trials import run_trial
    from workbench.tune import TuneResult
    from workbench.ui import write_report as report
    from workbench.workloads import Workload, load_workload
    from workbench.workloads.stages import stage

#: public name -> "module:attribute" it is defined in; a bare module (tune, export) is itself callable.
_PUBLIC = {
    "TrainConfig": "workbench.config:TrainConfig",
    "ConfigError": "workbench.config:ConfigError",
    "Workload": "workbench.workloads:Workload",
    "load_workload": "workbench.workloads:load_workload",
    "capabilities": "workbench.levers:capabilities",
    "run_trial": "workbench.trials:run_trial",
    "TrialResult": "workbench.measure.result:TrialResult",
    "compare": "workbench.api:run_comparison",
    "loader_bound": "workbench.api:loader_bound",
    "Protocol": "workbench.protocol:Protocol",
    "stage": "workbench.workloads.stages:stage",
    "workers_enough": "workbench.api:workers_enough",
    "tune": "workbench.tune",
    "TuneResult": "workbench.tune:TuneResult",
    "diagnose": "workbench.analysis.diagnose:diagnose_trial",
    "estimate_memory": "workbench.estimate:estimate_memory",
    "export": "workbench.export",
    "watch": "workbench.watch",
    "ui": "workbench.ui",
    "report": "workbench.ui:write_report",
}

__all__ = [
    "ConfigError",
    "Protocol",
    "TrainConfig",
    "TrialResult",
    "TuneResult",
    "Workload",
    "capabilities",
    "compare",
    "diagnose",
    "estimate_memory",
    "export",
    "load_workload",
    "loader_bound",
    "report",
    "run_trial",
    "stage",
    "tune",
    "ui",
    "watch",
    "workers_enough",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first use (PEP 562)."""
    target = _PUBLIC.get(name)
    if target is None:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}; public names: {', '.join(__all__)}")
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    value = getattr(module, attribute) if attribute else module
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
