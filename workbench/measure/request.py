"""`TrialRequest`: what one trial is asked to do, as the one object every path passes on.

The public calls (`run_trial`, `run_comparison`, the CLI, the app) take keyword arguments and
build a request once, validated; below them the inline trial, the worker, the torchrun launcher,
the paired session and the protocol's rounds all take the request itself. A comparison holds
one request and varies only its `config` (`with_config`), so every configuration is measured
with the same window, device and limits by construction.

Where the trial is decided to run, the request is `resolved()` once: its device becomes a
concrete device string and its config is checked on that device. Every layer below (the worker,
the paired session, the torchrun ranks, `build`) trusts a resolved request instead of checking
again; `to_wire`/`from_wire` carry it to another process as plain JSON, the resolution included.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from workbench.config import ConfigError, TrainConfig
from workbench.measure.profile import ProfileOptions
from workbench.measure.wire import workload_from_wire, workload_to_wire
from workbench.workloads.base import Workload

if TYPE_CHECKING:
    import torch

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
    staged_batches: int = 0
    """0: batches come from the workload's loader. N > 0: the ideal loader — N real batches staged on
    the device before the window and cycled, no loader at all (`measure.staged`): the step time no
    loader change can beat."""
    data_stages: bool = False
    """Time each sample's stages where the loader prepares it, and each batch's copy to the device
    (`measure.data_stages`): `TrialResult.data_stages`."""
    checked: bool = False
    """Set by `resolved()`: `device` is concrete and `config` was checked on it; nothing below checks again."""

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
        staged = self.staged_batches
        if isinstance(staged, bool) or not isinstance(staged, int) or staged < 0:
            raise ConfigError(f"staged_batches must be an integer >= 0 (0: the real loader), got {staged!r}")
        if staged and self.data_stages:
            raise ConfigError("data_stages times the loader's stages; the ideal loader (staged_batches) has none")
        if staged and isinstance(self.config, TrainConfig) and self.config.strategy != "none":
            raise ConfigError("staged_batches (the ideal loader) runs one process; it has no distributed form yet")
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
        """The same trial for another configuration (a comparison's candidates); not yet checked."""
        return replace(self, config=config, checked=False)

    def options(self) -> dict[str, Any]:
        """The window as keyword arguments of `run_trial` (everything but workload and config)."""
        return {name: getattr(self, name) for name in _KNOWN}

    def resolved(self) -> TrialRequest:
        """This request ready to run: the device resolved (None → CUDA when present, else the CPU)
        and the config checked on it, once; a request already resolved is returned as it is."""
        if self.checked:
            return self
        from workbench.device import resolve_device
        from workbench.levers import check_config

        dev = resolve_device(self.device)
        check_config(self.config, dev)  # refuse bad input before paying for a process or torchrun
        return replace(self, device=str(dev), checked=True)

    def torch_device(self) -> torch.device:
        """The device of a resolved request (what `resolved()` settled on)."""
        import torch

        if not self.checked:
            raise RuntimeError("torch_device() needs a resolved request: call request.resolved() first")
        return torch.device(self.device)

    def to_wire(self) -> dict[str, Any]:
        """The request as plain JSON-able data for another process (`from_wire` is the inverse): the
        workload by name, source or as pickled text, the config as its dict, the device as text."""
        wire: dict[str, Any] = {name: getattr(self, name) for name in _PLAIN}
        wire["workload"] = workload_to_wire(self.workload)
        wire["config"] = self.config.to_dict()
        wire["device"] = None if self.device is None else str(self.device)
        wire["profile"] = self.profile.to_dict() if self.profile is not None else None
        return wire

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> TrialRequest:
        unknown = sorted(set(wire) - {*_PLAIN, "workload", "config", "device", "profile"})
        if unknown:
            raise ConfigError(f"not a trial request: unknown keys {', '.join(unknown)}")
        plain = {name: wire[name] for name in _PLAIN if name in wire}
        return cls(workload_from_wire(wire["workload"]), TrainConfig.from_dict(wire["config"]),
                   device=wire.get("device"), profile=ProfileOptions.coerce(wire.get("profile")), **plain)  # fmt: skip


def _check_count(name: str, value: Any, why: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1{' ' + why if why else ''}, got {value!r}")


_WINDOW_FIELDS = {
    "warmup",
    "steps",
    "device",
    "preset",
    "track_memory",
    "isolation",
    "timeout_s",
    "memory_limit_bytes",
    "staged_batches",
    "data_stages",
}
_KNOWN = (*sorted(_WINDOW_FIELDS), "profile")
_PLAIN = (*sorted(_WINDOW_FIELDS - {"device"}), "checked")
