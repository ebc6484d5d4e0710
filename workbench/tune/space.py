"""The tuner's search space: `TrainConfig` fields and the values this device can run.

The default space is read from `TrainConfig`'s field choices and `capabilities()`; a user's
space (a dict, or the JSON object of `--space FILE`) is checked value by value against the
same two sources, so a typo or an unavailable value fails before any trial. Combinations
are judged by `TrainConfig`'s own validation when a configuration is built: a refused one
is never run and never counted.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, TrainConfig, field_choices, field_names, parse_value
from workbench.device import device_info, resolve_device
from workbench.levers import capabilities, check_config, registry
from workbench.levers.base import SpaceContext
from workbench.levers.compile import searched_compile_modes

#: Why the fields that are no lever's are kept at the baseline's values.
_NOT_LEVERS = {
    "lr": "it changes what is trained, not how fast",
    "seed": "equal seeds are what makes the numerics check possible",
    "extra": "workload options change the workload itself",
}

#: Why the other fields are kept at the baseline's values: no lever's, or one its lever keeps fixed.
NOT_SEARCHED = {**_NOT_LEVERS, **{name: why for lever in registry.LEVERS for name, why in lever.fixed.items()}}

#: Fields the tuner may search (a space file may name them): how a step runs, not what it trains.
SEARCHABLE = tuple(name for lever in registry.LEVERS for name in lever.fields if name not in NOT_SEARCHED)

#: Combinations enumerated to count (and prove non-empty) a space; larger spaces are sampled.
ENUMERATE_LIMIT = 20_000
SAMPLED_CHECKS = 4_000


@dataclass(frozen=True)
class SearchSpace:
    """Field -> the values to try (a field with one value is fixed at it)."""

    values: dict[str, tuple[Any, ...]]
    global_batch: int | None = None
    """When set, every configuration keeps batch_size × grad_accumulation == global_batch:
    grad_accumulation follows the batch size searched instead of being searched itself."""
    notes: list[str] = field(default_factory=list, compare=False)

    @property
    def searched(self) -> dict[str, tuple[Any, ...]]:
        """The fields with a real choice (two or more values)."""
        return {name: values for name, values in self.values.items() if len(values) > 1}

    @property
    def combinations(self) -> int:
        return math.prod(len(v) for v in self.values.values())

    def config(self, baseline: TrainConfig, params: Mapping[str, Any]) -> TrainConfig:
        """The configuration for one point of the space; ConfigError when validation refuses it."""
        changes = {**{name: values[0] for name, values in self.values.items()}, **params}
        if self.global_batch is not None:
            size = int(changes.get("batch_size") or 0)
            if size < 1 or self.global_batch % size:
                raise ConfigError(f"batch_size={size} does not divide the global batch {self.global_batch}")
            changes["grad_accumulation"] = self.global_batch // size
        return baseline.replace(**changes)

    def params_of(self, config: TrainConfig) -> dict[str, Any] | None:
        """The space's point for a configuration (None when the config lies outside the space)."""
        params = {}
        for name, values in self.values.items():
            value = getattr(config, name)
            if value not in values:
                return None
            params[name] = value
        return params

    def points(self) -> Iterator[dict[str, Any]]:
        names = list(self.values)
        for combo in itertools.product(*(self.values[n] for n in names)):
            yield dict(zip(names, combo))

    def narrowed(
        self, changes: Mapping[str, Any], *, device: Any = None, workload_batch: int | None = None
    ) -> SearchSpace:
        """This space with some fields' values replaced (narrowed or widened), each value checked."""
        user = _checked_values(changes, device, workload_batch)
        return SearchSpace({**self.values, **user}, self.global_batch, list(self.notes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "fields": {name: list(values) for name, values in self.values.items()},
            "searched": sorted(self.searched),
            "combinations": self.combinations,
            "global_batch": self.global_batch,
            "notes": list(self.notes),
        }

    def key(self) -> str:
        """A stable identity, so a resumed search only continues a search of the same space."""
        return json.dumps({"fields": {k: list(v) for k, v in sorted(self.values.items())},
                           "global_batch": self.global_batch}, sort_keys=True)  # fmt: skip


# --- building a space ----------------------------------------------------------------------


def default_space(
    workload_batch: int, device: Any = None, *, global_batch: int | None = None, cpu_cores: int | None = None
) -> SearchSpace:
    """Every searchable lever at the values this device can run: each lever says which
    (`Lever.space`), kept to what pays on one node."""

    caps = capabilities(device)
    cores = cpu_cores or device_info(device).cpu_cores
    context = SpaceContext(caps, workload_batch, cores, global_batch, searched_compile_modes(caps),
                           resolve_device(device).type)  # fmt: skip
    values: dict[str, tuple[Any, ...]] = {}
    for lever in registry.LEVERS:
        if lever.space is not None:
            values.update(lever.space(context))
    ordered = {name: values[name] for name in _SAMPLER_ORDER if name in values}
    return SearchSpace({**ordered, **values}, global_batch)


#: The order the sampler has always been given the default space's fields in: Optuna's seeded
#: samplers draw per field in this order, so keeping it keeps a seeded search's trials as they were.
_SAMPLER_ORDER = (
    "amp",
    "optimizer_impl",
    "matmul_precision",
    "attention_backend",
    "cuda_graphs",
    "pin_memory",
    "channels_last",
    "compile",
    "activation_checkpointing",
    "activation_offload",
    "num_workers",
    "batch_size",
    "activation_memory_budget",
    "compiled_autograd",
    "float8",
)


def user_space(
    mapping: Any, device: Any = None, *, workload_batch: int | None = None, global_batch: int | None = None
) -> SearchSpace:
    """The space exactly as written (fields not named stay at the baseline's values)."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(
            f"a search space is a JSON object of field -> list of values, got {type(mapping).__name__}; "
            'example: {"amp": ["fp32", "bf16"], "channels_last": [false, true]}'
        )
    if not mapping:
        raise ConfigError(
            'the search space is empty ({}); name at least one field with two or more values, e.g. {"amp": ["fp32", "bf16"]}'
        )
    return SearchSpace(_checked_values(mapping, device, workload_batch), global_batch)


def load_space_file(path: str | Path, device: Any = None, **kwargs: Any) -> SearchSpace:
    """`--space FILE`: a JSON object of field -> list of values."""
    return user_space(read_space_file(path), device, **kwargs)


def read_space_file(path: str | Path) -> Any:
    """The parsed JSON of a space file; clear errors for a missing or malformed one."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the space file {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f'the space file {path} is not JSON ({exc}); write an object such as {{"amp": ["fp32", "bf16"]}}'
        ) from None
    return data


