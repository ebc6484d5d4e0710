"""Activation checkpointing: free a block's activations after forward, recompute them in backward.

Trades compute for memory. 'full' keeps only each block's inputs; 'selective' also keeps the
outputs of the expensive ops (matmuls, convolutions, attention) so backward only recomputes the
cheap element-wise ops. Works on any `nn.Module` tree: targets are found by class name or by a
glob over qualified module names, never by assuming a `model.layers` list.

Wrapping patches `forward` on each target *instance* instead of inserting a wrapper module: the
module keeps its type, its qualified name and its parameter names, so `state_dict` keys,
optimizer parameter names, name globs and `isinstance` checks are exactly as without
checkpointing (a wrapper module would add a path segment and need state-dict hooks to hide it).
The patch is a `functools.partial` of a module-level function, so `copy.deepcopy` rebinds it to
the copy and the model still pickles.

Caveat (PyTorch behaviour, not ours): BatchNorm inside a checkpointed block updates its running
statistics again during recomputation. Training losses and gradients are unaffected.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from workbench.config import ConfigError, TrainConfig
from workbench.levers.base import Lever, Space, SpaceContext, always
from workbench.levers.fragment import Snippet, q
from workbench.levers.record import Applied, name_list

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep

_MARK = "_workbench_checkpoint"
"""Attribute set on a wrapped module (value: the policy), so wrapping is never applied twice."""


#: aten ops whose outputs `selective` saves: recomputing them would cost about as much as forward.
#: The exported snippet writes out the same list (workbench/export.py).
SAVED_OP_NAMES = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "convolution",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)


def _compute_heavy_ops() -> frozenset[Any]:
    aten = torch.ops.aten
    # Attention kernels differ by PyTorch version and build; save whichever this build has.
    return frozenset(getattr(aten, name).default for name in SAVED_OP_NAMES if hasattr(aten, name))


SAVED_OPS = _compute_heavy_ops()


def selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Save the outputs of compute-heavy ops, recompute everything else (cheap, memory-bound ops)."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed_forward(forward: Callable[..., Any], policy: str, *args: Any, **kwargs: Any) -> Any:
    """The patched `forward`: run the original forward under non-reentrant checkpointing."""
    if policy == "selective":
        context_fn = functools.partial(create_selective_checkpoint_contexts, selective_policy)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=context_fn, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def find_targets(model: nn.Module, target: str) -> list[str]:
    """Qualified names of the modules to wrap: outermost matches only, in module order.

    A module matches when its class name equals `target` or its qualified name matches
    `target` as an fnmatch glob ('encoder.*', 'backbone'). A match nested inside an earlier
    match is skipped: its parent's checkpoint already covers it, and nesting would recompute twice.
    """
    chosen: list[str] = []
    for name, module in model.named_modules():
        if any(name == c or name.startswith(c + ".") or c == "" for c in chosen):
            continue
        if type(module).__name__ == target or (name and fnmatch.fnmatchcase(name, target)):
            chosen.append(name)
    return chosen


def _no_match_message(model: nn.Module, target: str) -> str:
    """Say what was meant: close spellings first, then the repeated block classes (the usual targets)."""
    counts: dict[str, int] = {}
    for module in model.modules():
        counts[type(module).__name__] = counts.get(type(module).__name__, 0) + 1
    by_lower = {name.lower(): name for name in counts}
    close = [by_lower[n] for n in difflib.get_close_matches(target.lower(), list(by_lower), n=3, cutoff=0.6)]
    repeated = sorted((n for n, c in counts.items() if c > 1 and n not in close), key=lambda n: (-counts[n], n))
    message = f"checkpoint_target '{target}' matches no module of {type(model).__name__}."
    if close:
        message += f" Did you mean {' or '.join(repr(n) for n in close)}?"
    if repeated:
        message += f" Repeated blocks here: {name_list([f'{n} (x{counts[n]})' for n in repeated], 6)}."
    return message + " Give a class name or a name glob such as 'encoder.*'"


def checkpointed_modules(model: nn.Module) -> dict[str, str]:
    """Qualified name → policy of every module currently wrapped (for tests and reports)."""
    return {name: getattr(m, _MARK) for name, m in model.named_modules() if hasattr(m, _MARK)}


def resolve_target(target: str, workload_target: str | None, workload_name: str = "workload") -> str:
    """'auto' means the workload's own `checkpoint_target`; a workload without one cannot say 'auto'."""
    if target != "auto":
        return target
    if not workload_target:
        raise ConfigError(
            f"checkpoint_target=auto, but {workload_name} names no checkpoint target; set checkpoint_target "
            "to a module class name ('ResBlock') or a name glob ('encoder.*')"
        )
    return workload_target


