"""float8 training (torchao): `nn.Linear` GEMMs in float8, forward and backward, with dynamic scales.

Pays where a Linear's GEMMs are large enough that float8 tensor cores save more than the
scaling and casting kernels cost: torchao reports 0.80x per GEMM on small shapes and 1.39x on
large ones, 1.25x end to end at 8B parameters (8 GPUs), 1.5x at 405B (512 GPUs). So the
per-Linear check below decides, from shapes alone and before any trial, which layers to
convert (its thresholds are torchao's own, measured on H100), and the converter skips the rest.
torchao is an optional extra (`pip install 'training-workbench[float8]'`): only the conversion
imports it; the check is pure Python.
"""

from __future__ import annotations

import fnmatch
import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workbench.config import ConfigError, TrainConfig
from workbench.device import ALWAYS, Availability, cuda_capability
from workbench.levers.base import Lever, Space, SpaceContext, probed
from workbench.levers.fragment import Snippet, call, q
from workbench.levers.record import Applied, name_list

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep

FLOAT8_CAPABILITY = (8, 9)
"""Ada/Hopper: the first NVIDIA generations with float8 tensor cores (`torch._scaled_mm`)."""

INSTALL_HINT = "pip install 'training-workbench[float8]' (or pip install torchao)"


@dataclass(frozen=True)
class LinearVerdict:
    """One `nn.Linear`: its shape and whether converting it to float8 is predicted to pay."""

    name: str
    in_features: int
    out_features: int
    convert: bool
    reason: str


def float8_worth_converting(in_features: int, out_features: int, recipe: str) -> tuple[bool, str]:
    """Whether a Linear of this shape gains from float8 under `recipe`, and why (pure: shapes only).

    float8 GEMMs need every dimension divisible by 16. Below the size thresholds torchao measured
    on H100 (its `_auto_filter_for_recipe`), the casts cost more than the faster GEMM saves.
    torchao reads `N, K = weight.shape`: N is out_features, K is in_features.
    """
    shape = f"{in_features}->{out_features}"
    n, k = out_features, in_features
    if k % 16 or n % 16:
        return False, f"{shape}: float8 GEMMs need both dimensions divisible by 16"
    if recipe == "tensorwise":
        if k <= 4096 and n <= 1024:
            return False, f"{shape}: too small for tensorwise (gains need in > 4096 or out > 1024)"
        return True, f"{shape}: large enough for tensorwise float8"
    if recipe == "rowwise":
        if n <= 2048:
            return False, f"{shape}: too small for rowwise (gains need out > 2048)"
        if k <= 1024:
            return False, f"{shape}: too small for rowwise (gains need in > 1024)"
        if n <= 4096 and k <= 2048:
            return False, f"{shape}: too small for rowwise (gains need out > 4096 or in > 2048)"
        return True, f"{shape}: large enough for rowwise float8"
    raise ConfigError(f"float8 recipe must be 'tensorwise' or 'rowwise', got {recipe!r}")


def _skipped(name: str, skip: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in skip)


def float8_plan(model: nn.Module, recipe: str, skip: Iterable[str] = ()) -> list[LinearVerdict]:
    """Every `nn.Linear` of `model` with its verdict; names matching a `skip` glob are kept as-is."""
    skip = tuple(skip)
    plan = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if _skipped(name, skip):
            verdict = (False, "skipped by the module filter")
        else:
            verdict = float8_worth_converting(module.in_features, module.out_features, recipe)
        plan.append(LinearVerdict(name, module.in_features, module.out_features, *verdict))
    return plan


def float8_module_filter(recipe: str, skip: Iterable[str] = ()) -> Callable[[nn.Module, str], bool]:
    """torchao's `module_filter_fn(module, fqn)`: convert exactly the Linears the plan converts."""
    skip = tuple(skip)

    def module_filter(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear) or _skipped(fqn, skip):
            return False
        return float8_worth_converting(module.in_features, module.out_features, recipe)[0]

    return module_filter


def torchao_float8() -> Any:
    """`torchao.float8`, or a clear error naming the extra to install."""
    try:
        import torchao.float8 as float8
    except ImportError as exc:
        raise ConfigError(f"float8 training needs torchao, which is not importable ({exc}); {INSTALL_HINT}") from None
    return float8


