"""How a `TrialResult` becomes a row and back, and the two keys that decide what is comparable.

- `config_key`: the identity of a configuration — only the fields that differ from the
  defaults, so adding a new `TrainConfig` field (with a default) keeps old history
  comparable. `extra.slow_step_ms` is left out on purpose: it simulates a *code*
  regression (a slower step under the same configuration), so a slowed run must be
  checked against the plain configuration's history, as a real slow commit would be.
  When what the defaults *run* changes, `IDENTITY_VERSION` goes up and older keys match
  nothing new (see there); the stored rows keep their keys, so no migration is needed.
- `env_key`: the hardware a result was measured on (device type, name and count, CPU
  cores, OS). Software — commit, torch, CUDA, Python — is deliberately not in it: a
  commit that bumps torch and slows training is exactly what a regression check must
  catch. The host name is not in it either, so a pool of identical CI machines shares
  one history.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from workbench.config import TrainConfig
from workbench.measure.result import TrialResult

#: `extra` options that change how a step runs, not what it computes (see the module docstring).
NOT_IDENTITY_EXTRA = ("slow_step_ms",)
#: Part of every config key. Rows keep the key they were stored with, so bumping this makes all
#: earlier history incomparable with later runs. 2: the defaults became PyTorch's own — the
#: optimizer implementation PyTorch picks (foreach on CUDA) instead of a for-loop, and cuDNN TF32
#: for convolutions on (its own field, `cudnn_tf32`) where the old 'highest' matmul precision
#: also turned it off on CUDA. A v1 "defaults" reference would silently compare a slower
#: baseline with the new one; under v2 it is no baseline at all.
IDENTITY_VERSION = 2
#: Environment-fingerprint fields that must match for two results to be compared.
COMPARABLE_KEYS = ("device_type", "device_name", "device_count", "cpu_cores", "platform")

#: TrialResult fields with a column of their own, as is.
SCALAR_FIELDS = (
    "trial_id", "status", "message", "workload", "preset", "warmup", "steps", "batch_size", "samples_per_step",
    "peak_memory_bytes", "memory_method", "time_to_first_step_s", "compile_time_s", "started_at", "wall_time_s",
    "diverged_step",
)  # fmt: skip
#: TrialResult fields with a column of their own, as JSON (readable with SQLite's json_* functions).
JSON_FIELDS = (
    "config", "environment", "device", "applied", "step_ms", "warmup_step_ms", "phase_ms", "losses", "memory_breakdown",
)  # fmt: skip
#: Columns a stored trial is read back from (capabilities come from their own table).
TRIAL_COLUMNS = ("id", "run_id", "label", "saved_at", "trace_path", *SCALAR_FIELDS, *JSON_FIELDS, "other")


@dataclass
class StoredTrial:
    """A trial as the history holds it: the result plus where and when it was stored."""

    id: int
    """Row id, unique in this store (what `workbench history` shows as 'trial')."""
    run_id: int
    """The invocation it was saved with (a compare, a regression check): its trials share this."""
    label: str
    """Its role in that run: 'baseline', 'candidate 1', a suite configuration's name, ..."""
    saved_at: float
    trace_path: str | None
    result: TrialResult

    @property
    def commit(self) -> str | None:
        return self.result.environment.get("git_commit")


def canonical_json(value: Any) -> str:
    return json.dumps(_normalize(value), sort_keys=True, separators=(",", ":"), default=str)


def config_key(config: TrainConfig | dict[str, Any]) -> str:
    """Hash of the configuration's identity: its non-default fields, minus `NOT_IDENTITY_EXTRA`."""
    data = config.to_dict() if isinstance(config, TrainConfig) else dict(config)
    defaults = TrainConfig().to_dict()
    identity = {k: v for k, v in data.items() if k != "extra" and (k not in defaults or defaults[k] != v)}
    extra = {k: v for k, v in (data.get("extra") or {}).items() if k not in NOT_IDENTITY_EXTRA}
    if extra:
        identity["extra"] = extra
    return _digest({"identity_version": IDENTITY_VERSION, "fields": identity})


def env_key(environment: dict[str, Any]) -> str:
    """Hash of the hardware part of an environment fingerprint (`COMPARABLE_KEYS`)."""
    return _digest({k: environment.get(k) for k in COMPARABLE_KEYS})


def split_commit(commit: str | None) -> tuple[str | None, bool]:
    """'abc+dirty' -> ('abc', True): the commit is indexed bare, the dirty flag kept apart."""
    if not commit:
        return None, False
    bare = commit.removesuffix("+dirty")
    return bare, bare != commit


def trial_row(result: TrialResult, capabilities_key: str | None) -> dict[str, Any]:
    """Column -> value for one trial (without run_id, label, saved_at, which the caller adds)."""
    data = dataclasses.asdict(result)
    row: dict[str, Any] = {name: data.pop(name) for name in SCALAR_FIELDS}
    for name in JSON_FIELDS:
        value = data.pop(name)
        row[name] = None if value is None else json.dumps(value, allow_nan=True)
    data.pop("capabilities")
    row["trace_path"] = _trace_path(data)
    row["other"] = json.dumps(data, allow_nan=True, default=str)
    commit, dirty = split_commit(result.environment.get("git_commit"))
    source = result.workload_source or {}
    row.update(
        workload_spec=source.get("name") or result.workload,
        spec_preset=source.get("preset") or result.preset,
        config_key=config_key(result.config),
        env_key=env_key(result.environment),
        git_commit=commit,
        git_dirty=int(dirty),
        host=result.environment.get("host"),
        device_name=result.environment.get("device_name") or result.device.get("name"),
        median_step_ms=result.median_step_ms,
        iqr_step_ms=result.iqr_step_ms,
        capabilities_key=capabilities_key,
    )
    return row


def stored_trial(row: Any, capabilities: dict[str, Any] | None) -> StoredTrial:
    """Rebuild a StoredTrial from a `TRIAL_COLUMNS` row (a sqlite3.Row or a mapping)."""
    fields = {f.name for f in dataclasses.fields(TrialResult)}
    data: dict[str, Any] = {name: row[name] for name in SCALAR_FIELDS}
    for name in JSON_FIELDS:
        data[name] = None if row[name] is None else json.loads(row[name])
    data.update(json.loads(row["other"] or "{}"))
    data["capabilities"] = capabilities or {}
    if "trace_path" in fields:
        data["trace_path"] = row["trace_path"]
    # Keep fields this version knows: a result from a later minor version still loads.
    result = TrialResult(**{k: v for k, v in data.items() if k in fields})
    return StoredTrial(row["id"], row["run_id"], row["label"], row["saved_at"], row["trace_path"], result)


def _trace_path(data: dict[str, Any]) -> str | None:
    """The profiler's trace file: a `trace_path` field if TrialResult has one, else the profile summary's."""
    direct = data.pop("trace_path", None)
    profile = data.get("profile")
    nested = profile.get("trace_path") if isinstance(profile, dict) else None
    return direct or nested


def capabilities_blob(capabilities: dict[str, Any]) -> tuple[str, str] | None:
    if not capabilities:
        return None
    text = canonical_json(capabilities)
    return hashlib.sha256(text.encode()).hexdigest()[:32], text


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:24]


def _normalize(value: Any) -> Any:
    """2.0 and 2 are one option value (a JSON round trip may turn one into the other)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(k): _normalize(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalize(v) for v in value]
    return value
