"""Scaling out: the tuner with 1 and 2 worker processes on one shared study, and the run store on
SQLite and PostgreSQL at 10,000 trials. Everything runs on a throw-away local PostgreSQL.

Tuner: the same search (the sleepy workload of the tests, whose step time is set by the OS clock,
over a 12-configuration space) with the same budget, once as 1 worker and once as 2; it prints each
one's wall time, the configurations screened, and the ratio of screening throughput. On a 2-core
machine the 2 workers share the cores with their trials' worker processes, so expect well under 2x.
Store: `store_scale.fill` (runs of 1-4 synthetic, realistically shaped trials) into each backend,
then the median latency of the history queries the CLI and CI make.

    .venv/bin/python benchmarks/scale_out.py [--trials 10000] [--budget 40] [--skip-tune]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from store_scale import fill, latency_ms  # noqa: E402
from test_cli_tune import SLEEPY_MODULE  # noqa: E402

from workbench.store import Store  # noqa: E402
from workbench.store.throwaway_pg import ThrowawayPostgres  # noqa: E402

SPACE = '{"batch_size": [2, 4, 8], "optimizer_impl": ["for-loop", "foreach"], "channels_last": [false, true]}'


def tune_wall_time(server: ThrowawayPostgres, folder: Path, workers: int, budget: str) -> tuple[float, int]:
    """One shared-study search with `workers` processes; (wall seconds, configurations screened)."""
    url = server.create_database()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(folder), str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable,
        "-m",
        "workbench.cli",
        "tune",
        "--workload",
        "sleepy_models:sleepy",
        "--space",
        str(folder / "space.json"),
        "--budget",
        budget,
        "--steps",
        "4",
        "--warmup",
        "1",
        "--device",
        "cpu",
        "--precision",
        "0.1",
        "--no-store",
        "--storage",
        url,
        "--study",
        "bench",
        "--workers",
        str(workers),
        "--json",
    ]
    began = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - began
    results = json.loads(proc.stdout)
    results = results if isinstance(results, list) else [results]  # --workers 1 is the plain command
    screened = sum(1 for r in results for t in r["trials"] if not t["resumed"] and t["stage"] == "screen")
    return wall, screened


def store_times(target: str, trials: int, repeats: int) -> dict[str, float]:
    with Store(target) as store:
        seconds = fill(store, trials)
        newest = store.history(limit=1)[0]
        times = {"write (s, all trials)": seconds}
        queries: dict[str, Any] = {
            "history, newest 20": lambda: store.history(limit=20),
            "history --workload, newest 20": lambda: store.history(workload="e2e-planner", limit=20),
            "history --config, newest 50": lambda: store.history(config=newest.config, limit=50),
            "history --commit <prefix>": lambda: store.history(commit=(newest.commit or "")[:7]),
        }
        for name, query in queries.items():
            times[f"{name} (ms)"] = latency_ms(query, repeats)[0]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--budget", default="40", help="the tuner's budget for each of the two searches")
    parser.add_argument("--skip-tune", action="store_true", help="only the store figures")
    args = parser.parse_args()
    with ThrowawayPostgres() as server, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if not args.skip_tune:
            (folder / "sleepy_models.py").write_text(SLEEPY_MODULE)
            (folder / "space.json").write_text(SPACE)
            one = tune_wall_time(server, folder, 1, args.budget)
            two = tune_wall_time(server, folder, 2, args.budget)
            print(
                f"tuner, budget {args.budget} s: 1 worker {one[0]:.1f} s wall, {one[1]} screened; "
                f"2 workers {two[0]:.1f} s wall, {two[1]} screened"
            )
            rate = (two[1] / two[0]) / max(one[1] / one[0], 1e-9)
            print(f"  wall-time ratio 2/1 workers: {two[0] / one[0]:.2f}; screening throughput ratio: {rate:.2f}x")
        sqlite = store_times(str(folder / "history.sqlite"), args.trials, args.repeats)
        postgres = store_times(server.create_database(), args.trials, args.repeats)
        print(f"run store at {args.trials} trials:            SQLite   PostgreSQL")
        for name in sqlite:
            print(f"  {name:34s} {sqlite[name]:9.2f} {postgres[name]:11.2f}")


if __name__ == "__main__":
    main()
