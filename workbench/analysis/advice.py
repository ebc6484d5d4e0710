"""`Recommendation` and the `Context` every detector's advice reads: a config change with its expected effect.

Each one is checked against the trial's own capabilities table (recorded in the result) and
against `TrainConfig` validation before it is offered, so `apply()` returns a config that
can run on the device the trial ran on. Some advice is a code change no toggle can make
(an `.item()` in the model); those carry no changes and `apply()` refuses them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.config import ConfigError, TrainConfig


@dataclass
class Recommendation:
    title: str
    changes: dict[str, Any]
    """Config fields to set ({} for advice that needs a code change)."""
    expected: str
    """The expected effect, with numbers where the evidence gives them."""
    why: str
    rank: int = 0
    """1 = try first, within its finding."""

    @property
    def actionable(self) -> bool:
        return bool(self.changes)

    def apply(self, config: TrainConfig, device: Any = None) -> TrainConfig:
        """The candidate config; with `device`, also checked against what that device can run."""
        if not self.changes:
            raise ConfigError(f"'{self.title}' is a code change, not a config toggle; see its note: {self.why}")
        changes = dict(self.changes)
        if "extra" in changes:
            changes["extra"] = {**config.extra, **changes["extra"]}
        candidate = config.replace(**changes)
        if device is not None:
            from workbench.levers import check_config

            check_config(candidate, device)
        return candidate

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "changes": dict(self.changes),
            "expected": self.expected,
            "why": self.why,
            "rank": self.rank,
            "actionable": self.actionable,
        }


@dataclass
class Context:
    """What the recommenders need to know about the trial, read once from its result."""

    config: TrainConfig
    device_type: str
    cpu_cores: int
    capabilities: dict[str, dict[str, Any]]
    step_ms: float
    phase_ms: dict[str, float] = field(default_factory=dict)
    batch_size: int = 0
    optimizer_impl: str = ""
    """The optimizer implementation the trial ran (optimizer_impl='default' resolved); '' if unrecorded."""
    sync_sites: list[dict[str, Any]] = field(default_factory=list)
    """Host-synchronizing calls the profile's sync scan found in one step ({op, source, code, ...})."""

    def available(self, name: str, value: Any) -> bool:
        table = self.capabilities.get(name)
        if not table:
            return True
        key = str(value).lower() if isinstance(value, bool) else str(value)
        entry = table.get(key)
        return entry is None or bool(entry.get("available", True))

    def offer(self, candidates: list[Recommendation]) -> list[Recommendation]:
        """Keep the ones that change something, can run here and validate; rank in the given order."""
        kept: list[Recommendation] = []
        for rec in candidates:
            if rec.changes:
                if all(getattr(self.config, k) == v for k, v in rec.changes.items() if k != "extra"):
                    continue
                if not all(self.available(k, v) for k, v in rec.changes.items()):
                    continue
                try:
                    rec.apply(self.config)
                except ConfigError:
                    continue
            rec.rank = len(kept) + 1
            kept.append(rec)
        return kept
