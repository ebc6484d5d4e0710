"""Distributed trials through torchrun: DDP and FSDP2 on 2 gloo ranks, cancel, refusals, and their figures.

The torchrun tests each pay a real launch (≈6-12 s on this 2-core machine), so they run few,
short windows. Timing assertions are loose on purpose: the machine is shared.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from proc_watch import no_live_children
from torch import nn

from workbench.analysis.numerics import relative_deviation
from workbench.analysis.ranks import distributed_findings
from workbench.config import ConfigError, TrainConfig
from workbench.distributed import rank_rows
from workbench.distributed.entry import build_parser
from workbench.distributed.overlap import comm_profile, intersect, subtract, union
from workbench.distributed.sharding import shard_workload
from workbench.distributed.stats import summarize_ranks
from workbench.export import to_command
from workbench.levers.build import build
from workbench.measure import StepMeasured, TrialFinished, TrialResult, TrialStarted
from workbench.trials import run_trial
from workbench.workloads import Workload, load_workload

PLANNER = "e2e-planner"
WARMUP, STEPS = 1, 4
LOSS_RTOL = 1e-4
"""Ranks average gradients that one process sums in one go: only reduction order differs (≈1e-7 seen)."""


# --- small workloads ------------------------------------------------------------------------
# (a workload that misbehaves on one rank, and what the trial says of it: test_distributed_failures.py)


class TinyLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.head = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bn(self.conv(x)).mean((2, 3)))


def tiny() -> Workload:
    return Workload.from_callables(
        model_fn=TinyLinear,
        batch_fn=lambda n, g: (torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=8,
        name="tiny-linear",
    )


def batchnorm_workload() -> Workload:
    return Workload.from_callables(
        model_fn=BatchNormNet,
        batch_fn=lambda n, g: (torch.randn(n, 3, 8, 8, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out.float(), batch[1]),
        batch_size=4,
        name="batchnorm-net",
    )


# --- whole trials on 2 gloo ranks ------------------------------------------------------------


@pytest.fixture(scope="module")
def single_process() -> TrialResult:
    """The reference: one process, the same global batch (16), seed and steps."""
    return run_trial(
        PLANNER, TrainConfig(), warmup=WARMUP, steps=STEPS, device="cpu", isolation="inline", track_memory=False
    )


DDP = TrainConfig(
    strategy="ddp", nproc_per_node=2, ddp_bucket_cap_mb=1, ddp_gradient_as_bucket_view=True, ddp_static_graph=True
)
FSDP2 = TrainConfig(strategy="fsdp2", nproc_per_node=2)


@pytest.mark.parametrize("config", [DDP, FSDP2], ids=["ddp", "fsdp2"])
def test_two_rank_trial_matches_single_process_and_reports_every_rank(
    config: TrainConfig, single_process: TrialResult
) -> None:
    events: list[object] = []
    result = run_trial(PLANNER, config, warmup=WARMUP, steps=STEPS, device="cpu", on_event=events.append, timeout_s=180)
    assert result.status == "ok", result.message

    # Rank 0 streamed the same events a single-process trial does.
    assert isinstance(events[0], TrialStarted) and isinstance(events[-1], TrialFinished)
    assert [e.step for e in events if isinstance(e, StepMeasured)] == list(range(WARMUP + STEPS))
    assert result.worker_pid != os.getpid()

    # Every rank's step times came back.
    assert len(result.rank_step_ms) == 2 and all(len(times) == STEPS for times in result.rank_step_ms)
    assert result.rank_step_ms[0] == result.step_ms
    assert [row["rank"] for row in rank_rows(result)] == [0, 1]

    # Same global batch, same seed: the loss follows the single-process run.
    assert result.batch_size == single_process.batch_size == 16
    assert relative_deviation(single_process.losses, result.losses) < LOSS_RTOL
    assert len(result.losses) == len(single_process.losses) == WARMUP + STEPS

    info = result.distributed
    assert info is not None and info["world_size"] == 2 and info["backend"] == "gloo"
    assert info["strategy"] == config.strategy
    assert info["compute_ms"] > 0 and info["comm_ms"] > 0, info
    assert 0.0 <= info["hidden_share"] <= 1.0
    assert info["overlap_ms"] <= min(info["comm_ms"], info["compute_ms"]) + 1e-6
    assert info["allreduce"]["busbw_gbps"] > 0 and info["allreduce"]["bytes"] > 0
    assert info["rank_skew"] is not None and info["rank_skew"] >= 0
    strategy_record = next(a for a in result.applied if a["toggle"] == "strategy")
    if config.strategy == "ddp":
        assert "1 MB buckets" in strategy_record["detail"] and "static_graph=True" in strategy_record["detail"]
        assert info["step_comm_bytes"] > 0
    else:
        assert "4 block(s)" in strategy_record["detail"]
    assert isinstance(distributed_findings(result), list)
    assert TrialResult.from_json(result.to_json()).to_dict() == result.to_dict()
    assert no_live_children()


def test_cancel_stops_torchrun_and_every_rank() -> None:
    cancel = threading.Event()

    def on_event(event: object) -> None:
        if isinstance(event, StepMeasured):
            cancel.set()

    begin = time.monotonic()
    result = run_trial(
        tiny(),
        TrainConfig(strategy="ddp", nproc_per_node=2),
        warmup=1,
        steps=1000,
        device="cpu",
        on_event=on_event,
        cancel=cancel,
        timeout_s=120,
    )
    assert result.status == "cancelled"
    assert time.monotonic() - begin < 60
    assert no_live_children()


def test_an_input_error_found_on_the_ranks_is_raised_in_the_caller() -> None:
    config = TrainConfig(strategy="fsdp2", nproc_per_node=2, fsdp_param_dtype="bf16")
    with pytest.raises(ConfigError, match=r"BatchNorm.*needs amp=bf16"):
        run_trial(batchnorm_workload(), config, warmup=1, steps=1, device="cpu", timeout_s=120)


# --- refused before any process starts -----------------------------------------------------


def test_bf16_hook_on_gloo_is_a_clear_config_error() -> None:
    config = TrainConfig(strategy="ddp", nproc_per_node=2, comm_hook="bf16")
    with pytest.raises(ConfigError, match=r"comm_hook=bf16 is not available on cpu.*NCCL.*comm_hook=fp16"):
        run_trial(PLANNER, config, device="cpu")


def test_a_global_batch_that_does_not_split_is_refused() -> None:
    config = TrainConfig(strategy="ddp", nproc_per_node=2, batch_size=5)
    with pytest.raises(ConfigError, match=r"batch_size 5 .* does not split evenly over 2 ranks"):
        run_trial(PLANNER, config, device="cpu")


def test_distributed_trials_refuse_inline_and_multi_node_launches() -> None:
    with pytest.raises(ConfigError, match="isolation='inline'"):
        run_trial(PLANNER, TrainConfig(strategy="ddp", nproc_per_node=2), device="cpu", isolation="inline")
    multi = TrainConfig(strategy="ddp", nproc_per_node=1, nnodes=2, rdzv_endpoint="node0:29500")
    with pytest.raises(ConfigError, match="export --format command"):
        run_trial(PLANNER, multi, device="cpu")


# --- pieces, in process -------------------------------------------------------------------


@pytest.mark.parametrize("workload", [load_workload(PLANNER), tiny()], ids=["dataset", "batch_fn"])
def test_rank_shards_put_together_are_the_global_batch(workload: Workload) -> None:
    config = TrainConfig(batch_size=8)
    whole = workload.batches(config)
    shards = [shard_workload(workload, config, rank, 2) for rank in range(2)]
    streams = [wl.batches(cfg) for wl, cfg in shards]
    for _ in range(3):  # three consecutive global batches
        expected = next(whole)
        parts = [next(stream) for stream in streams]
        first = expected["cam_tokens"] if isinstance(expected, dict) else expected[0]
        pieces = [p["cam_tokens"] if isinstance(p, dict) else p[0] for p in parts]
        assert all(piece.shape[0] == 4 for piece in pieces)
        assert torch.equal(torch.cat(pieces), first)


def test_interval_arithmetic_and_overlap_figures() -> None:
    assert union([(5, 7), (0, 2), (1, 3)]) == [(0, 3), (5, 7)]
    assert intersect([(0, 10)], [(2, 3), (8, 12)]) == [(2, 3), (8, 10)]
    assert subtract([(0, 10)], [(2, 3), (8, 12)]) == [(0, 2), (3, 8)]
    # Two steps of 10 ms: compute 0-6 ms, communication 4-9 ms of each step (µs intervals).
    compute = [(0, 6000), (10000, 16000)]
    comm = [(4000, 9000), (14000, 19000)]
    profile = comm_profile(compute, comm, window_ms=20.0, steps=2)
    assert (profile.step_ms, profile.compute_ms, profile.comm_ms, profile.overlap_ms) == (10.0, 6.0, 5.0, 2.0)
    assert profile.exposed_comm_ms == 3.0 and profile.hidden_share == pytest.approx(0.4)


def _rank_data(
    rank: int,
    compute_ms: float,
    comm_ms: float,
    overlap_ms: float,
    steps: list[float],
    data_ms: float = 5.0,
    wait_ms: float = 2.0,
) -> dict:
    profile = {
        "steps": 3,
        "step_ms": 100.0,
        "compute_ms": compute_ms,
        "comm_ms": comm_ms,
        "overlap_ms": overlap_ms,
        "exposed_comm_ms": comm_ms - overlap_ms,
        "hidden_share": overlap_ms / comm_ms,
    }
    probe = {"bytes": 1e6, "time_ms": 1.0 + rank, "algbw_gbps": 1.0 / (1 + rank), "busbw_gbps": 1.0 / (1 + rank)}
    n = len(steps)
    phases = {"data": [data_ms] * n, "forward": [30.0] * n, "backward": [40.0 + wait_ms] * n, "optimizer": [5.0] * n}
    return {
        "rank": rank,
        "host": "h",
        "step_ms": steps,
        "profile": profile,
        "allreduce": probe,
        "phase_ms": phases,
        "sync_wait_ms": [wait_ms] * n,
        "phase_wait_ms": {"backward": [wait_ms] * n},
    }


def test_rank_summary_and_findings_from_known_figures() -> None:
    """Rank 1's loader takes 40 ms longer: rank 0 waits 40 ms for it at every gradient sync, which its profile
    counts as exposed communication. The finding is the straggler with its cause, not 'synchronization bound'."""
    config = TrainConfig(strategy="ddp", nproc_per_node=2)
    steps = [100.0, 102.0, 98.0, 100.0, 101.0, 99.0, 100.0, 100.0]
    gathered = [
        _rank_data(0, 40.0, 60.0, 10.0, steps, data_ms=5.0, wait_ms=42.0),
        _rank_data(1, 40.0, 20.0, 10.0, steps, data_ms=45.0, wait_ms=2.0),
    ]
    info = summarize_ranks(gathered, config, "gloo", 2, step_comm_bytes=3_000_000)
    assert info["compute_ms"] == 40.0 and info["exposed_comm_ms"] == 30.0
    assert info["comm_share"] == pytest.approx(0.3) and info["hidden_share"] == pytest.approx(10 / 40)
    assert info["rank_skew"] == pytest.approx(0.0)
    assert info["allreduce"]["time_ms"] == 2.0  # the slowest rank bounds a collective
    assert info["step_comm_gbps"] == pytest.approx(3e6 / 0.040 / 1e9)

    result = TrialResult(trial_id="t", status="ok", workload="w", config=config.to_dict(), distributed=info)
    result.capabilities = {"comm_hook": {"bf16": {"available": False, "reason": "needs NCCL"}}}
    findings = distributed_findings(result)
    assert [f.title for f in findings] == ["straggler: rank 1 (data loading)"]
    assert "rank 1 arrives 40.0 ms" in findings[0].summary and "wait 42.0 ms" in findings[0].summary
    assert {"num_workers": 2} in [rec.changes for rec in findings[0].recommendations]

    # Every rank waits 50 ms and none is late: that is communication itself.
    even = [_rank_data(r, 40.0, 60.0, 10.0, steps, wait_ms=50.0) for r in (0, 1)]
    result.distributed = summarize_ranks(even, config, "gloo", 2, step_comm_bytes=3_000_000)
    findings = distributed_findings(result)
    assert [f.title for f in findings] == ["distributed synchronization bound"]
    changes = [rec.changes for rec in findings[0].recommendations]
    assert {"comm_hook": "fp16"} in changes and {"ddp_static_graph": True} in changes  # bf16 hook: not here
    for change in filter(None, changes):
        config.replace(**change)  # every suggested change is a valid config
    assert "50.0 ms of every 100.0 ms step (50%)" in findings[0].summary
    healthy = TrialResult(trial_id="t", status="ok", workload="w", config=config.to_dict())
    assert distributed_findings(healthy) == []


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    """A real gloo process group of one rank in this process: enough for fully_shard and DDP."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_fsdp2_bf16_params_keep_batchnorm_fp32_under_autocast(one_rank_group: None) -> None:
    config = TrainConfig(strategy="fsdp2", fsdp_param_dtype="bf16", amp="bf16")
    step = build(batchnorm_workload(), config, "cpu")
    batch = step.prepare_batch(next(batchnorm_workload().batches(config)))
    loss = step([batch])
    assert torch.isfinite(loss)
    record = next(a for a in step.applied if a.toggle == "strategy")
    assert "1 BatchNorm layer(s) kept fp32" in record.detail
    with pytest.raises(ConfigError, match="needs amp=bf16"):
        build(batchnorm_workload(), config.replace(amp="fp32"), "cpu")


