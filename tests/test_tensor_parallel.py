"""Tensor and sequence parallelism: the layout against one process, DTensor's own placements, the
collectives counted by DTensor's CommDebugMode, and refusals checked by arithmetic on the presets.

The torchrun tests launch 2 gloo ranks (≈6 s each here); the 4-rank 2-D run is the slow one.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.analysis.compare import summarize
from workbench.analysis.numerics import relative_deviation
from workbench.config import ConfigError, TrainConfig
from workbench.distributed.sharding import data_parallel_position
from workbench.levers import registry
from workbench.levers.tensor_parallel import check_model_parallel, parallel_style
from workbench.levers.tp_plan import hugging_face_plan, matching, plan_for
from workbench.trials import run_trial
from workbench.workloads import Workload, load_workload, planner, vlm

TESTS = Path(__file__).resolve().parent
TP2 = TrainConfig(tensor_parallel=2, nproc_per_node=2)
TP2_SP = TP2.replace(sequence_parallel=True)


def run_ranks(tmp_path: Path, workload: str, config: TrainConfig) -> dict:
    """tests/tp_rank_check.py on 2 gloo ranks: one step split vs whole, as rank 0 saw it."""
    out = tmp_path / "report.json"
    overrides = ",".join(f"{k}={v[1]}" for k, v in TrainConfig().diff(config).items()).lower()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*command, str(TESTS / "tp_rank_check.py"), str(out), workload, overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


# --- the layout on 2 ranks against one process ------------------------------------------------


def test_tp2_with_sequence_parallel_matches_one_process_and_places_what_the_plan_says(tmp_path: Path) -> None:
    report = run_ranks(tmp_path, "driving-vlm", TP2_SP)
    assert report["loss"] == pytest.approx(report["whole_loss"], rel=1e-6)
    assert report["max_grad_diff"] < 1e-5  # every gradient, gathered to full size
    placements, shapes = report["placements"], report["local_shape"]
    size = vlm.PRESETS["tiny"]
    assert placements["blocks.0.attn.qkv.weight"] == ["S(0)"]  # column-wise: output rows split
    assert placements["blocks.0.attn.proj.weight"] == ["S(1)"]  # row-wise: input columns split
    assert placements["blocks.0.norm1.weight"] == ["R"]  # sequence-parallel norm: a replicated DTensor
    assert placements["lm_head.weight"] == ["S(0)"]  # the vocabulary split
    assert shapes["blocks.0.attn.qkv.weight"] == [3 * size.text_dim // 2, size.text_dim]
    assert shapes["lm_head.weight"] == [size.vocab // 2, size.text_dim]
    # Per forward: an all-gather before each column-wise layer (2 per block), one gathering the
    # region's output and one the logits; a reduce-scatter after each row-wise layer (2 per block).
    assert report["comm_counts"] == {
        "all_gather_into_tensor": 2 * size.text_depth + 2,
        "reduce_scatter_tensor": 2 * size.text_depth,
    }
    # The workbench's counter agrees with CommDebugMode, and its bytes are the activations' sizes:
    # (batch, decoder sequence, width) for the blocks and the region's output, (batch, text, vocab) logits.
    counted = report["counted"]
    assert {kind: entry["count"] for kind, entry in counted.items()} == {
        "all_gather": 2 * size.text_depth + 2,
        "reduce_scatter": 2 * size.text_depth,
    }
    sequence = (size.image // size.patch) ** 2 + size.text_len
    activation, logits = (
        size.batch_size * sequence * size.text_dim * 4,
        size.batch_size * size.text_len * size.vocab * 4,
    )
    assert counted["all_gather"]["bytes"] == (2 * size.text_depth + 1) * activation + logits
    assert counted["reduce_scatter"]["bytes"] == 2 * size.text_depth * activation
    assert "holds" in report["applied"]["tensor_parallel"] and "sequence_parallel" in report["applied"]


def test_tp2_without_sequence_parallel_all_reduces_once_per_row_wise_layer(tmp_path: Path) -> None:
    report = run_ranks(tmp_path, "driving-vlm", TP2)
    assert report["loss"] == pytest.approx(report["whole_loss"], rel=1e-6)
    assert report["max_grad_diff"] < 1e-5
    assert report["placements"]["blocks.0.norm1.weight"] is None  # a plain tensor, whole on each rank
    depth = vlm.PRESETS["tiny"].text_depth
    assert report["comm_counts"] == {"all_reduce": 2 * depth, "all_gather_into_tensor": 1}


@pytest.mark.parametrize(
    "after",
    [{"activation_checkpointing": "full"}, {"compile": "default", "compile_backend": "aot_eager"}],
    ids=["checkpointing", "compile"],
)
def test_tp_and_sp_compose_with_the_levers_applied_after_them(tmp_path: Path, after: dict) -> None:
    """Checkpointing wraps, and compile traces, the split blocks: still one process's loss and gradients."""
    report = run_ranks(tmp_path, "driving-vlm", TP2_SP.replace(**after))
    assert report["loss"] == pytest.approx(report["whole_loss"], rel=1e-6)
    assert report["max_grad_diff"] < 1e-5
    assert next(iter(after)) in report["applied"]  # the lever really applied, after tensor parallelism
    assert list(report["applied"]).index("tensor_parallel") < list(report["applied"]).index(next(iter(after)))


