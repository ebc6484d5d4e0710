"""Where workloads come from: the built-in registry and `"package.module:attr"` specs.

A spec lets the CLI and a worker process rebuild a user's workload by import, which
is both the portable path and the fallback when a notebook object cannot be pickled.
"""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Callable
from typing import Any

from workbench.workloads.base import Workload, WorkloadError
from workbench.workloads.catalog import BUILTINS, BuiltinWorkload
from workbench.workloads.catalog import register as register  # its old home; kept importable

PRESETS = ("tiny", "base", "large")
DEFAULT_WORKLOAD = "bev-perception"
"""The workload the CLI and the app start from when none is named."""


def builtin_workloads() -> dict[str, BuiltinWorkload]:
    _import_builtins()
    return dict(BUILTINS)


def load_workload(spec: str | Workload, preset: str = "tiny", **options: Any) -> Workload:
    """A built-in name ('bev-perception'), a 'package.module:attr' spec, or a Workload as is.

    For a spec, `attr` is a Workload or a callable returning one; it gets `preset=` and the
    options when its signature accepts them. Option `slow_step_ms` applies to every workload.
    """
    if isinstance(spec, Workload):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise WorkloadError(f"a workload is a built-in name or 'package.module:attr', got {spec!r}")
    if preset not in PRESETS:
        raise WorkloadError(f"unknown preset '{preset}'; choose one of: {', '.join(PRESETS)}")
    all_options = dict(options)
    slow_step_ms = float(options.pop("slow_step_ms", 0.0) or 0.0)
    builtins = builtin_workloads()
    if spec in builtins:
        _check_options(spec, builtins[spec].builder, options)
        workload = builtins[spec].builder(preset, **options)
        workload.source = {"kind": "builtin", "name": spec, "preset": preset, "options": all_options}
        return with_step_delay(workload, slow_step_ms)
    if ":" not in spec:
        raise WorkloadError(
            f"unknown workload '{spec}'; built-ins: {', '.join(sorted(builtins))}, "
            "or give your own as 'package.module:function'"
        )
    workload = _import_spec(spec, preset, options)
    workload.source = {"kind": "spec", "name": spec, "preset": preset, "options": all_options}
    return with_step_delay(workload, slow_step_ms)


def with_step_delay(workload: Workload, delay_ms: float) -> Workload:
    """Option `slow_step_ms`: sleep that long in every forward — a deliberate, known regression
    for testing regression checks and verdicts (never a real optimization)."""
    if delay_ms < 0:
        raise WorkloadError(f"slow_step_ms must be >= 0, got {delay_ms}")
    if not delay_ms:
        return workload
    forward = workload.forward_fn

    def slowed_forward(model: Any, batch: Any) -> Any:
        _sleep(delay_ms / 1000.0)
        return forward(model, batch)

    workload.forward_fn = slowed_forward
    workload.options = {**workload.options, "slow_step_ms": delay_ms}
    return workload


def _sleep(seconds: float) -> None:
    import torch

    torch.compiler.disable(time.sleep)(seconds)


def _check_options(name: str, builder: Callable[..., Workload], options: dict[str, Any]) -> None:
    """Refuse a workload option the builder does not take (`--set extra.KEY=V`), naming those it does."""
    params = inspect.signature(builder).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    known = [n for n, p in params.items() if n != "preset" and p.kind is not inspect.Parameter.VAR_POSITIONAL]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise WorkloadError(
            f"workload '{name}' has no option {', '.join(repr(u) for u in unknown)}; its options: "
            f"{', '.join(sorted([*known, 'slow_step_ms']))} (set as extra.NAME=VALUE)"
        )


def _import_spec(spec: str, preset: str, options: dict[str, Any]) -> Workload:
    module_name, _, attr_path = spec.partition(":")
    if not module_name.strip() or not attr_path.strip():
        raise WorkloadError(f"workload spec '{spec}' needs both parts: 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkloadError(f"cannot import '{module_name}' from spec '{spec}': {exc}; is it on PYTHONPATH?") from None
    except Exception as exc:  # the user's module itself is broken: a SyntaxError, an error at import time
        raise WorkloadError(f"importing '{module_name}' (spec '{spec}') failed: {_where(exc)}") from exc
    obj: Any = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise WorkloadError(f"'{module_name}' has no attribute '{attr_path}' (spec '{spec}')")
        obj = getattr(obj, part)
    if isinstance(obj, Workload):
        return obj
    if not callable(obj):
        raise WorkloadError(f"'{spec}' is a {type(obj).__name__}; it must be a Workload or a function returning one")
    kwargs = _accepted_kwargs(obj, {"preset": preset, **options})
    ignored = sorted(set(options) - set(kwargs))
    if ignored:
        raise WorkloadError(f"'{spec}' takes no option {', '.join(repr(i) for i in ignored)}; add it to its parameters")
    try:
        result = obj(**kwargs)
    except Exception as exc:  # a bug in the user's factory: their frame and message, the traceback under --verbose
        raise WorkloadError(f"'{spec}' raised while building the workload: {_where(exc)}") from exc
    if not isinstance(result, Workload):
        raise WorkloadError(
            f"'{spec}' returned {type(result).__name__}, not a Workload; build one with Workload.from_callables"
        )
    if result.preset is None and "preset" in kwargs:
        result.preset = preset  # the factory was given it: the results say which size ran
    if result.name == "custom":  # from_callables' default name says nothing; the spec does
        result.name = spec
    return result


def _where(exc: BaseException) -> str:
    """`Type: message (file:line)` of the innermost frame, or of the line a SyntaxError points at."""
    from workbench.usererror import user_frame

    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} ({exc.filename}:{exc.lineno})"
    frame = user_frame(exc)
    return f"{type(exc).__name__}: {exc}" + (f" ({frame.filename}:{frame.lineno})" if frame else "")


def _accepted_kwargs(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def _import_builtins() -> None:
    # Importing the modules runs their @register decorators. Here, not at the top: they import torch,
    # and `import workbench.workloads` must not (the CLI's parser and the server extension use it).
    from workbench.workloads import bev, planner, vlm  # noqa: F401
