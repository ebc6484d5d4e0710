"""Run-history scale: 10,000 stored trials, then the latency of the queries the CLI, CI and the History view make.

Rows are synthetic but shaped like real ones (20 timed steps with phases and losses, a
full capability report, an environment fingerprint), spread over 5 workloads, 24
configurations, 2 machines and a few hundred commits, saved as runs of 1-4 trials the
way compare and regress save them. Prints each query's median latency over repeats
against the target (< 100 ms). A fresh file in a temporary folder unless --path is given.

    .venv/bin/python benchmarks/store_scale.py [--trials 10000] [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from workbench.config import TrainConfig
from workbench.measure.result import TrialResult
from workbench.store import Store
from workbench.store.db import check_integrity
from workbench.store.series import step_time_series

TARGET_MS = 100.0
WORKLOADS = ("bev-perception", "e2e-planner", "driving-vlm", "my_models:occupancy", "my_models:lidar")
OVERRIDES = ("", "amp=bf16", "amp=bf16,channels_last=true", "activation_checkpointing=full", "compile=default",
             "amp=bf16,compile=default", "optimizer_impl=foreach", "optimizer_impl=fused,amp=bf16",
             "batch_size=8", "batch_size=16,amp=bf16", "matmul_precision=high", "num_workers=2")  # fmt: skip
CONFIGS = [TrainConfig().with_overrides(o) for o in OVERRIDES] + [
    TrainConfig().with_overrides(o).replace(seed=1) for o in OVERRIDES
]
MACHINES = (
    {"device_type": "cuda", "device_name": "NVIDIA H200", "device_count": 8, "cpu_cores": 96, "platform": "linux"},
    {"device_type": "cpu", "device_name": "AMD EPYC 9654", "device_count": 1, "cpu_cores": 2, "platform": "linux"},
)


def capability_report() -> dict[str, Any]:
    """About the size of `capabilities_report()['toggles']`: every toggle value with a reason."""
    toggles = {f"toggle_{i}": [f"v{j}" for j in range(4)] for i in range(20)}
    return {t: {v: {"available": j % 3 != 0, "reason": f"{t}={v}: needs a feature this device lacks" * (j % 2)}
                for j, v in enumerate(values)} for t, values in toggles.items()}  # fmt: skip


def synthetic_trial(rng: np.random.Generator, when: float, commit: str, machine: dict[str, Any],
                    workload: str, config: TrainConfig, capabilities: dict[str, Any]) -> TrialResult:  # fmt: skip
    step = float(rng.uniform(20, 400))
    steps = [float(x) for x in rng.normal(step, step * 0.05, 20)]
    return TrialResult(
        trial_id=uuid.uuid4().hex[:12], status="ok" if rng.random() > 0.03 else "oom", workload=workload,
        config=config.to_dict(), preset="tiny", workload_source={"kind": "builtin", "name": workload, "preset": "tiny"},
        device={"type": machine["device_type"], "name": machine["device_name"], "count": machine["device_count"]},
        environment={**machine, "torch": "2.13.0", "cuda": None, "python": "3.11.9", "host": "ci-7",
                     "git_commit": commit},
        capabilities=capabilities,
        applied=[{"toggle": t, "value": "on", "detail": f"{t} applied to 56 tensors"} for t in ("amp", "optimizer")],
        warmup=3, steps=20, batch_size=4, samples_per_step=4, warmup_step_ms=[step * 8, step * 1.1, step],
        step_ms=steps, phase_ms={p: [s * f for s in steps] for p, f in
                                 (("data", 0.05), ("forward", 0.35), ("backward", 0.5), ("optimizer", 0.1))},
        losses=[float(x) for x in 2.5 * np.exp(-0.03 * np.arange(23))], peak_memory_bytes=int(rng.integers(1, 80) * 2**30),
        memory_method="CUDA caching allocator", time_to_first_step_s=step * 8 / 1000, started_at=when, wall_time_s=12.0,
    )  # fmt: skip


def fill(store: Store, trials: int, seed: int = 0) -> float:
    """Insert `trials` trials as runs of 1-4; returns seconds taken."""
    rng = np.random.default_rng(seed)
    capabilities = [capability_report(), {**capability_report(), "extra": {"x": {"available": True, "reason": ""}}}]
    commits = [uuid.uuid4().hex + uuid.uuid4().hex[:8] for _ in range(max(1, trials // 30))]
    began, saved, when = time.perf_counter(), 0, time.time() - 90 * 86400
    while saved < trials:
        size = min(int(rng.integers(1, 5)), trials - saved)
        machine = int(rng.integers(0, 2))
        workload = WORKLOADS[int(rng.integers(0, len(WORKLOADS)))]
        commit = commits[min(len(commits) - 1, saved * len(commits) // trials)]
        results = []
        for _ in range(size):
            when += 90 * 86400 / trials
            config = CONFIGS[int(rng.integers(0, len(CONFIGS)))]
            results.append(
                synthetic_trial(rng, when, commit, MACHINES[machine], workload, config, capabilities[machine])
            )
        store.save_run(results, kind="compare", labels=[f"candidate {i}" for i in range(size)])
        saved += size
    return time.perf_counter() - began


def latency_ms(query: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, value = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        value = query()
        times.append((time.perf_counter() - began) * 1000.0)
    return statistics.median(times), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--path", default=None, help="store file (default: a fresh one in a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.path or Path(tmp) / "history.sqlite")
        with Store(path) as store:
            seconds = fill(store, args.trials) if store.count() < args.trials else 0.0
            size_mib = path.stat().st_size / 2**20
            print(f"{store.count()} trials stored in {seconds:.1f} s ({store.count() / max(seconds, 1e-9):.0f}/s), "
                  f"file {size_mib:.1f} MiB")  # fmt: skip
            newest = store.history(limit=1)[0]
            env, config = store.get(newest.id).result.environment, newest.config
            queries: dict[str, Callable[[], Any]] = {
                "open: integrity check (quick_check)": lambda: check_integrity(path),
                "history, newest 20": lambda: store.history(limit=20),
                "history --workload, newest 20": lambda: store.history(workload="e2e-planner", limit=20),
                "history --config, newest 50": lambda: store.history(config=config, limit=50),
                "history --commit <prefix>": lambda: store.history(commit=newest.commit[:7] if newest.commit else None),
                "history, last 7 days": lambda: store.history(since=time.time() - 7 * 86400, limit=None),
                "latest_baseline (comparable run)": lambda: store.latest_baseline(env, newest.workload, config),
                "latest_baseline at a commit": lambda: store.latest_baseline(
                    env, newest.workload, config, commit=newest.commit
                ),
                "step_time_series (one config)": lambda: step_time_series(
                    store, newest.workload, config, environment=env
                ),
            }
            worst = 0.0
            for name, query in queries.items():
                ms, value = latency_ms(query, args.repeats)
                worst = max(worst, ms)
                rows = len(value) if hasattr(value, "__len__") else 1
                print(
                    f"  {name:36s} {ms:8.2f} ms  ({ms / TARGET_MS:.2f}x of the {TARGET_MS:.0f} ms target, {rows} rows)"
                )
            print(
                f"slowest query {worst:.2f} ms: {'within' if worst < TARGET_MS else 'OVER'} the {TARGET_MS:.0f} ms target"
            )


if __name__ == "__main__":
    main()