def apply_float8(model: nn.Module, recipe: str) -> Applied:
    """Swap the Linears worth converting for torchao's Float8Linear; refuse when none is."""
    plan = float8_plan(model, recipe)
    chosen = [v.name for v in plan if v.convert]
    if not chosen:
        shown = "; ".join(v.reason for v in plan[:3]) or "the model has no nn.Linear"
        raise ConfigError(
            f"float8={recipe}: no nn.Linear of {type(model).__name__} is large enough to gain ({shown}); "
            "float8 pays on large GEMMs (e.g. 4096-wide transformers): set float8=off"
        )
    float8 = torchao_float8()
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    float8.convert_to_float8_training(model, config=config, module_filter_fn=float8_module_filter(recipe))
    detail = f"{len(chosen)} of {len(plan)} nn.Linear converted to Float8Linear ({recipe} scales): {name_list(chosen)}"
    return Applied("float8", recipe, detail)


def float8_availability(recipe: str, dev: torch.device) -> Availability:
    if recipe == "off":
        return ALWAYS
    need = ".".join(map(str, FLOAT8_CAPABILITY))
    if dev.type != "cuda":
        return Availability(
            False,
            f"float8 training needs float8 tensor cores: an NVIDIA GPU of compute capability {need}+ "
            f"(Ada, Hopper or newer); this trial runs on {dev.type}",
        )
    capability = cuda_capability(dev)
    if capability < FLOAT8_CAPABILITY:
        return Availability(
            False, f"this GPU is compute capability {capability[0]}.{capability[1]}: float8 GEMMs need {need}+"
        )
    if importlib.util.find_spec("torchao") is None:
        return Availability(False, f"float8 training needs torchao, which is not installed: {INSTALL_HINT}")
    return Availability(True, "needs compile on; converts only the nn.Linear layers large enough to gain")


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    if config.float8 == "off":
        return
    _float8_filter(snippet, config.float8)
    snippet.model_steps += [
        "    # float8 GEMMs for the Linears large enough to gain (float8_worth_converting).",
        "    # Before checkpointing and compile: they must see the converted modules.",
        *call(
            "convert_to_float8_training",
            [
                "model",
                f"config=Float8LinearConfig.from_recipe_name({q(config.float8)})",
                "module_filter_fn=float8_worth_converting",
            ],
            indent=4,
        ),
    ]


def _float8_filter(snippet: Snippet, recipe: str) -> None:
    """The per-Linear filter torchao calls; `float8_worth_converting` above, in plain PyTorch."""
    snippet.imports.add("from torchao.float8 import Float8LinearConfig, convert_to_float8_training")
    if recipe == "tensorwise":
        rule = [
            "    # Smaller GEMMs lose: the casts cost more than the float8 GEMM saves (torchao's",
            "    # thresholds for tensorwise scales, measured on H100).",
            "    return in_features > 4096 or out_features > 1024",
        ]
    else:
        rule = [
            "    # Smaller GEMMs lose: the casts cost more than the float8 GEMM saves (torchao's",
            "    # thresholds for rowwise scales, measured on H100).",
            "    if out_features <= 2048 or in_features <= 1024:",
            "        return False",
            "    return out_features > 4096 or in_features > 2048",
        ]
    snippet.helpers.append(
        "\n".join(
            [
                "def float8_worth_converting(module: nn.Module, fqn: str) -> bool:",
                '    """Convert an nn.Linear to float8 only where its GEMMs are large enough to gain."""',
                "    if not isinstance(module, nn.Linear):",
                "        return False",
                "    in_features, out_features = module.in_features, module.out_features",
                "    if in_features % 16 or out_features % 16:  # float8 GEMMs need multiples of 16",
                "        return False",
                *rule,
            ]
        )
    )


def _space(ctx: SpaceContext) -> Space:
    """Where compile is searched: its combinations with compile=off are refused and never run."""
    return {} if ctx.compile_modes == ("off",) else {"float8": ctx.available("float8")}


def _apply(step: TrainStep) -> None:
    if step.config.float8 != "off":
        step.applied.append(apply_float8(step.base_model, step.config.float8))


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    return f"float8 GEMMs ({value} scales) for the nn.Linear layers large enough to gain"


LEVER = Lever(
    name="float8",
    fields=("float8",),
    summary="float8 GEMMs for large nn.Linear layers (torchao): faster matmuls on Ada/Hopper+ GPUs",
    availability=probed(float8=float8_availability),
    snippet=_snippet,
    space=_space,
    apply=_apply,
    describe=_describe,
)