@pytest.mark.parametrize("bucket_view", [True, False])
def test_ddp_bucket_view_gradients_survive_zero_grad(one_rank_group: None, bucket_view: bool) -> None:
    """With bucket views, backward must find the bucket's gradients already there: set to None,
    the reducer would allocate fresh ones and copy them into the bucket every step."""
    config = TrainConfig(strategy="ddp", ddp_gradient_as_bucket_view=bucket_view)
    workload = tiny()
    step = build(workload, config, "cpu")
    params = list(step.base_model.parameters())
    seen: list[list[int | None]] = []
    step.base_model.register_forward_pre_hook(
        lambda module, args: seen.append([None if p.grad is None else p.grad.data_ptr() for p in params])
    )
    batches = iter(workload.batches(config))
    step([step.prepare_batch(next(batches))])
    step([step.prepare_batch(next(batches))])  # DDP rebuilds its buckets before this forward
    after_second = [None if p.grad is None else p.grad.data_ptr() for p in params]
    step([step.prepare_batch(next(batches))])
    record = next(a for a in step.applied if a.toggle == "strategy")
    if bucket_view:
        assert None not in after_second and seen[2] == after_second  # the same bucket storage
        assert "zero_grad(set_to_none=False)" in record.detail
    else:
        assert seen[1] == seen[2] == [None] * len(params)
        assert "set_to_none" not in record.detail


