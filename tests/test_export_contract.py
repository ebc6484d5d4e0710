"""Contract: the exported snippet, run on the trial's workload, seed and batches, is the trial.

For every configuration of the export matrix that this machine runs (the workbench's own
`check_config` decides), a trial runs inline and the exported snippet runs as a user's file
on the same workload, seed and batches (`snippet_runner`). What the trial records as resolved
(the optimizer implementation PyTorch picked, the fp32 precision flags, the intra-op thread
count) must be what the snippet set up, and the per-step losses must be equal:

- bitwise wherever both run the same ATen kernels in the same order: eager at any dtype, and
  compiled without inductor's code generation. The numerics guard's tolerance would be too
  weak there: a snippet seeded differently stays within bf16's, and one that skips dividing
  by the micro-batch count within every dtype's (AdamW all but ignores a gradient's scale);
- within the guard's early tolerance for the dtype where inductor generates the kernels
  (max-autotune picks among them by timing).

The workload is driving-vlm: a convolution (patch embedding), attention and transformer blocks
to checkpoint, and in batches of 4 its fp16 steps stay short on a CPU without fp16 matrix units,
where bev-perception's fp16 convolutions take about a minute a trial.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from export_matrix import runnable_configs
from snippet_runner import run_snippet

from workbench.analysis.numerics import EARLY_STEPS, early_tolerance, relative_deviation
from workbench.config import TrainConfig, resolved_settings
from workbench.export import export_config
from workbench.levers import capabilities
from workbench.trials import run_trial
from workbench.workloads import Workload, load_workload

WORKLOAD = "driving-vlm"
BATCH_SIZE = 4
"""A quarter of the preset's 16: what is compared does not depend on it, and this CPU emulates fp16 matmuls."""
STEPS = EARLY_STEPS
"""The steps the numerics guard holds to its per-dtype tolerance (initial weights, then updates)."""
CHEAP_BACKEND = "aot_eager"
"""AOTAutograd's forward/backward split and partitioner, as inductor has, without code generation."""

MATRIX = runnable_configs("cpu")
EAGER = [config for config in MATRIX if config.compile == "off"]
COMPILED = [config for config in MATRIX if config.compile != "off"]

# The matrix asks for 4 loader workers, and torch warns where the machine has fewer cores.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def label(config: TrainConfig) -> str:
    return config.describe().replace(", ", ";")


def with_cheap_backend(configs: list[TrainConfig]) -> list[Any]:
    """The compile configurations (inductor, on a CPU) compiled by CHEAP_BACKEND instead.

    Only inductor takes a mode, so compile=default stands for every mode; and the optimizer
    runs outside the compiled graph, so PyTorch's default implementation stands for the
    others in the fast run (the rest are marked slow).
    """
    cheap = [config.replace(compile_backend=CHEAP_BACKEND) for config in configs if config.compile == "default"]
    return [
        pytest.param(config, marks=() if config.optimizer_impl == "default" else pytest.mark.slow, id=label(config))
        for config in cheap
    ]


@pytest.fixture(autouse=True)
def _restore_global_torch_state() -> Iterator[None]:
    """The snippet sets process-wide state (seed, flags) as a user's script would; put it back.

    One intra-op thread: the trial records the count it ran with, and on 2 shared cores one
    thread is the fastest for these tiny models.
    """
    precision, rng, threads = torch.get_float32_matmul_precision(), torch.get_rng_state(), torch.get_num_threads()
    cudnn_tf32 = torch.backends.cudnn.allow_tf32
    torch.set_num_threads(1)
    yield
    torch._dynamo.reset()
    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision(precision)
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    torch.set_rng_state(rng)


def contract_workload() -> Workload:
    """driving-vlm in batches of BATCH_SIZE: the trial and the snippet draw the same batches either way."""
    return dataclasses.replace(load_workload(WORKLOAD), batch_size=BATCH_SIZE)


def assert_snippet_is_the_trial(config: TrainConfig, tmp_path: Path) -> None:
    trial = run_trial(
        contract_workload(), config, isolation="inline", device="cpu", warmup=1, steps=STEPS - 1, track_memory=False
    )
    assert trial.status == "ok", trial.message
    assert len(trial.losses) == STEPS
    torch._dynamo.reset()  # the snippet compiles its own graphs, as in the user's fresh process
    code = export_config(config, "snippet", device="cpu")
    snippet = run_snippet(code, contract_workload(), config, STEPS, tmp_path / "exported_step.py")

    # Every setting the trial says it resolved is compared (a new one must be read from the snippet too).
    assert set(resolved_settings(trial.applied)) <= set(snippet.resolved)
    measured = {a["toggle"]: a["value"] for a in trial.applied if a["toggle"] in snippet.resolved}
    assert measured == snippet.resolved
    if config.compile == "off" or config.compile_backend != "inductor":
        assert snippet.losses == trial.losses, "the same kernels in the same order must give the same bits"
    else:
        deviation = relative_deviation(trial.losses, snippet.losses)
        assert deviation <= early_tolerance(config.amp, config.amp), (trial.losses, snippet.losses)


@pytest.mark.parametrize("config", EAGER, ids=label)
def test_the_eager_snippet_gives_the_trials_losses_and_settings(config: TrainConfig, tmp_path: Path) -> None:
    assert_snippet_is_the_trial(config, tmp_path)


@pytest.mark.parametrize("config", with_cheap_backend(COMPILED))
def test_the_compiled_snippet_gives_the_trials_losses_with_a_cheap_backend(config: TrainConfig, tmp_path: Path) -> None:
    assert_snippet_is_the_trial(config, tmp_path)


FULL_MATRIX = os.environ.get("WORKBENCH_CONTRACT_FULL") == "1"
"""Every inductor configuration of the matrix (~54, half a minute to a minute each, ~half an hour in all)
runs with WORKBENCH_CONTRACT_FULL=1, by hand and before a release; the suite runs the first bf16 one.
Each dtype's kernels and flags are still compared bitwise in the suite by the eager and cheap-backend
tests above; what only inductor adds is its generated code, which one configuration exercises."""


def inductor_sample(configs: list[TrainConfig]) -> list[Any]:
    """The matrix's compile configurations: the first bf16 one always, the rest when FULL_MATRIX."""
    first = next(config for config in configs if config.amp == "bf16")
    params = []
    for config in configs:
        skip = pytest.mark.skipif(
            config is not first and not FULL_MATRIX, reason="set WORKBENCH_CONTRACT_FULL=1 for every one"
        )
        params.append(pytest.param(config, marks=(pytest.mark.slow, skip), id=label(config)))
    return params


@pytest.mark.parametrize("config", inductor_sample(COMPILED))
def test_the_inductor_compiled_snippet_gives_the_trials_losses(config: TrainConfig, tmp_path: Path) -> None:
    """The matrix's own compile configurations: real inductor compiles, a minute each with a cold cache."""
    assert_snippet_is_the_trial(config, tmp_path)


def test_the_matrix_runs_every_value_this_cpu_offers_of_the_main_levers() -> None:
    """The parametrizations above are not vacuous: they reach each amp dtype, compile mode and
    checkpointing policy that `capabilities()` says this CPU runs."""
    offered = capabilities("cpu")
    for name in ("amp", "compile", "activation_checkpointing"):
        available = {value for value, availability in offered[name].items() if availability.available}
        assert {getattr(config, name) for config in MATRIX} == available, name