def test_a_hugging_face_causal_lm_runs_tp2_with_its_own_declared_plan(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    report = run_ranks(tmp_path, "hf_llama_workload:workload", TP2)
    assert report["loss"] == pytest.approx(report["whole_loss"], rel=1e-6)
    assert report["max_grad_diff"] < 1e-5
    assert report["placements"]["model.layers.0.self_attn.q_proj.weight"] == ["S(0)"]
    assert report["placements"]["model.layers.0.self_attn.o_proj.weight"] == ["S(1)"]
    assert "base_model_tp_plan" in report["applied"]["tensor_parallel"]


def test_a_tp2_sp_trial_follows_the_single_process_losses_step_by_step() -> None:
    """Through run_trial (torchrun, the optimizer included): the numerics guard's question."""
    one = run_trial("driving-vlm", TrainConfig(), warmup=1, steps=2, device="cpu", timeout_s=180)
    split = run_trial("driving-vlm", TP2_SP, warmup=1, steps=2, device="cpu", timeout_s=180)
    assert split.status == "ok", split.message
    assert relative_deviation(one.losses, split.losses) < 1e-5
    assert split.distributed is not None and split.distributed["world_size"] == 2
    records = {a["toggle"] for a in split.applied}
    assert {"tensor_parallel", "sequence_parallel"} <= records
    # What the layout costs, per rank: the parameters held (half of each split layer) and the
    # collectives of one step, which `compare` shows beside the times.
    whole = sum(p.numel() * 4 for p in vlm.DrivingVlm(vlm.PRESETS["tiny"]).parameters())
    held = split.distributed["parameter_bytes"]
    assert len(held) == 2 and all(whole / 2 < b < whole for b in held)
    steps = split.distributed["collectives"]
    assert all(set(step) >= {"all_gather", "reduce_scatter"} for step in steps), steps
    summary = summarize([split])
    assert summary.layout is not None and summary.layout["parameter_bytes_per_rank"] == max(held)
    assert summarize([one]).layout is None


# --- refusals, checked by arithmetic ------------------------------------------------------------


def test_tp3_on_the_tiny_vlm_is_refused_naming_what_does_not_divide_and_the_degrees_that_would() -> None:
    size = vlm.PRESETS["tiny"]
    with pytest.raises(ConfigError) as refused:
        check_model_parallel(load_workload("driving-vlm"), TrainConfig(tensor_parallel=3, nproc_per_node=3))
    message = str(refused.value)
    assert f"heads = {size.text_heads}" in message and f"output features = {size.vocab}" in message
    common = math.gcd(size.text_heads, size.text_dim, 4 * size.text_dim, size.vocab)
    fitting = [d for d in range(2, common + 1) if common % d == 0]
    assert f"degrees that would: {', '.join(map(str, fitting))}" in message


def test_sequence_parallel_on_an_odd_sequence_is_refused_with_its_length() -> None:
    size = planner.PRESETS["tiny"]
    tokens = size.waypoints + 1 + size.route_points + size.cameras * size.tokens_per_camera
    assert tokens % 2  # the planner's tiny sequence is odd
    with pytest.raises(ConfigError, match=rf"blocks sequence length = {tokens}"):
        check_model_parallel(load_workload("e2e-planner"), TP2_SP)
    check_model_parallel(load_workload("e2e-planner"), TP2)  # tensor parallelism alone fits


def test_a_model_without_a_plan_is_refused_with_how_to_give_one() -> None:
    workload = Workload.from_callables(
        lambda: nn.Sequential(nn.Linear(8, 8)), batch_fn=lambda n: torch.randn(n, 8), loss_fn=lambda o, b: o.sum()
    )
    with pytest.raises(ConfigError, match=r"has none; give one: Workload\(\.\.\., tp_plan="):
        check_model_parallel(workload, TP2)
    mistyped = Workload.from_callables(
        lambda: nn.Sequential(nn.Linear(8, 8)),
        batch_fn=lambda n: torch.randn(n, 8),
        loss_fn=lambda o, b: o.sum(),
        tp_plan={"0": "columnwise"},
    )
    with pytest.raises(ConfigError, match=r"'columnwise' is not a style: use one of colwise"):
        check_model_parallel(mistyped, TP2)
    nowhere = Workload.from_callables(
        lambda: nn.Sequential(nn.Linear(8, 8)),
        batch_fn=lambda n: torch.randn(n, 8),
        loss_fn=lambda o, b: o.sum(),
        tp_plan={"encoder.*": "colwise"},
    )
    with pytest.raises(ConfigError, match=r"no module of the model matches"):
        check_model_parallel(nowhere, TP2)


def test_a_users_plan_is_taken_as_given_and_checked_against_the_models_widths() -> None:
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 8))
    workload = Workload.from_callables(
        lambda: model, batch_fn=lambda n: torch.randn(n, 8), loss_fn=lambda o, b: o.sum(), tp_plan={"0": "colwise"}
    )
    assert plan_for(workload, model) == ({"0": "colwise"}, "workload 'custom'")
    check_model_parallel(workload, TP2)
    with pytest.raises(ConfigError, match=r"0 output features = 6; degrees that would: 2, 3, 6"):
        check_model_parallel(workload, TrainConfig(tensor_parallel=4, nproc_per_node=4))


