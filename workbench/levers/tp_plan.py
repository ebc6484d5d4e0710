"""Tensor-parallel plans: where a model's plan comes from, and whether the model divides by a degree.

A plan maps module-name patterns to styles, in the words Hugging Face uses ('colwise',
'rowwise', 'colwise_rep') plus two of ours for sequence parallelism ('sequence_parallel' for a
norm, 'sequence_region' for the stack whose residual stream is split along the sequence). The
check is arithmetic on the model's own shapes, so a refusal comes before any rank starts.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from typing import Any

from torch import nn

from workbench.config import ConfigError
from workbench.workloads.base import Workload

COLWISE = ("colwise", "colwise_rep", "colwise_gather_output")
"""Styles that split a layer's outputs (Linear out_features, Embedding's embedding_dim)."""
ROWWISE = ("rowwise", "rowwise_rep", "embedding_rowwise")
"""Styles that split a layer's inputs (Linear in_features, Embedding's vocabulary)."""
SEQUENCE = ("sequence_parallel", "sequence_region")
STYLE_NAMES = (*COLWISE, *ROWWISE, *SEQUENCE)

HEAD_ATTRIBUTES = ("heads", "num_heads", "num_attention_heads", "num_key_value_heads")
"""Attributes that count attention heads on an attention module (ours, and common model code)."""

HOW_TO_GIVE_A_PLAN = (
    "give one: Workload(..., tp_plan={'layers.*.attn.q_proj': 'colwise', 'layers.*.attn.o_proj': 'rowwise', "
    "'layers.*.mlp.up_proj': 'colwise', 'layers.*.mlp.down_proj': 'rowwise'}) (module-name patterns → "
    f"{', '.join(STYLE_NAMES)} or a DTensor ParallelStyle), or load a Hugging Face model whose config "
    "declares base_model_tp_plan"
)


def plan_for(workload: Workload, model: nn.Module) -> tuple[dict[str, Any], str]:
    """The workload's plan, else the Hugging Face model's own; with where it came from."""
    if workload.tp_plan is not None:
        plan, source = dict(workload.tp_plan), f"workload '{workload.name}'"
    else:
        plan, source = hugging_face_plan(model), "the model's config.base_model_tp_plan"
    if not plan:
        raise ConfigError(f"tensor_parallel needs a plan and workload '{workload.name}' has none; {HOW_TO_GIVE_A_PLAN}")
    for pattern, style in plan.items():
        if isinstance(style, str) and style not in STYLE_NAMES:
            raise ConfigError(
                f"tp_plan[{pattern!r}] = {style!r} is not a style: use one of {', '.join(STYLE_NAMES)}, "
                "or a torch.distributed.tensor.parallel ParallelStyle"
            )
    if not any(matching(model, pattern) for pattern in plan):
        raise ConfigError(f"no module of the model matches the tp_plan from {source} ({', '.join(plan)})")
    return plan, source


def hugging_face_plan(model: nn.Module) -> dict[str, Any]:
    """A transformers model's declared plan: its config's `base_model_tp_plan` under the base
    model's prefix, plus the model's own `_tp_plan` (the vocabulary projection; transformers
    merges the whole plan there once the model is built, embedding included)."""
    config = getattr(model, "config", None)
    declared = getattr(config, "base_model_tp_plan", None) or {}
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and not hasattr(model, prefix):
        prefix = ""  # the base model itself, not a model with a head around it
    plan = {f"{prefix}.{pattern}" if prefix else pattern: style for pattern, style in declared.items()}
    plan.update(getattr(model, "_tp_plan", None) or {})
    return plan


def matching(model: nn.Module, pattern: str) -> list[tuple[str, nn.Module]]:
    """Modules whose names match `pattern` atom by atom (as `parallelize_module` matches them)."""
    atoms = pattern.split(".")
    return [
        (name, module)
        for name, module in model.named_modules()
        if name
        and len(name.split(".")) == len(atoms)
        and all(fnmatch.fnmatchcase(part, atom) for part, atom in zip(name.split("."), atoms, strict=True))
    ]


def split_sizes(model: nn.Module, plan: Mapping[str, Any]) -> dict[str, int]:
    """Every size the plan splits, named for the refusal: heads, features, vocabulary."""
    sizes: dict[str, int] = {}
    modules = dict(model.named_modules())
    for pattern, style in plan.items():
        if not isinstance(style, str) or style in SEQUENCE:
            continue
        for name, module in matching(model, pattern):
            size = _split_size(module, style in COLWISE)
            if size is not None:
                sizes[f"{pattern} {size[0]}"] = size[1]
            parent = modules.get(name.rpartition(".")[0])
            for attribute in HEAD_ATTRIBUTES:
                heads = getattr(parent, attribute, None)
                if isinstance(heads, int) and not isinstance(heads, bool):
                    sizes[f"{name.rpartition('.')[0]} {attribute}"] = heads
            break  # the pattern's first match stands for its repeats (blocks of one shape)
    config = getattr(model, "config", None)
    for attribute in ("num_attention_heads", "num_key_value_heads"):
        value = getattr(config, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            sizes[f"config.{attribute}"] = value
    return sizes


def _split_size(module: nn.Module, colwise: bool) -> tuple[str, int] | None:
    if isinstance(module, nn.Linear):
        return ("output features", module.out_features) if colwise else ("input features", module.in_features)
    if isinstance(module, nn.Embedding):
        return ("embedding width", module.embedding_dim) if colwise else ("vocabulary", module.num_embeddings)
    return None


def check_divides(sizes: Mapping[str, int], degree: int, subject: str) -> None:
    """Refuse a degree that leaves any split size with a remainder, naming them and the degrees that fit."""
    bad = {name: size for name, size in sizes.items() if size % degree}
    if not bad:
        return
    common = math.gcd(*sizes.values())
    fitting = [d for d in range(2, min(common, 64) + 1) if common % d == 0]
    listed = "; ".join(f"{name} = {size}" for name, size in bad.items())
    raise ConfigError(
        f"tensor_parallel={degree} does not divide what {subject} splits: {listed}; "
        f"degrees that would: {', '.join(map(str, fitting)) or 'none above 1'}"
    )
