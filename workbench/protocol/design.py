"""What a comparison must reach (`Protocol`) and when one worker may hold every configuration."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from workbench.analysis.intervals import min_paired_rounds
from workbench.config import ConfigError, TrainConfig

Design = Literal["auto", "paired", "processes"]

CLOSING_S = 3.0
"""Kept back from the budget for what follows the last round: ending the paired workers (each
joins its process; three of them) and computing the verdict. Measured here at 2.5–3 s from the
last round's end to the comparison's return; at 1.5 s, comparisons ended at up to 60.9 s of 60."""


@dataclass(frozen=True)
class Protocol:
    """How sure a comparison must be, and how long it may take to get there."""

    precision: float = 0.03
    """Target relative half-width of every candidate's speedup interval (0.03 = ±3%)."""
    budget_s: float = 60.0
    """Wall-clock seconds for the whole comparison; rounds stop when the next would overrun it
    (the characterizing trials and `min_rounds` always run)."""
    confidence: float = 0.95
    margin: float = 0.02
    """Equivalence margin: an effect smaller than this is "no significant difference"."""
    design: Design = "auto"
    """'paired' where honest (else 'processes'), or forced."""
    block_steps: int = 5
    """Most timed steps per unit in the paired design (after one untimed switch step)."""
    block_s: float = 1.0
    """Target timed seconds per unit in the paired design: a configuration whose step is slow gets
    fewer steps (at least one), so one slow candidate does not make every round long."""
    paired_workers: int = 3
    """Paired design: workers the rounds rotate between (round r in worker r mod n). Each worker
    carries a bias of a few percent between configurations for its whole life (where its memory
    and threads landed); rotating shows it in the rounds' spread, but the centre is still the mean
    of n workers' biases, which no number of rounds averages away. With 2 workers a 2% bias gave
    ~9% false A/A verdicts in simulation at this machine's round noise, with 3 ~7%. Each worker
    costs a copy of every model's memory and (on the CPU) a few seconds of start-up; 1 saves
    both, at the cost of that bias."""
    min_rounds: int = 6
    """Rounds always measured (raised to what `confidence` needs: 6 at 95%, 8 at 99%)."""
    max_rounds: int = 200

    def __post_init__(self) -> None:
        if not 0.001 <= self.precision <= 0.5:
            raise ConfigError(
                f"precision must be a fraction between 0.001 and 0.5 (0.03 = ±3%), got {self.precision!r}"
            )
        if not self.budget_s > 0:
            raise ConfigError(f"budget must be a positive number of seconds, got {self.budget_s!r}")
        if not 0.5 <= self.confidence < 1.0:
            raise ConfigError(f"confidence must be in [0.5, 1), got {self.confidence!r}")
        if not 0.0 <= self.margin < 0.5:
            raise ConfigError(f"margin must be a fraction in [0, 0.5), got {self.margin!r}")
        if self.design not in ("auto", "paired", "processes"):
            raise ConfigError(f"design must be 'auto', 'paired' or 'processes', got {self.design!r}")
        if isinstance(self.block_steps, bool) or not isinstance(self.block_steps, int) or self.block_steps < 1:
            raise ConfigError(f"block_steps must be an integer >= 1, got {self.block_steps!r}")
        if not self.block_s > 0:
            raise ConfigError(f"block_s must be a positive number of seconds, got {self.block_s!r}")
        workers = self.paired_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 8:
            raise ConfigError(f"paired_workers must be an integer from 1 to 8, got {self.paired_workers!r}")
        if not 1 <= self.min_rounds <= self.max_rounds:
            raise ConfigError(
                f"rounds must satisfy 1 <= min_rounds <= max_rounds, got min_rounds={self.min_rounds}, "
                f"max_rounds={self.max_rounds}"
            )

    def block_for(self, step_ms: float | None) -> tuple[int, bool]:
        """(timed steps, untimed switch step first?) of a paired unit, for a step of `step_ms`.

        `block_steps` steps, fewer when fewer already take `block_s`. A switch step absorbs the
        cold caches a block meets after another model ran; a step that alone exceeds `block_s`
        skips it: those costs are fixed (milliseconds at most) and vanish against such a step."""
        if not step_ms:
            return self.block_steps, True
        steps = max(1, min(self.block_steps, math.ceil(self.block_s * 1000.0 / step_ms)))
        return steps, step_ms <= self.block_s * 1000.0

    @property
    def rounds_floor(self) -> int:
        """Rounds measured before any stopping rule applies: a verdict needs at least this many."""
        return min(self.max_rounds, max(self.min_rounds, min_paired_rounds(self.confidence)))


#: Settings that change what torch.compile builds but that dynamo's guards never check. Two
#: compiled configurations differing only in one of them would share one compiled graph in a
#: paired worker: dynamo keys its cache on the forward's code and guards on tensors and global
#: state, so the configuration built second reuses the graph (and the partitioning) of the first,
#: and the paired rounds time one graph on both sides. Resetting dynamo between the builds would
#: not help: the rounds alternate between the models, and whichever compiled last would serve both.
#: So such comparisons run in fresh processes, one compilation each.
UNGUARDED_BY_DYNAMO = ("activation_memory_budget",)


def paired_refusal(configs: Sequence[TrainConfig]) -> str | None:
    """Why these configurations cannot share one worker honestly (None: they can)."""
    compiled = [config for config in configs if config.compile != "off"]
    for name in UNGUARDED_BY_DYNAMO:
        values = sorted({getattr(config, name) for config in compiled})
        if len(values) > 1:
            return (
                f"the compiled configurations differ in {name} ({', '.join(map(str, values))}), which dynamo does "
                "not guard: in one worker they would all run the graph compiled first"
            )
    for config in configs:
        if config.launches_ranks:
            parallel = f", tensor_parallel={config.tensor_parallel}" if config.tensor_parallel > 1 else ""
            return f"strategy={config.strategy}{parallel} runs in torchrun processes"
        if config.num_workers > 0:
            return (
                f"num_workers={config.num_workers}: the idle configurations' DataLoader workers would use the CPU "
                "while another configuration is timed"
            )
    return None


COMPARE_STEPS = 10
"""Timed steps of a comparison's fresh trials when the caller names none: the rounds, not one
long trial, give the interval, so a characterizing trial need not be long."""