def check_space(space: SearchSpace, baseline: TrainConfig, device: Any = None) -> int | None:
    """Raise ConfigError when nothing can be searched; return how many valid configurations there
    are (None when the space is too large to count: it was sampled instead).

    Nothing to search: no field with two values, or no combination that validation and this
    device accept (a contradictory space) — the message quotes the first refusal."""

    if not space.searched:
        raise ConfigError(
            "the search space has no choice left: every field has one value; give some field two or more values"
        )
    valid, first_refusal = 0, ""
    exhaustive = space.combinations <= ENUMERATE_LIMIT
    points = space.points() if exhaustive else _sampled_points(space, SAMPLED_CHECKS)
    for params in points:
        try:
            check_config(space.config(baseline, params), device)
            valid += 1
        except ConfigError as exc:
            first_refusal = first_refusal or str(exc)
    if valid < 2:
        what = "no combination" if valid == 0 else "only one combination"
        raise ConfigError(
            f"the search space is contradictory: {what} of its values is a valid configuration here "
            f"(e.g. {first_refusal}); drop or change the conflicting fields"
        )
    return valid if exhaustive else None


# --- internals ----------------------------------------------------------------------------


def _checked_values(mapping: Mapping[str, Any], device: Any, workload_batch: int | None) -> dict[str, tuple[Any, ...]]:

    caps = capabilities(device)
    out: dict[str, tuple[Any, ...]] = {}
    for name, raw in mapping.items():
        if name in NOT_SEARCHED:
            raise ConfigError(f"the tuner does not search '{name}': {NOT_SEARCHED[name]}; remove it from the space")
        if name not in SEARCHABLE:
            known = "a TrainConfig field the tuner does not search" if name in field_names() else "not a config field"
            raise ConfigError(f"'{name}' is {known}; searchable fields: {', '.join(SEARCHABLE)}")
        if not isinstance(raw, list) or not raw:
            raise ConfigError(f"'{name}' must map to a non-empty list of values, e.g. \"{name}\": [...]; got {raw!r}")
        values: list[Any] = []
        for value in raw:
            value = _typed(name, value)
            available = caps.get(name, {}).get(value)
            if available is not None and not available.available:
                raise ConfigError(f"{name}={value} is not available here: {available.reason}; remove it from the space")
            if value not in values:
                values.append(value)
        out[name] = tuple(values)
    return out


def _typed(name: str, value: Any) -> Any:
    """A JSON value as the field's type, checked against the field's choices."""
    if isinstance(value, str) and field_choices(name) is not None and value not in field_choices(name):  # type: ignore[operator]
        value = parse_value(name, value)
    if name in ("batch_size", "grad_accumulation", "num_workers", "prefetch_factor", "intra_op_threads"):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "num_workers" else 1):
            raise ConfigError(
                f"{name} values must be whole numbers >= {0 if name == 'num_workers' else 1}, got {value!r}"
            )
        return value
    if name == "activation_memory_budget":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ConfigError(f"activation_memory_budget values must be numbers from 0 to 1, got {value!r}")
        return float(value)
    choices = field_choices(name)
    if choices is not None and value not in choices:
        raise ConfigError(f"{name}={value!r} is not valid; choose from: {', '.join(map(str, choices))}")
    return value


def _sampled_points(space: SearchSpace, count: int) -> Iterator[dict[str, Any]]:
    import random

    rng = random.Random(0)
    names = list(space.values)
    for _ in range(count):
        yield {name: rng.choice(space.values[name]) for name in names}
