"""FlexAttention as the attention backend: the model's SDPA calls go through `flex_attention`.

FlexAttention compiles the attention (and any score or mask modification) into one fused
kernel, and skips fully masked blocks (half of a causal score matrix). It is fast only under
torch.compile: eager runs an unfused reference that materializes the whole score matrix. It
replaces the call where a model's attention goes through the workbench's SDPA path: every
module with an `attention_fn` attribute (the built-in workloads' SelfAttention) gets
`flex_sdpa`, a function with SDPA's signature.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from workbench.config import ConfigError
from workbench.device import Availability
from workbench.levers.base import first_line
from workbench.levers.fragment import Snippet
from workbench.levers.record import Applied, name_list

ATTRIBUTE = "attention_fn"
"""The per-module attention call that `apply_flex_attention` replaces."""


def _causal(batch: Any, head: Any, q_index: torch.Tensor, kv_index: torch.Tensor) -> torch.Tensor:
    return q_index >= kv_index


def flex_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, is_causal: bool = False) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, k, v, is_causal=...)` computed by FlexAttention.

    Causal attention is a block mask, so the kernel skips the blocks above the diagonal.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    block_mask = None
    if is_causal:
        q_len, kv_len = query.shape[-2], key.shape[-2]
        block_mask = create_block_mask(_causal, None, None, q_len, kv_len, device=query.device)
    out = flex_attention(query, key, value, block_mask=block_mask)
    assert isinstance(out, torch.Tensor)  # no return_lse: one tensor
    return out


def attention_modules(model: nn.Module) -> list[str]:
    """Qualified names of the modules whose attention goes through the SDPA path (`attention_fn`)."""
    return [name for name, module in model.named_modules() if callable(getattr(module, ATTRIBUTE, None))]


def apply_flex_attention(model: nn.Module) -> Applied:
    """Route every SDPA-path attention module of `model` through FlexAttention."""
    names = attention_modules(model)
    if not names:
        raise ConfigError(
            f"attention_backend=flex: no module of {type(model).__name__} calls attention through the "
            f"workbench's SDPA path (an `{ATTRIBUTE}` attribute, as workbench.workloads.layers.SelfAttention has); "
            "give your attention module `self.attention_fn = F.scaled_dot_product_attention` and call it, "
            "or choose another attention_backend"
        )
    modules = dict(model.named_modules())
    for name in names:
        setattr(modules[name], ATTRIBUTE, flex_sdpa)
    detail = f"{len(names)} attention module(s) call flex_attention (causal as a block mask): {name_list(names)}"
    return Applied("attention_backend", "flex", detail)


def flex_availability(dev: torch.device) -> Availability:
    """FlexAttention must run forward *and* backward here: training needs both (torch 2.13 has no
    CPU backward, eager or compiled)."""
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:
        return Availability(False, f"torch {torch.__version__} has no torch.nn.attention.flex_attention (2.5+)")
    q = torch.randn(1, 1, 16, 16, device=dev, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the probe runs eagerly on purpose; PyTorch warns about that
        try:
            flex_attention(q, q, q).sum().backward()
        except (NotImplementedError, RuntimeError) as exc:
            return Availability(
                False, f"FlexAttention cannot train on {dev.type} in torch {torch.__version__}: {first_line(exc)}"
            )
    return Availability(True, "needs compile on: FlexAttention's fused kernel exists only under torch.compile")


def flex_snippet(snippet: Snippet) -> None:
    """`flex_sdpa` and `use_flex_attention`; `levers.flex_attention`, in plain PyTorch."""
    snippet.imports.add("from torch.nn.attention.flex_attention import create_block_mask, flex_attention")
    snippet.helpers += [
        "def _causal(\n"
        "    batch: Any, head: Any, q_index: torch.Tensor, kv_index: torch.Tensor\n"
        ") -> torch.Tensor:\n"
        "    return q_index >= kv_index",
        "def flex_sdpa(\n"
        "    query: torch.Tensor,\n"
        "    key: torch.Tensor,\n"
        "    value: torch.Tensor,\n"
        "    *,\n"
        "    is_causal: bool = False,\n"
        ") -> torch.Tensor:\n"
        '    """F.scaled_dot_product_attention(q, k, v, is_causal=...) by FlexAttention.\n'
        "\n"
        "    Causal attention is a block mask: the kernel skips the blocks above the diagonal.\n"
        "    Fast only under torch.compile (eagerly it materializes the whole score matrix).\n"
        '    """\n'
        "    block_mask = None\n"
        "    if is_causal:\n"
        "        q_len, kv_len = query.shape[-2], key.shape[-2]\n"
        "        block_mask = create_block_mask(\n"
        "            _causal, None, None, q_len, kv_len, device=query.device\n"
        "        )\n"
        "    return flex_attention(query, key, value, block_mask=block_mask)",
        "def use_flex_attention(model: nn.Module) -> int:\n"
        '    """Give every module that calls attention through an `attention_fn` attribute\n'
        "    (SDPA's signature) flex_sdpa instead. Where your model calls\n"
        "    F.scaled_dot_product_attention directly, call flex_sdpa there instead.\n"
        '    """\n'
        '    modules = [m for m in model.modules() if callable(getattr(m, "attention_fn", None))]\n'
        "    for module in modules:\n"
        "        module.attention_fn = flex_sdpa\n"
        "    if not modules:\n"
        '        raise ValueError("no module of the model has an attention_fn to replace")\n'
        "    return len(modules)",
    ]