def test_sequence_parallel_needs_a_region_in_the_plan() -> None:
    workload = Workload.from_callables(
        lambda: nn.Sequential(nn.Linear(8, 8)),
        batch_fn=lambda n: torch.randn(n, 8),
        loss_fn=lambda o, b: o.sum(),
        tp_plan={"0": "colwise"},
    )
    with pytest.raises(ConfigError, match=r"needs a 'sequence_region' entry"):
        check_model_parallel(workload, TP2_SP)


def test_the_hugging_face_plan_is_the_models_own_under_its_prefix() -> None:
    pytest.importorskip("transformers")
    sys.path.insert(0, str(TESTS))
    from hf_llama_workload import tiny_llama

    model = tiny_llama()
    plan = hugging_face_plan(model)
    for pattern, style in model.config.base_model_tp_plan.items():
        assert plan[f"model.{pattern}"] == style
    assert plan["lm_head"] in ("colwise_rep", "colwise_gather_output")
    with pytest.raises(ConfigError, match=r"config.num_key_value_heads = 2; degrees that would: 2"):
        check_model_parallel(
            Workload.from_callables(tiny_llama, batch_fn=lambda n: {}), TrainConfig(tensor_parallel=4, nproc_per_node=4)
        )


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"sequence_parallel": True}, r"set tensor_parallel=2"),
        ({"tensor_parallel": 3, "nproc_per_node": 2}, r"does not divide the 2 ranks.*degrees that would: 2"),
        ({"tensor_parallel": 2, "nproc_per_node": 2, "strategy": "ddp"}, r"use strategy=fsdp2"),
        ({"tensor_parallel": 2, "nproc_per_node": 4}, r"set nproc_per_node × nnodes = 2, or strategy=fsdp2"),
        ({"tensor_parallel": 0}, r"tensor_parallel must be >= 1"),
    ],
)
def test_the_mesh_must_tile_the_ranks(changes: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**changes)


