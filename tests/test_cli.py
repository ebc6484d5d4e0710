"""The `workbench` command as a user runs it: a real subprocess, JSON output, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "workbench.cli"]


def workbench(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False)


def test_run_json_has_the_documented_keys() -> None:
    proc = workbench("run", "--workload", "bev-perception", "--preset", "tiny", "--set", "amp=bf16",
                     "--set", "channels_last=true", "--steps", "3", "--warmup", "1", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    for key in (
        "status",
        "config",
        "median_step_ms",
        "step_ms",
        "peak_memory_bytes",
        "losses",
        "compile_time_s",
        "throughput",
    ):
        assert key in data, key
    assert data["status"] == "ok"
    assert data["config"]["amp"] == "bf16" and data["config"]["channels_last"] is True
    assert len(data["step_ms"]) == 3 and len(data["losses"]) == 4
    assert data["median_step_ms"] == pytest.approx(sorted(data["step_ms"])[1])


def test_run_prints_a_readable_summary() -> None:
    proc = workbench("run", "--workload", "e2e-planner", "--steps", "2", "--warmup", "1")
    assert proc.returncode == 0, proc.stderr
    for label in ("median step", "throughput", "phases", "peak memory", "loss", "CPU (window)", "energy"):
        assert label in proc.stdout


SLEEPY_MODULE = """
import time
import torch
from torch import nn
from workbench.workloads import Workload

class Sleepy(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)
    def forward(self, x):
        time.sleep(0.03)  # the step's time is set by the OS clock: stable on a busy machine
        return self.linear(x)

