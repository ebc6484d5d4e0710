"""`TrialRequest`: what one trial is asked to do, as the one object every path passes on.

The public calls (`run_trial`, `run_comparison`, the CLI, the app) take keyword arguments and
build a request once, validated; below them the inline trial, the worker, the torchrun launcher,
the paired session and the protocol's rounds all take the request itself. A comparison holds
one request and varies only its `config` (`with_config`), so every configuration is measured
with the same window, device and limits by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from workbench.config import ConfigError, TrainConfig
from workbench.measure.profile import ProfileOptions
from workbench.workloads.base import Workload

Isolation = Literal["process", "inline"]


@dataclass(frozen=True)
class TrialRequest:
    workload: Workload | str
    """A Workload, a built-in name or a 'package.module:attr' spec (built with `preset` and `config.extra`)."""
    config: TrainConfig = field(default_factory=TrainConfig)
    warmup: int = 3
    """Untimed steps first: the first step carries compile, capture and allocator start-up."""
    steps: int = 20
    device: Any = None
    """None: CUDA when present, else CPU; or 'cpu', 'cuda', 'cuda:1', a torch.device."""
    preset: str = "tiny"
    track_memory: bool = True
    isolation: Isolation = "process"
    timeout_s: float | None = None
    """Silence (no event) after the trial started that ends a worker; None: no limit."""
    memory_limit_bytes: int | None = None
    profile: ProfileOptions | None = None
    """A torch.profiler window after the timed window; None: no profiling."""

    def __post_init__(self) -> None:
        _check_count("warmup", self.warmup, "(the first step carries one-time costs)")
        _check_count("steps", self.steps, "")
        if self.isolation not in ("process", "inline"):
            raise ConfigError(f"isolation must be 'process' or 'inline', got {self.isolation!r}")
        if self.timeout_s is not None and (isinstance(self.timeout_s, bool) or not self.timeout_s > 0):
            raise ConfigError(f"timeout_s must be a positive number of seconds, got {self.timeout_s!r}")
        limit = self.memory_limit_bytes
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
            raise ConfigError(f"memory_limit_bytes must be a positive integer, got {limit!r}")
        if self.isolation == "inline" and (self.timeout_s is not None or limit is not None):
            raise ConfigError("timeout_s and memory_limit_bytes need isolation='process' (a thread cannot be killed)")
        if not isinstance(self.config, TrainConfig):
            raise ConfigError(f"config must be a TrainConfig, got {type(self.config).__name__}")

    @classmethod
    def of(
        cls,
        workload: Workload | str,
        config: TrainConfig | None = None,
        *,
        profile: bool | ProfileOptions | dict[str, Any] | None = None,
        **options: Any,
    ) -> TrialRequest:
        """From the public calls' keyword arguments; an unknown one is named, not swallowed."""
        unknown = sorted(set(options) - _WINDOW_FIELDS)
        if unknown:
            raise ConfigError(f"unknown trial option(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN))}")
        return cls(workload, config or TrainConfig(), profile=ProfileOptions.coerce(profile or False), **options)

    def with_config(self, config: TrainConfig) -> TrialRequest:
        """The same trial for another configuration (a comparison's candidates)."""
        return replace(self, config=config)

    def options(self) -> dict[str, Any]:
        """The window as keyword arguments of `run_trial` (everything but workload and config)."""
        return {name: getattr(self, name) for name in _KNOWN}

    def for_worker(self) -> dict[str, Any]:
        """The window in plain values for another process (the device as text, the profile as a dict)."""
        from workbench.device import resolve_device

        plain = {name: getattr(self, name) for name in ("warmup", "steps", "preset", "track_memory")}
        plain["device"] = str(resolve_device(self.device))
        plain["profile"] = self.profile.to_dict() if self.profile is not None else None
        return plain


def _check_count(name: str, value: Any, why: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1{' ' + why if why else ''}, got {value!r}")


_WINDOW_FIELDS = {"warmup", "steps", "device", "preset", "track_memory", "isolation", "timeout_s", "memory_limit_bytes"}
_KNOWN = (*sorted(_WINDOW_FIELDS), "profile")