def test_a_2d_mesh_config_is_valid_and_each_tp_group_trains_one_data_shard() -> None:
    config = TrainConfig(strategy="fsdp2", tensor_parallel=2, nproc_per_node=4)
    assert config.launches_ranks and TP2.launches_ranks and not TrainConfig().launches_ranks
    # Mesh (dp, tp) = (2, 2): ranks 0,1 form the first tp group, ranks 2,3 the second.
    assert [data_parallel_position(config, rank, 4) for rank in range(4)] == [(0, 2), (0, 2), (1, 2), (1, 2)]


def test_plan_styles_are_dtensors_own() -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    colwise = parallel_style("colwise", sequence_split=True)
    assert isinstance(colwise, ColwiseParallel) and colwise.input_layouts == (Shard(1),)
    rowwise = parallel_style("rowwise", sequence_split=True)
    assert isinstance(rowwise, RowwiseParallel) and rowwise.output_layouts == (Shard(1),)
    assert isinstance(parallel_style("sequence_parallel", sequence_split=True), SequenceParallel)
    assert parallel_style("sequence_parallel", sequence_split=False) is None
    assert parallel_style("colwise_rep", sequence_split=False).output_layouts == (Replicate(),)


@pytest.fixture
def four_ranks_allowed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """4 gloo ranks on this 2-core host, for their behaviour. The availability tables are cached per
    device, not per environment: cleared before (a table read earlier would refuse 4 ranks) and after."""
    monkeypatch.setenv("WORKBENCH_CPU_RANKS_MAX", "4")
    registry._lever_availability.cache_clear()
    yield
    registry._lever_availability.cache_clear()


@pytest.mark.skipif(
    (os.cpu_count() or 1) < 2, reason="four gloo ranks on one core would take minutes; two cores run them slowly"
)
def test_a_2d_run_dp2_by_tp2_on_four_ranks_completes_and_follows_one_process(four_ranks_allowed: None) -> None:
    config = TrainConfig(strategy="fsdp2", tensor_parallel=2, sequence_parallel=True, nproc_per_node=4)
    one = run_trial("driving-vlm", TrainConfig(), warmup=1, steps=1, device="cpu", timeout_s=240)
    mesh = run_trial("driving-vlm", config, warmup=1, steps=1, device="cpu", timeout_s=240)
    assert mesh.status == "ok", mesh.message
    assert relative_deviation(one.losses, mesh.losses) < 1e-5
    detail = {a["toggle"]: a["detail"] for a in mesh.applied}
    assert "dp 2 × tp 2 mesh" in detail["tensor_parallel"]
    assert "fully_shard over 2 gloo ranks (the dp dimension" in detail["strategy"]


def test_compare_sets_each_layouts_parameters_per_rank_and_collectives_beside_the_times() -> None:
    """The figures the ranks gathered reach the comparison table as written, for every configuration."""
    from types import SimpleNamespace

    from workbench.analysis.layout_cost import layout_cost
    from workbench.terminal import add_layout_columns

    fsdp = SimpleNamespace(
        distributed={
            "parameter_bytes": [3 * 2**20, 3 * 2**20 + 4],
            "collectives": [
                {"all_gather": {"count": 12, "bytes": 2**21}, "reduce_scatter": {"count": 6, "bytes": 2**20}}
            ],
            "world_size": 2,
        }
    )
    layout = layout_cost([fsdp])  # type: ignore[list-item]
    assert layout is not None and layout["parameter_bytes_per_rank"] == 3 * 2**20 + 4
    assert layout_cost([SimpleNamespace(distributed=None)]) is None  # type: ignore[list-item]
    comp = SimpleNamespace(
        baseline=SimpleNamespace(layout=None), candidates=[SimpleNamespace(summary=SimpleNamespace(layout=layout))]
    )
    headers: list[str] = ["config"]
    rows = [["baseline"], ["fsdp2"]]
    add_layout_columns(headers, rows, comp)  # type: ignore[arg-type]
    assert headers[1:] == ["params/rank", "collectives/step (count × bytes)"]
    assert rows[0][1:] == ["whole", "n/a"]
    assert rows[1][2] == "AG 12 × 2.0 MiB, RS 6 × 1.0 MiB"