def apply_activation_checkpointing(
    model: nn.Module, policy: str, target: str, workload_target: str | None = None, workload_name: str = "workload"
) -> Applied:
    """Wrap every outermost module matching `target` so its forward runs under checkpointing."""
    if policy not in ("full", "selective"):
        raise ConfigError(f"activation_checkpointing must be 'full' or 'selective' to apply, got {policy!r}")
    resolved = resolve_target(target, workload_target, workload_name)
    names = find_targets(model, resolved)
    if not names:
        raise ConfigError(_no_match_message(model, resolved))
    modules = dict(model.named_modules())
    wrapped = 0
    for name in names:
        module = modules[name]
        if hasattr(module, _MARK):  # already wrapped by an earlier build on the same instance
            continue
        # `module.forward` keeps any patch the user made; the partial holds it as a bound method.
        module.forward = functools.partial(_checkpointed_forward, module.forward, policy)  # type: ignore[method-assign]
        setattr(module, _MARK, policy)
        wrapped += 1
    classes_wrapped = sorted({type(modules[n]).__name__ for n in names})
    how = (
        "keeps matmul/conv/attention outputs, recomputes the rest"
        if policy == "selective"
        else "saves block inputs only"
    )
    source = f" (workload's target '{resolved}')" if target == "auto" else ""
    detail = (
        f"wrapped {wrapped} {'/'.join(classes_wrapped)} module(s){source}, {how}: "
        f"{name_list([n or '<root>' for n in names])}"
    )
    return Applied("activation_checkpointing", policy, detail)


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    if config.activation_checkpointing == "off":
        return
    auto_target = config.checkpoint_target == "auto"
    if not auto_target:
        snippet.constants += [
            "# Modules to checkpoint: a class name, or an fnmatch glob over qualified names.",
            f"CHECKPOINT_TARGET = {q(config.checkpoint_target)}",
        ]
    else:
        snippet.model_params.append("checkpoint_target: str")
        snippet.model_doc += [
            "    checkpoint_target: the module class name (or fnmatch glob over qualified names)",
            "    to checkpoint. The workbench ran with checkpoint_target='auto', which meant its",
            "    workload's repeated block: name the repeated block of YOUR model here.",
            "",
        ]
    _checkpoint_helpers(snippet, config.activation_checkpointing)
    target = "checkpoint_target" if auto_target else "CHECKPOINT_TARGET"
    snippet.model_steps += [
        "    # Before compile, so torch.compile traces the checkpointed regions.",
        f"    checkpoint_modules(model, {target})",
    ]


