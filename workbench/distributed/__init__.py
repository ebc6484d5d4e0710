"""Distributed trials: DDP and FSDP2 through torchrun, with per-rank timing and communication figures.

`run_trial` hands a config with strategy ddp/fsdp2 to `run_distributed_trial`; the rest of the
product reads plain data back: `TrialResult.rank_step_ms` (every rank's step times),
`TrialResult.distributed` (summary), `rank_rows(result)` and `distributed_findings(result)`.
Imports no torch at package import, so the core stays light.
"""

from workbench.distributed.launch import run_distributed_trial
from workbench.distributed.stats import DistributedFinding, Recommendation, distributed_findings, rank_rows

__all__ = ["DistributedFinding", "Recommendation", "distributed_findings", "rank_rows", "run_distributed_trial"]
