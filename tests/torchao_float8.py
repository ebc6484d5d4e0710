"""torchao's own per-Linear float8 filter (`_auto_filter_for_recipe`), asked in a subprocess.

The truth for the float8 shape check is torchao's code, not a table typed here. It is asked in a
fresh interpreter because importing torchao registers custom ops and pytree constants in torch,
and the rest of the test session should see torch as the product's users without torchao do.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

import pytest

_ASK = """
import json, sys
from torch import nn
from torchao.float8.float8_linear_utils import _auto_filter_for_recipe
shapes, recipe = json.loads(sys.argv[1]), sys.argv[2]
keep = _auto_filter_for_recipe(recipe, filter_fqns=[])
print(json.dumps([keep(nn.Linear(i, o, device="meta"), "layer") for i, o in shapes]))
"""


def torchao_verdicts(shapes: Sequence[tuple[int, int]], recipe: str) -> list[bool]:
    """torchao's verdict for each `(in_features, out_features)`; skips the test without torchao."""
    done = subprocess.run(
        [sys.executable, "-c", _ASK, json.dumps(list(shapes)), recipe], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        if "ModuleNotFoundError" in done.stderr or "ImportError" in done.stderr:
            last = done.stderr.strip().splitlines()[-1]
            pytest.skip(f"torchao's float8 filter is not importable here ({last}): pip install -e '.[float8]'")
        raise AssertionError(f"asking torchao's filter failed:\n{done.stderr[-3000:]}")
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(verdicts) == len(shapes)
    return [bool(v) for v in verdicts]
