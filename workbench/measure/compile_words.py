"""Dynamo's graph-break reasons and failed guards, said in plain words with the class of their fix.

Pure string work over what dynamo records (no torch import): a break's reason text opens with
PyTorch's own graph-break type (its `gb_type`), then 'Explanation:' and 'Hint:' lines and, on
newer torch, the link to its page; a recompile's reason is the failed guard ("tensor 'x' size
mismatch at index 0. expected 4, actual 6"). Older torch words them differently: anything not
recognised keeps dynamo's own first line and the class 'other', never an error.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

#: A break's class, for the advice: what kind of code change (or setting) removes it.
BREAK_CLASSES = {
    "data-dependent": "a Python value read from a tensor (`.item()`, `.tolist()`, a branch on a tensor)",
    "explicit": "an explicit `torch._dynamo.graph_break()`",
    "print/logging": "a print or logging call inside the compiled code",
    "skipped function": "a call into code dynamo does not trace (a C extension, a skipped library)",
    "unsupported": "Python or a torch feature dynamo cannot trace",
    "other": "see the reason",
}

_URL = re.compile(r"https://\S+?\.html")
_SIZE = re.compile(
    r"tensor '(?P<name>.+?)' (?P<what>size|stride) mismatch at index (?P<dim>\d+)\. expected (?P<old>\S+), actual (?P<new>\S+)"
)
_DTYPE = re.compile(r"tensor '(?P<name>.+?)' (?P<what>dtype|requires_grad|device|dispatch key set) mismatch")
_VALUE = re.compile(r"(?P<name>[\w\[\]'\"().]+) == (?P<old>[^\s,]+)")


@dataclass
class BreakWords:
    """One graph break's reason: PyTorch's type for it, its explanation, hints and page."""

    gb_type: str
    explanation: str = ""
    hints: list[str] = field(default_factory=list)
    url: str | None = None
    registry_id: str | None = None
    """The break's id in the installed torch's graph-break registry (e.g. 'GB0124'), if it has one."""
    reason_class: str = "other"


def break_words(reason: str, registry: dict[str, str] | None = None) -> BreakWords:
    """Split dynamo's break reason into its type, explanation, hints and link, and classify it."""
    lines = [line.strip() for line in reason.strip().splitlines()]
    gb_type = lines[0] if lines else "unknown"
    explanation = next(
        (line.removeprefix("Explanation:").strip() for line in lines if line.startswith("Explanation:")), ""
    )
    hints = [line.removeprefix("Hint:").strip() for line in lines if line.startswith("Hint:")]
    url_match = _URL.search(reason)
    table = registry if registry is not None else graph_break_ids()
    registry_id = table.get(gb_type)
    url = url_match.group(0) if url_match else None
    if url is None and registry_id is not None:
        url = f"https://meta-pytorch.github.io/compile-graph-break-site/gb/{registry_id.lower()}.html"
    return BreakWords(gb_type, explanation, hints, url, registry_id, classify_break(reason))


def classify_break(reason: str) -> str:
    """The class of a break's fix, from PyTorch's words for it (its type and explanation)."""
    text = reason.lower()
    if "graph_break()" in text:
        return "explicit"
    if any(word in text for word in (".item()", "data-dependent", "data dependent", "tolist", "scalar_outputs")):
        return "data-dependent"
    if "generic_jump" in text or ("jump" in text and "tensor" in text):
        return "data-dependent"  # a branch on a tensor's value: `if x.sum() > 0:`
    if "`print`" in text or "builtin print" in text or "logging" in text:
        return "print/logging"
    if "skip" in text or "marked as skipped" in text:
        return "skipped function"
    if "unsupported" in text or "not support" in text or "does not know how" in text:
        return "unsupported"
    return "other"


@functools.lru_cache(maxsize=1)
def graph_break_ids() -> dict[str, str]:
    """gb_type -> registry id from the installed torch's `_dynamo/graph_break_registry.json`
    ({} where that torch has none: before 2.8 or so). Read as a file, so torch is not imported."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = os.path.join(next(iter(spec.submodule_search_locations)), "_dynamo", "graph_break_registry.json")
    try:
        with open(path, encoding="utf-8") as handle:
            registry: dict[str, Any] = json.load(handle)
    except (OSError, ValueError):
        return {}
    ids: dict[str, str] = {}
    for gb_id, variants in registry.items():
        for variant in variants if isinstance(variants, list) else [variants]:
            if isinstance(variant, dict) and variant.get("Gb_type"):
                ids.setdefault(str(variant["Gb_type"]), gb_id)
    return ids


@dataclass
class GuardWords:
    """One recompile's failed guard in words, with the class of its fix."""

    words: str
    kind: str
    """'size' (a dimension changed), 'value' (a Python number or bool the graph was specialized on),
    'type' (dtype, device, requires_grad) or 'other'."""
    fix: str


def guard_words(reason: str) -> GuardWords:
    """'dim 0 of `x` changed 4 → 6' from "tensor 'L['x']' size mismatch at index 0. expected 4, actual 6"."""
    first = reason.strip().splitlines()[0] if reason.strip() else ""
    first = re.sub(r"^\d+/\d+: ", "", first)  # dynamo prefixes the compile id the guard belonged to
    size = _SIZE.search(first)
    if size:
        name, dim, old, new = _name(size["name"]), size["dim"], size["old"], size["new"]
        what = "dim" if size["what"] == "size" else "stride of dim"
        fix = (
            f"mark dim {dim} of `{name}` dynamic (`torch._dynamo.mark_dynamic({name}, {dim})`) or compile with "
            "dynamic=True; where only a few sizes occur, pad the inputs to a few buckets"
        )
        return GuardWords(f"{what} {dim} of `{name}` changed {old} → {new}", "size", fix)
    typed = _DTYPE.search(first)
    if typed:
        return GuardWords(
            f"the {typed['what']} of `{_name(typed['name'])}` changed",
            "type",
            "feed the compiled model inputs of one dtype and device (cast before the call)",
        )
    value = _VALUE.search(first)
    if value:
        return GuardWords(
            f"a Python value the graph was specialized on changed (`{_name(value['name'])}` was {value['old']})",
            "value",
            "keep that value a tensor (no `.item()`/`float()` on it), or branch with `torch.where`/`torch.cond`; "
            "each new value compiles the graph again",
        )
    return GuardWords(first or "unknown guard", "other", "see the guard; `TORCH_LOGS=recompiles` shows each one")


def _name(source: str) -> str:
    """`x` from dynamo's guard source names: L['x'], args[0], ___stack0."""
    match = re.fullmatch(r"L\[['\"](.+?)['\"]\](.*)", source)
    return (match.group(1) + match.group(2)) if match else source