# --- GPU-only levers, declared with their reason here -----------------------------------------


def test_capabilities_list_tp_sp_async_tp_and_liger_with_their_reasons_on_a_cpu() -> None:
    from workbench.levers import capabilities, check_config

    caps = capabilities("cpu")
    assert caps["tensor_parallel"][2].available and "gloo" in caps["tensor_parallel"][2].reason
    assert caps["sequence_parallel"][True].available
    assert not caps["async_tp"][True].available and "CUDA" in caps["async_tp"][True].reason
    assert not caps["liger_kernels"][True].available and "CUDA" in caps["liger_kernels"][True].reason
    with pytest.raises(ConfigError, match=r"liger_kernels=True is not available on cpu: Liger's kernels are Triton"):
        check_config(TrainConfig(liger_kernels=True), "cpu")
    with pytest.raises(ConfigError, match=r"async_tp=True is not available on cpu"):
        check_config(TrainConfig(async_tp=True, tensor_parallel=2, nproc_per_node=2, compile="default"), "cpu")


def test_async_tp_needs_tensor_parallelism_and_compile() -> None:
    with pytest.raises(ConfigError, match=r"needs tensor_parallel=2 \(or more\) and compile=default"):
        TrainConfig(async_tp=True)
    with pytest.raises(ConfigError, match=r"needs tensor_parallel=2"):
        TrainConfig(async_tp=True, tensor_parallel=2, nproc_per_node=2)
    TrainConfig(async_tp=True, tensor_parallel=2, nproc_per_node=2, compile="default")


# --- the memory estimate, per rank ------------------------------------------------------------


def test_the_memory_estimate_is_per_rank_holding_the_split_layers_share() -> None:
    """Parameters on a rank: the whole model less half of every split weight (and of a column-wise
    layer's bias), counted from the model itself; sequence parallelism then lowers the activations."""
    import workbench as wb

    model = vlm.DrivingVlm(vlm.PRESETS["tiny"])
    whole = sum(p.numel() * 4 for p in model.parameters())
    split = 0
    for pattern, style in load_workload("driving-vlm").tp_plan.items():
        for _, module in matching(model, pattern):
            if style in ("colwise", "colwise_rep"):
                split += sum(p.numel() * 4 for p in module.parameters())
            elif style == "rowwise":
                split += module.weight.numel() * 4
    one = wb.estimate_memory("driving-vlm", TrainConfig(), "cpu")
    tp = wb.estimate_memory("driving-vlm", TP2, "cpu")
    sp = wb.estimate_memory("driving-vlm", TP2_SP, "cpu")
    assert one.breakdown["parameters"] == whole
    assert tp.breakdown["parameters"] == sp.breakdown["parameters"] == whole - split // 2
    assert sp.peak_bytes < tp.peak_bytes < one.peak_bytes
    assert tp.batch_size == one.batch_size  # a tp group trains the whole global batch
    assert any("rank 0 of 2 (dp 1 × tp 2" in note for note in tp.notes)
    assert not torch.distributed.is_initialized()  # the fake world is gone again


def test_a_sequence_the_meta_check_could_not_see_is_refused_at_the_first_forward() -> None:
    """A model whose forward cannot run on the meta device (it reads a value) is checked in the ranks."""
    from workbench.levers.sequence_parallel import guard_sequence, sequence_lengths

    class ReadsAValue(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.Sequential(nn.Linear(8, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scale = float(x.abs().max())  # a value: no meta kernel can give it
            return self.blocks(x / scale)

    plan = {"blocks": "sequence_region", "blocks.0": "colwise"}
    workload = Workload.from_callables(
        ReadsAValue, batch_fn=lambda n: torch.randn(n, 7, 8), loss_fn=lambda o, b: o.sum(), tp_plan=plan
    )
    with torch.device("meta"):
        meta = ReadsAValue()
    assert sequence_lengths(workload, TP2_SP, plan, meta) == {}
    model = ReadsAValue()
    guard_sequence(model, plan, 2)
    model(torch.randn(2, 8, 8))  # 8 tokens divide by 2
    with pytest.raises(ConfigError, match=r"the sequence region sequence length = 7 does not divide by 2"):
        model(torch.randn(2, 7, 8))
