"""The profiled window: apart from the timed window, ranges per phase, a capped gzip trace, top operators, syncs."""

from __future__ import annotations

import functools
import gzip
import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from workbench.config import ConfigError, TrainConfig
from workbench.measure import StepMeasured, TrialResult
from workbench.measure.profile import ProfileOptions, _PhaseRanges, _write_trace
from workbench.measure.syncscan import scan_syncs
from workbench.trials import run_trial
from workbench.workloads import Workload

BATCH, IN, HIDDEN = 8, 32, 64


class ReadsLoss(nn.Module):
    """An MLP whose forward reads a value back to the host once per step."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.fc1(x))
        if hidden.mean().item() < -1.0:  # the host read under test
            hidden = hidden * 0
        return self.fc2(hidden)


_lines, _first = inspect.getsourcelines(ReadsLoss.forward)
ITEM_LINE = _first + next(i for i, line in enumerate(_lines) if ".item()" in line)


def mlp_workload() -> Workload:
    return Workload.from_callables(
        model_fn=ReadsLoss,
        batch_fn=lambda n, g: (torch.randn(n, IN, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=BATCH,
        name="reads-loss",
    )


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrialResult, list[Any]]:
    events: list[Any] = []
    options = ProfileOptions(wait=1, warmup=1, active=2, trace_dir=str(tmp_path_factory.mktemp("traces")))
    result = run_trial(mlp_workload(), TrainConfig(), warmup=2, steps=4, isolation="inline", profile=options,
                       on_event=events.append)  # fmt: skip
    assert result.status == "ok", result.message
    return result, events


def test_profile_runs_after_the_timed_window_and_leaves_it_alone(profiled: tuple[TrialResult, list[Any]]) -> None:
    result, events = profiled
    steps = [e for e in events if isinstance(e, StepMeasured)]
    # Only warm-up and timed steps are reported; the profiled steps emit nothing and time nothing.
    assert len(steps) == 2 + 4 and len(result.step_ms) == 4
    assert result.profile is not None and result.profile["active_steps"] == 2
    assert len(result.profile["step_ms"]) == 2


def test_trace_is_gzip_chrome_json_with_phase_ranges(profiled: tuple[TrialResult, list[Any]]) -> None:
    profile = profiled[0].profile
    assert profile is not None
    path = Path(profile["trace_path"])
    assert path.name.endswith(".json.gz") and path.stat().st_size == profile["trace_bytes"]
    with gzip.open(path, "rt") as fh:
        trace = json.load(fh)
    names = {str(e.get("name")) for e in trace["traceEvents"]}
    for phase in ("data", "forward", "backward", "optimizer"):
        assert f"workbench::{phase}" in names
    assert sum(1 for n in names if n.startswith("ProfilerStep")) >= 1
    shares = profile["phase_share"]
    assert set(shares) == {"data", "forward", "backward", "optimizer"}
    assert sum(shares.values()) == pytest.approx(1.0)


def test_top_operators_have_calls_self_time_and_input_shapes(profiled: tuple[TrialResult, list[Any]]) -> None:
    rows = profiled[0].profile["top_ops"]  # type: ignore[index]
    assert rows and all({"name", "calls_per_step", "self_ms_per_step", "input_shapes"} <= set(r) for r in rows)
    assert [r["self_ms_per_step"] for r in rows] == sorted((r["self_ms_per_step"] for r in rows), reverse=True)
    # fc1's forward: addmm(bias, x, weight.T), once per step, with the shapes of this batch.
    addmm = [r for r in rows if r["name"] == "aten::addmm" and f"[{BATCH}, {IN}]" in r["input_shapes"]]
    assert addmm and addmm[0]["calls_per_step"] == 1
    assert not any(r["name"].startswith(("workbench::", "ProfilerStep")) for r in rows)


def test_sync_scan_names_the_model_line_not_the_optimizer(profiled: tuple[TrialResult, list[Any]]) -> None:
    syncs = profiled[0].profile["syncs"]  # type: ignore[index]
    # AdamW's for-loop reads its host-side step counters with .item() too; they never sync a GPU.
    assert syncs["per_step"] == 1
    site = syncs["sites"][0]
    assert site["source"].endswith(f"test_profile.py:{ITEM_LINE} in forward")
    assert ".item()" in site["code"]


def test_cpu_overhead_figures_are_shares(profiled: tuple[TrialResult, list[Any]]) -> None:
    profile = profiled[0].profile
    assert profile is not None
    overhead = profile["overhead"]
    assert 0.0 <= overhead["framework_overhead_share"] <= 1.0 and overhead["op_floor_us"] > 0
    assert profile["ops_per_step"] > 10
    mix = profile["kernel_mix"]
    assert mix["compute_heavy"] + mix["memory_bound"] == pytest.approx(1.0)


def test_profile_options_travel_to_the_worker_process(tmp_path: Path) -> None:
    options = ProfileOptions(wait=0, warmup=1, active=1, trace_dir=str(tmp_path), scan_syncs=False)
    result = run_trial(mlp_workload(), TrainConfig(), warmup=1, steps=2, profile=options)
    assert result.status == "ok", result.message
    assert result.profile is not None and result.profile["active_steps"] == 1 and result.profile["syncs"] == {}
    assert Path(result.profile["trace_path"]).parent == tmp_path
    assert TrialResult.from_json(result.to_json()).profile == result.profile


def test_bad_profile_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="active"):
        ProfileOptions(active=0)
    with pytest.raises(ConfigError, match="profile must be"):
        ProfileOptions.coerce("yes")  # type: ignore[arg-type]
    assert ProfileOptions.coerce(False) is None and ProfileOptions.coerce(True) == ProfileOptions()


class _FakeProf:
    """Stands in for torch.profiler.profile: exports a two-step Chrome trace."""

    def export_chrome_trace(self, path: str) -> None:
        steps = [{"name": "ProfilerStep#1", "ph": "X", "ts": 0, "dur": 100}, {"name": "ProfilerStep#2", "ph": "X", "ts": 100, "dur": 100}]  # fmt: skip
        pads = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(200)]  # incompressible
        ops = [{"name": f"aten::op{i}", "ph": "X", "ts": i, "dur": 1, "args": {"pad": pads[i]}} for i in range(200)]
        Path(path).write_text(json.dumps({"traceEvents": steps + ops, "deviceProperties": []}))


def test_trace_over_the_cap_is_cut_to_one_step_then_dropped(tmp_path: Path) -> None:
    full = _write_trace(_FakeProf(), ProfileOptions(trace_dir=str(tmp_path)), "full")
    assert full[0] is not None and full[2] == ""
    cut = _write_trace(_FakeProf(), ProfileOptions(trace_dir=str(tmp_path), max_trace_bytes=full[1] - 1), "cut")
    assert cut[0] is not None and cut[1] < full[1] and "first active step" in cut[2]
    with gzip.open(cut[0], "rt") as fh:
        kept = json.load(fh)["traceEvents"]
    assert {e["name"] for e in kept if e["name"].startswith("ProfilerStep")} == {"ProfilerStep#1"}
    assert max(e["ts"] for e in kept) <= 100
    dropped = _write_trace(_FakeProf(), ProfileOptions(trace_dir=str(tmp_path), max_trace_bytes=10), "dropped")
    assert dropped[0] is None and "dropped" in dropped[2] and not (tmp_path / "dropped.pt.trace.json.gz").exists()


def test_phase_ranges_follow_the_step_order_with_accumulation() -> None:
    opened: list[str] = []
    ranges = _PhaseRanges(accumulation=2, graphed=False)
    ranges._enter = functools.partial(lambda phase: opened.append(str(phase)))  # type: ignore[method-assign]
    ranges.begin()
    for ended in ("data", "forward", "backward", "forward", "backward", "optimizer"):
        ranges.mark(ended)
    assert opened == ["data", "forward", "backward", "forward", "backward", "optimizer", "None"]


def test_sync_scan_reports_errors_instead_of_failing() -> None:
    def broken() -> None:
        raise RuntimeError("model exploded")

    assert scan_syncs(broken, "cpu")["error"] == "RuntimeError: model exploded"
    x = torch.ones(3)
    found = scan_syncs(lambda: (x.sum().item(), float(x[0]), bool(x[1] > 0)), "cpu")
    assert found["per_step"] == 3


class _OnDevice:
    """A value whose `.device` is a CUDA device: `_sync_kind` reads only the device type."""

    device = torch.device("cuda")


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "expected"),
    [
        # .to("cuda") from host memory: aten._to_copy(src, device=cuda) → a CUDA tensor
        ("aten._to_copy.default", (torch.ones(2),), {"non_blocking": False}, "blocking host→device copy"),
        ("aten._to_copy.default", (torch.ones(2),), {}, "blocking host→device copy"),
        ("aten._to_copy.default", (torch.ones(2),), {"non_blocking": True}, None),
        # cuda_tensor.copy_(host_tensor[, non_blocking])
        ("aten.copy_.default", (_OnDevice(), torch.ones(2)), {}, "blocking host→device copy"),
        ("aten.copy_.default", (_OnDevice(), torch.ones(2), True), {}, None),
        # device→host stays flagged as before
        ("aten._to_copy.default", (_OnDevice(),), {"non_blocking": False}, "device→host copy"),
    ],
)
def test_sync_scan_classifies_copies_by_direction_and_blocking(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any], expected: str | None
) -> None:
    from workbench.measure.syncscan import _sync_kind

    func = type("Op", (), {"__str__": lambda self: name})()
    to_host = name.startswith("aten._to_copy") and isinstance(args[0], _OnDevice)
    out = torch.ones(2) if to_host else _OnDevice()
    kind = _sync_kind(func, args, kwargs, out)
    assert (kind is None) if expected is None else (kind is not None and kind.startswith(expected))


def test_profiled_window_keeps_the_op_table_and_one_steps_memory_timeline(
    profiled: tuple[TrialResult, list[Any]],
) -> None:
    profile = profiled[0].profile
    assert profile is not None
    ops = {row["name"]: row for row in profile["op_table"]}
    # fc1 and fc2: two addmm calls a step, in float32; the table is per active step (2 here).
    assert ops["aten::addmm"]["calls_per_step"] == 2 and ops["aten::addmm"]["dtypes"] == ["float32"]
    assert not any(name.startswith(("workbench::", "ProfilerStep")) for name in ops)
    timeline = profile["memory_timeline"]
    assert [p["phase"] for p in timeline["phases"]] == ["data", "forward", "backward", "optimizer"]
    assert max(timeline["total_bytes"]) == timeline["peak"]["total_bytes"] > 0


def test_op_table_dtypes_come_from_the_kineto_events_when_function_events_lack_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch < 2.13 (the GPU machine's 2.11): `FunctionEvent` has no `input_dtypes` attribute."""
    from torch.autograd.profiler_util import FunctionEvent

    built = FunctionEvent.__init__

    def without_input_dtypes(self: Any, *args: Any, **kwargs: Any) -> None:
        built(self, *args, **kwargs)
        del self.input_dtypes

    monkeypatch.setattr(FunctionEvent, "__init__", without_input_dtypes)
    options = ProfileOptions(wait=0, warmup=1, active=2, trace_dir=str(tmp_path))
    result = run_trial(mlp_workload(), TrainConfig(amp="bf16"), warmup=1, steps=2, isolation="inline", profile=options)
    assert result.profile is not None
    ops = {row["name"]: row for row in result.profile["op_table"]}
    # Autocast runs fc1 and fc2 in bfloat16; the casts' inputs are the float32 weights and batch.
    assert "bfloat16" in ops["aten::addmm"]["dtypes"], ops["aten::addmm"]
    assert "float32" in ops["aten::_to_copy"]["dtypes"], ops["aten::_to_copy"]
