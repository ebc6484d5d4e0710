"""When the loader levers stop being worth searching.

Loader settings (workers, pinning, prefetch) only shorten the time a step waits for its batch. The
ideal loader (batches staged on the device, `measure.staged`) waits for nothing; once a trial's
step waits no longer than the noise, it is within noise of that bound and no loader change can
make it measurably faster: the search pins the loader at that trial's values and spends its
trials on the other levers. Read inside one trial (its own data phase), not between two trials,
whose processes alone differ by more than the noise on this kind of machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from workbench.config import TrainConfig
from workbench.levers.loader import LEVER as LOADER
from workbench.measure import TrialResult

LOADER_FIELDS = LOADER.fields


def data_wait_share(result: TrialResult) -> float | None:
    """The timed window's median data phase over its median step (None when not measured)."""
    waits, step = result.phase_ms.get("data"), result.median_step_ms
    if not result.ok or not waits or not step:
        return None
    return float(np.median(waits)) / step


def settled_by_trial(result: TrialResult, searched: Iterable[str], noise: float) -> dict[str, Any] | None:
    """The trial's searched loader settings, when its step waits for data no more than `noise` of it."""
    share = data_wait_share(result)
    fields = [name for name in searched if name in LOADER_FIELDS]
    if share is None or share > noise or not fields:
        return None
    config = TrainConfig.from_dict(result.config)
    return {name: getattr(config, name) for name in fields}