def sleepy(preset="tiny"):
    return Workload.from_callables(
        model_fn=Sleepy,
        batch_fn=lambda n, g: (torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=4, name="sleepy",
    )
"""


def test_compare_json_reports_speedup_interval_and_verdict(tmp_path: Path) -> None:
    (tmp_path / "sleepy_models.py").write_text(SLEEPY_MODULE)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = workbench("compare", "--workload", "sleepy_models:sleepy", "--baseline", "amp=fp32",
                     "--candidate", "extra.slow_step_ms=60", "--steps", "8", "--warmup", "1", "--json", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["baseline"]["status"] == "ok"
    (candidate,) = data["candidates"]
    for key in ("speedup", "speedup_ci", "verdict", "numerics_ok", "status", "peak_memory_delta_bytes", "units",
                "half_width", "rounds_needed"):  # fmt: skip
        assert key in candidate
    for key in ("rounds", "design", "noise", "precision", "winner", "stop_reason", "elapsed_s"):
        assert key in data
    assert data["design"] == "paired" and data["rounds"] >= 6 and candidate["units"] == data["rounds"]
    # The rounds' paired speedup agrees with the fresh trials' own medians (measured apart, in other processes).
    assert candidate["speedup"] == pytest.approx(
        data["baseline"]["median_step_ms"] / candidate["median_step_ms"], rel=0.15
    )
    low, high = candidate["speedup_ci"]
    assert low <= candidate["speedup"] <= high
    assert candidate["verdict"] == "slower"  # 60 ms of sleep on a 30 ms step is a regression compare must see
    assert data["noise"]["within_unit_cv"] is not None
    # Utilization over each side's timed window, and the candidate's change against the baseline.
    base_cores = data["baseline"]["utilization_summary"]["cpu_cores_used"]
    cand_cores = candidate["utilization_summary"]["cpu_cores_used"]
    assert candidate["utilization_delta"]["cpu_cores_used"] == pytest.approx(cand_cores - base_cores)
    assert data["baseline"]["utilization"]["cpu"]["cores_used"] < 0.5  # a step that sleeps
    assert candidate["energy"]["available"] is False and candidate["energy"]["reason"]


def test_compare_table_shows_every_candidate(tmp_path: Path) -> None:
    # A step that sleeps: the table's shape is under test, not a model (the JSON test above and the
    # docs' compare example measure the built-in ones).
    (tmp_path / "sleepy_models.py").write_text(SLEEPY_MODULE)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = workbench("compare", "--workload", "sleepy_models:sleepy", "--baseline", "amp=fp32",
                     "--candidate", "channels_last=true",
                     "--candidate", "activation_checkpointing=full,checkpoint_target=Sleepy",
                     "--steps", "3", "--warmup", "1", "--budget", "1", "--paired-workers", "1", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "baseline: defaults" in proc.stdout
    assert "channels_last=True" in proc.stdout and "activation_checkpointing=full" in proc.stdout
    assert "speedup" in proc.stdout and "CI" in proc.stdout
    assert "6 round(s): paired rounds" in proc.stdout and "target ±3.0%" in proc.stdout  # the 6-round floor
    assert "noise: step-to-step" in proc.stdout


def test_compare_refuses_a_bad_protocol_with_the_fix() -> None:
    for flags, text in ((["--precision", "0"], "precision must be"), (["--budget", "-5"], "budget must be"),
                        (["--design", "paired", "--baseline", "num_workers=2"], "design='processes'"),
                        (["--paired-workers", "0"], "paired_workers must be an integer from 1 to 8")):  # fmt: skip
        proc = workbench("compare", "--candidate", "amp=bf16", "--no-store", *flags)
        assert proc.returncode == 2 and text in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "--preset", "huge"], "invalid choice: 'huge' (choose from"),
        (["run", "--set", "colour=red"], "unknown config field 'colour'; valid fields: amp"),
        (["run", "--set", "amp=fp8"], "amp='fp8' is not valid; choose one of: fp32, bf16, fp16"),
        (["run", "--workload", "nope"], "unknown workload 'nope'; built-ins: bev-perception, driving-vlm, e2e-planner"),
        (["run", "--steps", "0"], "steps must be an integer >= 1"),
        (["run", "--steps", "many"], "invalid int value: 'many'"),
        (["run", "--set", "cuda_graphs=true"], "cuda_graphs=True is not available"),
        (["compare", "--baseline", "amp=fp32"], "compare needs a --candidate (repeat for more), or --ideal-loader"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args: list[str], expected: str) -> None:
    proc = workbench(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert expected in proc.stderr
    if "choose from" in expected:  # argparse quotes the names on some Python versions
        assert all(name in proc.stderr for name in ("tiny", "base", "large"))
    assert "Traceback" not in proc.stderr


def test_workloads_and_capabilities_list_what_exists() -> None:
    data = json.loads(workbench("workloads", "--json").stdout)
    assert {w["name"] for w in data} == {"bev-perception", "e2e-planner", "driving-vlm"}
    caps = json.loads(workbench("capabilities", "--json").stdout)
    assert caps["toggles"]["amp"]["fp32"]["available"] is True
    for values in caps["toggles"].values():
        for availability in values.values():
            assert availability["available"] or availability["reason"]
    assert "toggle" in workbench("capabilities").stdout


def test_python_dash_m_lists_every_command_with_the_defaults_of_the_objects_that_own_them() -> None:
    """`python -m workbench.cli` is the package's __main__; the window's and the protocol's defaults in
    --help and in the parsed flags are TrialRequest's and Protocol's (what the API and the app use)."""
    from workbench.cli import build_parser
    from workbench.measure import TrialRequest
    from workbench.protocol import Protocol

    proc = workbench("--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("run", "compare", "export", "workloads", "capabilities", "diagnose", "estimate", "tune",
                    "diff", "history", "regress"):  # fmt: skip
        assert f"\n    {command}" in proc.stdout
    window = TrialRequest("bev-perception")
    for argv in (["run"], ["compare", "--candidate", "amp=bf16"]):
        args = build_parser().parse_args(argv)
        assert (args.steps, args.warmup) == (window.steps, window.warmup)
    args = build_parser().parse_args(["compare", "--candidate", "amp=bf16"])
    assert (args.precision, args.budget, args.confidence) == (Protocol().precision, Protocol().budget_s, 0.95)
    compare_help = " ".join(workbench("compare", "--help").stdout.split())
    assert f"(default {Protocol().paired_workers}; 1 saves a worker's memory)" in compare_help
    assert f"characterizing trial (default {window.steps})" in compare_help


@pytest.mark.parametrize(
    ("old", "names", "new"),
    [
        ("workbench.cli_tune", ("summary", "parse_duration"), ("workbench.cli.tune", "workbench.textfmt")),
        ("workbench.cli_diff", ("resolve_trial", "DiffInputError"), ("workbench.cli.diff",)),
        ("workbench.cli_diagnose", ("parse_bytes",), ("workbench.cli.diagnose", "workbench.textfmt")),
    ],
)
def test_the_old_module_paths_warn_and_still_work(old: str, names: tuple[str, ...], new: tuple[str, ...]) -> None:
    import importlib

    sys.modules.pop(old, None)  # a module warns when it is imported, not when it is found in the cache
    with pytest.deprecated_call(match=f"{old} is deprecated: import from {new[0]}"):
        module = importlib.import_module(old)
    homes = [importlib.import_module(name) for name in new]
    for name in names:
        assert any(getattr(home, name, None) is getattr(module, name) for home in homes), name


def test_sizes_and_durations_parse_alike_for_the_cli_and_the_app() -> None:
    from workbench.config import ConfigError
    from workbench.textfmt import parse_bytes, parse_duration

    assert (parse_bytes("80GB"), parse_bytes("75GiB"), parse_bytes(" 1.5 kib")) == (80 * 10**9, 75 * 2**30, 1536)
    assert (parse_duration("600"), parse_duration("90s"), parse_duration("10m"), parse_duration("1h")) == (
        600.0, 90.0, 600.0, 3600.0)  # fmt: skip
    with pytest.raises(ConfigError, match="is not a size; write"):
        parse_bytes("lots")
    with pytest.raises(ConfigError, match="not a duration"):
        parse_duration("soon")


def test_bring_your_own_model_by_module_spec(tmp_path: Path) -> None:
    (tmp_path / "my_models.py").write_text(
        textwrap.dedent("""
        import torch
        from torch import nn
        from workbench.workloads import Workload

        class TinyNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
                self.head = nn.Linear(8, 4)
            def forward(self, x):
                return self.head(self.body(x))

        def tiny(preset="tiny"):
            return Workload.from_callables(
                model_fn=TinyNet,
                batch_fn=lambda n, g: (torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 4, (n,), generator=g)),
                loss_fn=lambda out, batch: nn.functional.cross_entropy(out, batch[1]),
                batch_size=8, name="tiny-net", checkpoint_target="Sequential",
            )
    """)
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = workbench("run", "--workload", "my_models:tiny", "--set", "channels_last=true,activation_checkpointing=full",
                     "--steps", "3", "--warmup", "1", "--json", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["workload"] == "tiny-net" and data["status"] == "ok"
    assert {a["toggle"] for a in data["applied"]} >= {"channels_last", "activation_checkpointing"}
    missing = workbench("run", "--workload", "no_such_module:tiny", env=env)
    assert missing.returncode == 2 and "cannot import 'no_such_module'" in missing.stderr


def test_export_writes_a_snippet_json_and_a_command_that_round_trips() -> None:
    snippet = workbench("export", "--set", "amp=bf16,channels_last=true", "--device", "cpu")
    assert snippet.returncode == 0, snippet.stderr
    compile(snippet.stdout, "snippet.py", "exec")
    assert "torch.autocast" in snippet.stdout and "channels_last" in snippet.stdout
    assert "import workbench" not in snippet.stdout and "from workbench" not in snippet.stdout
    as_json = json.loads(workbench("export", "--set", "amp=bf16", "--format", "json").stdout)
    assert as_json["amp"] == "bf16"
    command = workbench("export", "--set", "amp=bf16", "--format", "command").stdout.strip()
    assert command.startswith("workbench run ") and "--set amp=bf16" in command
    assert workbench("export", "--format", "yaml").returncode == 2


# --- faults in the user's code and bad input (issue 13's corpus), as a user meets them ----------

USER_MODELS = """
import time
import torch
from torch import nn
from workbench.workloads import Workload

