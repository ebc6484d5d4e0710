"""`Lever`: everything about one lever in one declaration, so adding one is one module.

Each lever module ends with `LEVER = Lever(...)`: the TrainConfig fields it owns, what it is for,
which values this device can run (with the reason), its device-dependent checks, its part of the
exported snippet and its values in the tuner's space. `registry.LEVERS` lists them in build order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.config import TrainConfig, field_choices
from workbench.device import ALWAYS, Availability

if TYPE_CHECKING:
    import torch

    from workbench.levers.build import TrainStep
    from workbench.levers.fragment import Snippet

Table = dict[str, dict[Any, Availability]]
"""field -> value -> whether that value runs here (and why not)."""

Space = Mapping[str, tuple[Any, ...]]


@dataclass(frozen=True)
class SpaceContext:
    """What a lever's search values may depend on: this device's table and the workload."""

    caps: Mapping[str, Mapping[Any, Availability]]
    workload_batch: int
    cpu_cores: int
    global_batch: int | None
    compile_modes: tuple[Any, ...]
    """The compile values searched: levers that act through the compiler join only when it is."""
    device_type: str = "cpu"

    def available(self, name: str, values: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
        """The values of `name` (all listed ones, or `values`) this device runs, in that order."""
        table = self.caps[name]
        return tuple(v for v in (values if values is not None else tuple(table)) if table[v].available)


@dataclass(frozen=True)
class Lever:
    """One lever: its fields and, for each job (probe, check, export, search), its part."""

    name: str
    fields: tuple[str, ...]
    summary: str
    """One line: what it does and when it helps."""
    availability: Callable[[torch.device], Table]
    """Each listed value of the lever's enumerable fields on this device, with the reason."""
    open_fields: tuple[str, ...] = ()
    """Fields with open-ended values (numbers, names): validation and `check` judge any value,
    so `availability` lists none (the app shows them as free text)."""
    apply: Callable[[TrainStep], None] | None = None
    """Applies the lever to the step under construction when the config uses it: changes the
    model in place, wraps it, sets the optimizer, a context or the graph, and appends its record
    to `step.applied`. `build()` calls these in registry order (the registry says why that order)."""
    not_in_step: str = ""
    """Why the step does not apply this lever, when `apply` is None (the loader feeds the step
    from outside it)."""
    check: Callable[[TrainConfig, torch.device], None] | None = None
    """Device-dependent refusals beyond the availability table (ConfigError with the fix)."""
    snippet: Callable[[TrainConfig, Snippet], None] | None = None
    """Adds this lever's statements to the exported snippet's sections when the config uses it."""
    not_exported: str = ""
    """Why the snippet leaves this lever out, when `snippet` is None."""
    describe: Callable[[str, Any, TrainConfig], str | None] | None = None
    """The exported snippet's header words for a non-default value of one of its fields, said for
    that value; None (or no answer) uses the field's docstring."""
    space: Callable[[SpaceContext], Space] | None = None
    """The values the tuner tries by default; None with `not_searched` saying why not."""
    not_searched: str = ""
    fixed: Mapping[str, str] = field(default_factory=dict)
    """Fields the tuner never searches, not even when a space file names them, each with the reason
    (the tuner's error quotes it); every other field of a lever may be named in a space file."""


def always(*names: str) -> Callable[[torch.device], Table]:
    """Availability for fields whose every choice runs anywhere."""

    def table(dev: torch.device) -> Table:
        return {name: dict.fromkeys(field_choices(name) or (), ALWAYS) for name in names}

    return table


def probed(**probes: Callable[[Any, torch.device], Availability]) -> Callable[[torch.device], Table]:
    """Availability from one probe per field, run for each of the field's choices."""

    def table(dev: torch.device) -> Table:
        return {name: {v: probe(v, dev) for v in field_choices(name) or ()} for name, probe in probes.items()}

    return table


def first_line(obj: object) -> str:
    """The first line of an exception or warning: reasons stay one line long."""
    return str(obj).strip().splitlines()[0] if str(obj).strip() else type(obj).__name__
