"""Paired rounds in which the host's load changed: found from each unit's load, set aside, counted.

A paired round cancels a load that hits both of its arms alike. A load that starts or stops
inside a round slows one arm more than the other; and a round run while other work fought for
the cores has a ratio ruled by that fight (A/A rounds read 0.2x to 3.6x here with one CPU burner
on 2 cores, against ±5% quiet) more than by the configurations. Both are "the load changed", and
such a round says nothing about the effect. The rule looks at the load alone, never at the step
times, so the rounds it keeps are as likely to favour either side as before (an A/A comparison
stays centred on 1.0); when the affected rounds are too large a share to trust that the others
were untouched, the verdict is withheld.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

Load = tuple[float | None, float | None]
"""One unit's load: (other processes' busy cores, our threads' run-queue wait per second)."""

LOAD_GAP = 0.25
"""Cores. A round is affected when its two arms' loads differ by more than this, or its load differs
by more than this from the comparison's usual round load (the median). Measured here per arm of
~0.25 s: a quiet host reads 0.00–0.08; one other process spinning on a core, 0.8–1.3."""

BUSY_CONFIDENCE = 0.99
"""The interval's confidence on a busy host (`LoadShift.busy`), where the asked one is lower.

Why: on a busy host the rounds the rule keeps are heavier-tailed and less independent than the
signed-rank interval assumes — a load under the line still moves them, and it persists from one
round to the next. Here A/A comparisons at 95% called "faster"/"slower" where the host's load had
changed in 3 of 9 and 3 of 13 rounds. On simulated rounds (`tests/test_hostshift.py`), 99% on a
busy host cut false A/A verdicts from 6% to 2% under a steady load and from 2.5% to 0.5% under
spikes; a 10% slowdown amid bursts or spikes was called as often as at 95%, under a steady load
less often (inconclusive instead). A quiet host keeps the asked confidence."""

MAX_AFFECTED_SHARE = 1.0 / 3.0
"""Above this share of affected rounds the verdict is withheld: the load moved so often that the
rounds it did not visibly touch cannot be taken as quiet (and the usual level itself is unsure)."""


@dataclass(frozen=True)
class LoadShift:
    """What the host's load did during one configuration pair's paired rounds."""

    rounds: list[int] = field(default_factory=list)
    """The affected rounds (set aside from the interval)."""
    measured: int = 0
    """Rounds whose load was known for both arms (0: not measured, the rule did nothing)."""
    usual: float | None = None
    """The median round's load, in cores."""
    loads: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Each affected round's (first configuration's, second's) load, in cores."""

    @property
    def busy(self) -> bool:
        """The host's load changed in some round, or other work held more than `LOAD_GAP` cores throughout."""
        return bool(self.rounds) or (self.usual is not None and self.usual > LOAD_GAP)

    def confidence(self, asked: float) -> float:
        """The interval's confidence for these rounds: `BUSY_CONFIDENCE` on a busy host, else `asked`."""
        return max(asked, BUSY_CONFIDENCE) if self.busy else asked

    @property
    def withheld(self) -> bool:
        """Too many rounds affected for a verdict from the rest."""
        return bool(self.rounds) and len(self.rounds) > MAX_AFFECTED_SHARE * self.measured

    def note(self) -> str:
        """'' when no round was affected; else how many, in the words the verdict column shows."""
        if not self.rounds:
            return ""
        return f"the host's load changed during the comparison, {len(self.rounds)} of {self.measured} rounds affected"


def unit_load(load: Load | None) -> float | None:
    """One number per unit, in cores: the smaller of its two figures, where both are known.

    The load that matters is other work that took cores our threads wanted, and each figure alone
    overstates it somewhere: other processes' cores count a load that a step spent sleeping or
    waiting on a GPU never felt (a sleep-bound test workload read 1 other core and no change in
    its steps), and our threads' waiting counts a configuration whose own threads outnumber the
    cores. Where both are high, both happened; a CPU-bound step here read them alike (0.86
    against 0.90, 1.34 against 1.16 cores under one burner)."""
    if load is None:
        return None
    known = [value for value in load if value is not None]
    return min(known) if known else None


def load_shift(first: Mapping[int, Load], second: Mapping[int, Load], rounds: list[int]) -> LoadShift:
    """The rounds of `rounds` in which the load changed, from two configurations' per-round loads."""
    pairs = {}
    for r in rounds:
        a, b = unit_load(first.get(r)), unit_load(second.get(r))
        if a is not None and b is not None:
            pairs[r] = (a, b)
    if not pairs:
        return LoadShift()
    usual = float(np.median([max(a, b) for a, b in pairs.values()]))
    affected = {r: (a, b) for r, (a, b) in pairs.items() if abs(a - b) > LOAD_GAP or abs(max(a, b) - usual) > LOAD_GAP}
    return LoadShift(sorted(affected), len(pairs), usual, affected)