class Wrong(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)
    def forward(self, x):
        return self.linear(x.view(-1, 5))  # the user's bug

class Hangs(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)
    def forward(self, x):
        time.sleep(600)

def _workload(model_fn, loss_fn=lambda out, b: nn.functional.mse_loss(out, b[1])):
    return Workload.from_callables(
        model_fn=model_fn, loss_fn=loss_fn, batch_size=4,
        batch_fn=lambda n, g: (torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)),
    )

def fast(preset="tiny"):
    return _workload(lambda: nn.Linear(4, 1))

def wrong(preset="tiny"):
    return _workload(Wrong)

def hangs(preset="tiny"):
    return _workload(Hangs)

def loss_none(preset="tiny"):
    return _workload(lambda: nn.Linear(4, 1), loss_fn=lambda out, b: None)

def factory_raises(preset="tiny"):
    raise RuntimeError("no checkpoint at /data/weights.pt")
"""


@pytest.fixture
def user_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user whose own models live in `user_models.py` (and `broken_syntax.py`)."""
    (tmp_path / "user_models.py").write_text(USER_MODELS)
    (tmp_path / "broken_syntax.py").write_text("def workload(:\n    pass\n")
    return {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_an_error_in_the_users_model_shows_their_line_first(user_env: dict[str, str]) -> None:
    args = ["run", "--workload", "user_models:wrong", "--steps", "1", "--warmup", "1", "--no-store", "--quiet"]
    plain = workbench(*args, env=user_env)
    assert plain.returncode == 1, plain.stderr
    lines = plain.stdout.strip().splitlines()
    assert lines[0].startswith("user_models:wrong [tiny] on ") and "status error" in lines[0]
    assert lines[1] == "RuntimeError: shape '[-1, 5]' is invalid for input of size 16"
    assert "user_models.py:12 in forward: return self.linear(x.view(-1, 5))" in lines[2]
    assert "Traceback" not in plain.stdout and "--verbose" in plain.stdout
    verbose = workbench(*args, "--verbose", env=user_env)
    assert "Traceback (most recent call last)" in verbose.stdout and "torch/nn/modules/module.py" in verbose.stdout
    whole = json.loads(workbench(*args, "--json", env=user_env).stdout)["message"]
    assert "Traceback (most recent call last)" in whole and 'user_models.py", line 12' in whole


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--workload", "user_models:factory_raises"],
         "'user_models:factory_raises' raised while building the workload: RuntimeError: no checkpoint at "
         "/data/weights.pt (" ),
        (["--workload", "broken_syntax:workload"], "importing 'broken_syntax' (spec 'broken_syntax:workload') failed: "
                                                   "SyntaxError: invalid syntax ("),
        (["--workload", ":x"], "workload spec ':x' needs both parts: 'package.module:function'"),
        (["--set", "extra.bogus_opt=1"], "workload 'bev-perception' has no option 'bogus_opt'; its options: "
                                         "cache_dir, camera_files, decoder, sample_cost_ms, slow_step_ms"),
        (["--workload", "user_models:fast", "--set", "extra.bogus_opt=1"], "takes no option 'bogus_opt'"),
        (["--workload", "user_models:loss_none"], "loss_fn must return a scalar tensor (one float value to minimise), "
                                                  "got None"),
        (["--set", "lr=inf"], "lr must be a positive number, and finite, got inf"),
    ],
)  # fmt: skip
def test_a_workload_that_cannot_be_built_is_one_line_and_exit_2(
    user_env: dict[str, str], args: list[str], expected: str
) -> None:
    proc = workbench("run", *args, "--steps", "1", "--warmup", "1", "--no-store", "--quiet", env=user_env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert expected in proc.stderr


def test_verbose_shows_the_users_traceback_behind_a_one_line_error(user_env: dict[str, str]) -> None:
    proc = workbench("run", "--workload", "user_models:factory_raises", "--verbose", "--no-store", env=user_env)
    assert proc.returncode == 2
    first, rest = proc.stderr.split("\n", 1)
    assert "raised while building the workload" in first
    assert "Traceback (most recent call last)" in rest and 'user_models.py", line 40, in factory_raises' in rest


def test_set_flags_are_validated_together() -> None:
    proc = workbench("export", "--set", "prefetch_factor=4", "--set", "num_workers=2", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["prefetch_factor"] == 4 and json.loads(proc.stdout)["num_workers"] == 2
    alone = workbench("export", "--set", "prefetch_factor=4", "--format", "json")
    assert alone.returncode == 2 and "prefetch_factor needs num_workers > 0" in alone.stderr


def test_export_and_estimate_refuse_names_that_do_not_exist() -> None:
    command = workbench("export", "--format", "command", "--workload", "no-such-workload")
    assert command.returncode == 2 and not command.stdout and "unknown workload 'no-such-workload'" in command.stderr
    estimate = workbench("estimate", "--device-name", "H1OO")
    assert estimate.returncode == 2 and not estimate.stdout
    assert "unknown device 'H1OO'" in estimate.stderr and "H100 SXM" in estimate.stderr


def test_timeout_counts_from_the_trial_start_not_the_worker_start(user_env: dict[str, str]) -> None:
    """Spawning the worker and importing torch take seconds; a 2 s hang limit must still pass a healthy trial."""
    ok = workbench("run", "--workload", "user_models:fast", "--timeout", "2", "--steps", "5", "--warmup", "1",
                   "--no-store", "--json", env=user_env)  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["status"] == "ok"
    hung = workbench("run", "--workload", "user_models:hangs", "--timeout", "2", "--steps", "5", "--warmup", "1",
                     "--no-store", "--json", env=user_env)  # fmt: skip
    result = json.loads(hung.stdout)
    assert hung.returncode == 1 and result["status"] == "timeout" and "no progress for 2 s" in result["message"]
    assert result["device"]["name"] and result["device"]["type"] == "cpu"  # not '?'


def test_compare_refuses_an_unavailable_candidate_before_measuring(tmp_path: Path) -> None:
    store = tmp_path / "h.sqlite"
    proc = workbench("compare", "--candidate", "amp=bf16", "--candidate", "cuda_graphs=true", "--store", str(store))
    assert proc.returncode == 2 and "candidate 'cuda_graphs=true': cuda_graphs=True is not available" in proc.stderr
    assert not store.exists()  # nothing measured, nothing stored


def test_a_failed_trial_read_through_a_closed_pipe_still_exits_1(user_env: dict[str, str]) -> None:
    """`workbench run ... | head -1`: the reader leaves early; the failure must not become exit 0."""
    proc = subprocess.Popen([*CLI, "run", "--workload", "user_models:wrong", "--steps", "1", "--warmup", "1",
                             "--no-store", "--quiet", "--verbose"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=user_env)  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before the first line is written
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    assert b"Traceback" not in err and b"BrokenPipeError" not in err
