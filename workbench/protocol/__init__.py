"""The one comparison protocol behind `compare`, `regress`, the notebook app and the tuner.

1. **Characterize** every configuration once in a fresh worker: memory, compile time, the
   loss trajectory for the numerics check, and the stored trial. Its step times are one
   process's, so they never decide a verdict on their own.
2. **Rounds** until each candidate's speedup interval is within ±`precision`, or the budget
   is spent. A round measures one unit of the baseline and of every candidate still
   imprecise, in an order that alternates round by round (B C1 C2, C2 C1 B, …), so an order
   effect cancels and rounds go where the interval is widest.
   - `paired` design (the default where honest): a worker holds every configuration;
     a unit is a block of steps (about `block_s` seconds of them, at most `block_steps`). Whatever
     moves a whole process moves both sides of a ratio. Rounds rotate between `paired_workers`
     such workers, so the bias one worker holds for its whole life lands in the spread.
   - `processes` design: a unit is a fresh worker's trial. Needed for distributed trials
     (torchrun), DataLoader workers (idle configurations' loader processes would load
     the CPU while another is timed) and compiled configurations that differ in a setting
     dynamo does not guard (`UNGUARDED_BY_DYNAMO`); slower to converge, since every unit
     carries its process's own ±10–20%.
3. **Verdict** from `analysis.compare.compare_units`: the signed-rank interval over paired
   rounds, Welch's over process units; too few units is "inconclusive", with how many more
   rounds the noise seen calls for.
"""

from workbench.protocol.compare import ComparisonRun, configured_requests, resolved_requests, run_protocol
from workbench.protocol.design import (
    CLOSING_S,
    COMPARE_STEPS,
    UNGUARDED_BY_DYNAMO,
    Design,
    Protocol,
    paired_refusal,
)
from workbench.protocol.rounds import round_order, run_rounds, stop_reason

__all__ = [
    "CLOSING_S",
    "COMPARE_STEPS",
    "UNGUARDED_BY_DYNAMO",
    "ComparisonRun",
    "Design",
    "Protocol",
    "configured_requests",
    "paired_refusal",
    "resolved_requests",
    "round_order",
    "run_protocol",
    "run_rounds",
    "stop_reason",
]
