"""Distributed trials: DDP and FSDP2 through torchrun, with per-rank timing and communication figures.

`run_trial` hands a config with strategy ddp/fsdp2 to `run_distributed_trial`; the rest of the
product reads plain data back: `TrialResult.rank_step_ms` (every rank's step times),
`TrialResult.distributed` (summary) and `rank_rows(result)`; what they say is
`workbench.analysis.ranks.distributed_findings`.
Imports no torch at package import, so the core stays light.
"""

from workbench.distributed.launch import run_distributed_trial
from workbench.distributed.stats import rank_rows

__all__ = ["rank_rows", "run_distributed_trial"]