def test_data_parallel_needs_a_process_group() -> None:
    with pytest.raises(ConfigError, match="initialized process group"):
        build(tiny(), TrainConfig(strategy="ddp"), "cpu")


# --- the multi-node command ---------------------------------------------------------------


def test_to_command_prints_the_torchrun_command_for_every_node() -> None:
    config = TrainConfig(strategy="fsdp2", nproc_per_node=8, rdzv_endpoint="node0:29500", nnodes=4, amp="bf16")
    argv = shlex.split(to_command(config, workload=PLANNER, preset="base", steps=7, warmup=2))
    assert argv[:6] == [
        "torchrun",
        "--nnodes=4",
        "--nproc_per_node=8",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=node0:29500",
        "--rdzv_id=workbench",
    ]
    assert argv[6:8] == ["-m", "workbench.distributed"]
    args = build_parser().parse_args(argv[8:])
    rebuilt = TrainConfig()
    for text in args.overrides:
        rebuilt = rebuilt.with_overrides(text)
    assert rebuilt == config
    assert (args.workload, args.preset, args.steps, args.warmup) == (PLANNER, "base", 7, 2)
    single = shlex.split(to_command(TrainConfig(strategy="ddp", nproc_per_node=2)))
    assert single[:4] == ["torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=2"]