def _checkpoint_helpers(snippet: Snippet, policy: str) -> None:
    """`checkpoint_modules` and the patched forward: this module's wrapping, in plain PyTorch."""
    snippet.imports |= {"import fnmatch", "import functools", "from typing import Any"}
    snippet.helpers.append(
        "def checkpoint_modules(model: nn.Module, target: str) -> list[str]:\n"
        '    """Recompute in backward the activations of every module matching `target`.\n'
        "\n"
        "    `target` is a module class name or an fnmatch glob over qualified module names.\n"
        "    Each outermost match's forward is patched in place, so the module keeps its type,\n"
        "    name and state_dict keys. Returns the qualified names of the wrapped modules.\n"
        '    """\n'
        "    wrapped: list[str] = []\n"
        "    for name, module in model.named_modules():\n"
        "        # Inside a wrapped module already: wrapping it too would recompute twice.\n"
        '        if any(w == "" or name == w or name.startswith(w + ".") for w in wrapped):\n'
        "            continue\n"
        "        by_class = type(module).__name__ == target\n"
        '        by_name = name != "" and fnmatch.fnmatchcase(name, target)\n'
        "        if by_class or by_name:\n"
        "            module.forward = functools.partial(_checkpointed, module.forward)\n"
        "            wrapped.append(name)\n"
        "    if not wrapped:\n"
        '        raise ValueError(f"checkpoint target {target!r} matches no module of the model")\n'
        "    return wrapped"
    )
    if policy == "full":
        snippet.imports.add("from torch.utils.checkpoint import checkpoint")
        snippet.helpers.append(
            "def _checkpointed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:\n"
            "    # Full checkpointing keeps only the module's inputs. Non-reentrant is the mode\n"
            "    # PyTorch recommends: it supports keyword arguments and torch.compile.\n"
            "    return checkpoint(forward, *args, use_reentrant=False, **kwargs)"
        )
        return
    snippet.imports.add(
        "from torch.utils.checkpoint import (\n"
        "    CheckpointPolicy,\n"
        "    checkpoint,\n"
        "    create_selective_checkpoint_contexts,\n"
        ")"
    )
    names = "".join(f"        {q(name)},\n" for name in SAVED_OP_NAMES)
    snippet.constants += [
        "",
        "# Selective checkpointing saves the outputs of these compute-heavy ops and recomputes",
        "# only the cheap (memory-bound) ones in backward. Attention kernels vary by build.",
        "SAVED_OPS = frozenset(\n"
        "    getattr(torch.ops.aten, name).default\n"
        f"    for name in (\n{names}    )\n"
        "    if hasattr(torch.ops.aten, name)\n"
        ")",
    ]
    snippet.helpers += [
        "def _save_heavy_ops(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:\n"
        "    if op in SAVED_OPS:\n"
        "        return CheckpointPolicy.MUST_SAVE\n"
        "    return CheckpointPolicy.PREFER_RECOMPUTE",
        "def _checkpointed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:\n"
        "    # Non-reentrant, as PyTorch recommends; context_fn applies the selective policy.\n"
        "    policy = functools.partial(create_selective_checkpoint_contexts, _save_heavy_ops)\n"
        "    return checkpoint(forward, *args, use_reentrant=False, context_fn=policy, **kwargs)",
    ]


def _space(ctx: SpaceContext) -> Space:
    return {"activation_checkpointing": ("off", "full", "selective")}


def _apply(step: TrainStep) -> None:
    config, workload = step.config, step.workload
    if config.activation_checkpointing != "off":
        step.applied.append(
            apply_activation_checkpointing(
                step.base_model,
                config.activation_checkpointing,
                config.checkpoint_target,
                workload.checkpoint_target,
                workload.name,
            )
        )


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    if name == "checkpoint_target":
        return "the modules to checkpoint (class name or name glob)"
    return {
        "full": "recompute the target modules' activations in backward",
        "selective": "recompute the target modules' cheap ops, keep matmul/conv/attention outputs",
    }.get(value)


LEVER = Lever(
    name="activation_checkpointing",
    fields=("activation_checkpointing", "checkpoint_target"),
    summary="recompute the target blocks' activations in backward: less memory for about one more forward",
    availability=always("activation_checkpointing"),
    open_fields=("checkpoint_target",),
    snippet=_snippet,
    space=_space,
    fixed={"checkpoint_target": "which blocks to checkpoint is the model's choice; set it in the baseline"},
    apply=_apply,
    describe=_describe,
)