def test_the_printed_command_runs_as_two_nodes_on_one_machine(tmp_path: Path) -> None:
    """Two torchrun agents meeting at one c10d endpoint: the multi-node path, on localhost."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = TrainConfig(strategy="ddp", nproc_per_node=1, rdzv_endpoint=f"127.0.0.1:{port}", nnodes=2)
    argv = shlex.split(to_command(config, workload=PLANNER, steps=2, warmup=1))
    out = tmp_path / "result.json"
    command = [sys.executable, "-m", "torch.distributed.run", *argv[1:], "--device", "cpu", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    nodes = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    try:
        outputs = [node.communicate(timeout=240)[0].decode(errors="replace") for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], outputs
    result = TrialResult.from_dict(json.loads(out.read_text()))
    assert result.status == "ok" and result.distributed is not None
    assert result.distributed["world_size"] == 2 and result.distributed["nnodes"] == 2
    assert len(result.rank_step_ms) == 2
    assert any("median step" in text for text in outputs)


def test_a_killed_launcher_takes_torchrun_and_every_rank_with_it() -> None:
    """SIGKILL on `workbench run` mid-trial: torchrun and both ranks, re-parented, must end themselves."""
    from proc_watch import start_cli_and_wait_for_steps, still_running_after

    cli, processes = start_cli_and_wait_for_steps(
        [
            "run",
            "--workload",
            PLANNER,
            "--set",
            "strategy=ddp,nproc_per_node=2",
            "--steps",
            "100000",
            "--warmup",
            "1",
            "--no-store",
        ]
    )
    assert sum("workbench.distributed" in " ".join(p.cmdline()) for p in processes) >= 2, processes
    cli.kill()
    cli.communicate()
    assert not still_running_after(processes, within_s=10)


def test_the_old_path_of_distributed_findings_warns_and_forwards() -> None:
    import workbench.distributed as old_home

    with pytest.warns(DeprecationWarning, match="workbench.analysis.ranks"):
        assert old_home.distributed_findings is distributed_findings
