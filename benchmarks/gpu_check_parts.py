"""The parts of `scripts/gpu-check` that are more than one command: device facts, the float8 plan
against torchao's own filter, a compile warm-up, an external-timer check, a watched loop against
the workbench's own trial, and the VLM's MFU.

Each part prints its figures and ends with one `key: ...` line for the check's summary table;
exit 1 when a figure contradicts what it checks. `--dry-run` runs the part on the CPU on the
tiny preset, to prove the code path (its figures are labelled and mean nothing about a GPU).

    PYTHONPATH=. python3 benchmarks/gpu_check_parts.py PART [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from workbench.config import TrainConfig

MIB = 1 << 20
#: The external timer's window: untimed steps first (cuBLAS/cuDNN autotuning, allocator blocks).
WARMUP, STEPS = 5, 20
#: A workbench step time this far from the external timer's (either way) is reported as a mismatch.
TIMER_TOLERANCE = 0.15


def key(text: str) -> None:
    print(f"key: {text}", flush=True)


# --- device ------------------------------------------------------------------------------------


def device(dry_run: bool) -> int:
    from workbench.cli import main as workbench

    cuda = torch.cuda.is_available()
    print(f"torch {torch.__version__}, CUDA runtime {torch.version.cuda}, python {sys.version.split()[0]}")
    if cuda:
        props = torch.cuda.get_device_properties(0)
        print(f"{torch.cuda.device_count()} device(s); 0: {props.name}, compute capability "
              f"{props.major}.{props.minor}, {props.total_memory / 2**30:.1f} GiB")  # fmt: skip
    elif not dry_run:
        print("no CUDA device: run with --dry-run on a machine without one")
        return 1
    status = workbench(["capabilities"])
    key(f"{torch.cuda.get_device_name() if cuda else 'cpu (dry run)'}, torch {torch.__version__}")
    return status


# --- float8: the plan against torchao's own filter ----------------------------------------------


def float8_plan(dry_run: bool) -> int:
    """Which nn.Linear of the e2e-planner (base) float8 would convert; torchao's filter is the truth."""
    from workbench.levers.float8 import float8_plan as plan_for
    from workbench.workloads import load_workload

    model = load_workload("e2e-planner", "base").model_fn()
    try:
        from torchao.float8.float8_linear_utils import _auto_filter_for_recipe
    except ImportError as exc:
        _auto_filter_for_recipe, why = None, f"torchao not importable ({exc}): the plan is not checked"
    counts, wrong = [], 0
    for recipe in ("rowwise", "tensorwise"):
        plan = plan_for(model, recipe)
        truth = _auto_filter_for_recipe(recipe, filter_fqns=[]) if _auto_filter_for_recipe else None
        modules = dict(model.named_modules())
        for verdict in plan:
            agrees = "" if truth is None else ("" if truth(modules[verdict.name], verdict.name) == verdict.convert
                                               else "  MISMATCH with torchao")  # fmt: skip
            wrong += bool(agrees)
            print(
                f"{recipe:10} {verdict.name:40} {'convert' if verdict.convert else 'keep':7} {verdict.reason}{agrees}"
            )
        counts.append(f"{recipe} {sum(v.convert for v in plan)}/{len(plan)}")
    if _auto_filter_for_recipe is None:
        print(why)
    key(", ".join(counts) + (" (torchao not here)" if _auto_filter_for_recipe is None else f", {wrong} disagree"))
    return 1 if wrong else 0


# --- compile warm-up -----------------------------------------------------------------------------


def compile_warmup(dry_run: bool) -> int:
    """Compile the MFU section's model once, untimed, so the timed section finds the cache warm."""
    from workbench.trials import run_trial

    if dry_run:
        print("no CPU dry run: a cold inductor compile of the VLM's base preset takes minutes on a small CPU")
        return 0
    config = TrainConfig(amp="bf16", compile="default")
    result = run_trial("driving-vlm", config, preset="base", warmup=1, steps=2, device="cuda")
    print(f"driving-vlm base bf16 compile=default: {result.status}, compile {result.compile_time_s or 0:.1f} s")
    key(f"compiled in {result.compile_time_s or 0:.1f} s" if result.ok else f"{result.status}: {result.message[:80]}")
    return 0 if result.ok else 1


# --- the external timer --------------------------------------------------------------------------


def to_device(batch: Any, dev: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(dev, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, dev) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, dev) for v in batch)
    return batch


def loop_parts(name: str, preset: str, amp: str, dev: torch.device) -> tuple[Any, Any, Callable[[], Any]]:
    """A user's plain loop, seeded: (model, AdamW, one_step), one_step() trains on the next batch and
    returns its loss."""
    from workbench.workloads import load_workload

    workload = load_workload(name, preset)
    if dev.type == "cpu":
        torch.set_num_threads(1)  # as the workbench trial is asked to run (intra_op_threads=1)
    torch.manual_seed(0)
    model = workload.model_fn().to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    autocast: Callable[[], Any] = (
        (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if amp == "bf16" else nullcontext
    )
    batches = workload.batches(TrainConfig())

    def one_step() -> Any:
        batch = to_device(next(batches), dev)
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = workload.loss_fn(workload.forward_fn(model, batch), batch)
        loss.backward()
        optimizer.step()
        return loss

    return model, optimizer, one_step


def plain_loop(
    name: str, preset: str, amp: str, dev: torch.device, warmup: int, steps: int
) -> tuple[float, int | None]:
    """A plain PyTorch training loop on the workload's model and data, timed from outside:
    synchronize, perf_counter over the window, synchronize. (ms per step, peak bytes or None)."""
    _, _, one_step = loop_parts(name, preset, amp, dev)
    cuda = dev.type == "cuda"
    began = 0.0
    for index in range(warmup + steps):
        if index == warmup:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            began = time.perf_counter()
        one_step()
    if cuda:
        torch.cuda.synchronize()
    ms = (time.perf_counter() - began) * 1000.0 / steps
    return ms, (torch.cuda.max_memory_allocated() if cuda else None)


def workbench_run(name: str, preset: str, amp: str, dev: str, warmup: int, steps: int) -> dict[str, Any]:
    """The same configuration through `workbench run` (its own worker process and clock)."""
    fields = f"amp={amp}" + (",intra_op_threads=1" if dev == "cpu" else "")  # a small CPU: one thread each
    argv = [sys.executable, "-m", "workbench.cli", "run", "--workload", name, "--preset", preset,
            "--set", fields, "--steps", str(steps), "--warmup", str(warmup), "--device", dev,
            "--json", "--quiet", "--no-store"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"workbench run failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    return dict(json.loads(done.stdout))


def external_timer(dry_run: bool) -> int:
    from workbench.workloads import builtin_workloads

    cuda = torch.cuda.is_available() and not dry_run
    dev = torch.device("cuda" if cuda else "cpu")
    preset, warmup, steps = ("base", WARMUP, STEPS) if cuda else ("tiny", 1, 3)
    names = sorted(builtin_workloads()) if cuda else ["bev-perception"]
    if not cuda:
        print("CPU dry run (tiny preset, 3 steps): proves the code path; the figures say nothing about a GPU")
    print(f"{'workload':16} {'amp':5} {'plain ms':>9} {'workbench ms':>12} {'ratio':>6} "
          f"{'plain peak':>11} {'wb peak':>9} {'ratio':>6}")  # fmt: skip
    ratios, peak_ratios, mismatches = [], [], 0
    for name in names:
        for amp in ("fp32", "bf16"):
            try:
                plain_ms, plain_peak = plain_loop(name, preset, amp, dev, warmup, steps)
                if cuda:
                    torch.cuda.empty_cache()  # the workbench's worker gets the device as it would alone
                result = workbench_run(name, preset, amp, dev.type, warmup, steps)
            except Exception as exc:
                print(f"{name:16} {amp:5} ERROR {type(exc).__name__}: {str(exc)[:200]}")
                mismatches += 1
                continue
            wb_ms = statistics.fmean(result["step_ms"])
            ratio = wb_ms / plain_ms
            wb_peak = result.get("peak_memory_bytes")
            peak_ratio = wb_peak / plain_peak if wb_peak and plain_peak else None
            ratios.append(ratio)
            if peak_ratio is not None:
                peak_ratios.append(peak_ratio)
            off = cuda and abs(ratio - 1.0) > TIMER_TOLERANCE
            mismatches += off
            print(f"{name:16} {amp:5} {plain_ms:9.2f} {wb_ms:12.2f} {ratio:6.3f} "
                  f"{_mib(plain_peak):>11} {_mib(wb_peak):>9} {_ratio(peak_ratio):>6}{'  MISMATCH' if off else ''}")  # fmt: skip
    print("ratio: the workbench's mean step (CUDA events per step) / the plain loop's (perf_counter over the "
          f"window, synchronized at both ends); over ±{TIMER_TOLERANCE:.0%} is a mismatch")  # fmt: skip
    span = f"time ratio {min(ratios):.3f}-{max(ratios):.3f}" if ratios else "no ratio"
    peaks = f", peak ratio {min(peak_ratios):.3f}-{max(peak_ratios):.3f}" if peak_ratios else ""
    key(span + peaks + (" (CPU dry run)" if not cuda else "") + (f", {mismatches} mismatch(es)" if mismatches else ""))
    return 1 if mismatches else 0


def _mib(value: int | None) -> str:
    return f"{value / MIB:.0f} MiB" if value else "n/a"


def _ratio(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "n/a"


# --- a watched loop against the workbench's trial ------------------------------------------------


def watched(dry_run: bool) -> int:
    """`wb.watch` on a plain loop (CUDA events per step, no synchronization added) against `workbench
    run` of the same configuration: the watched steady step time over the trial's median."""
    import tempfile
    from pathlib import Path

    import workbench as wb
    from workbench.store import Store
    from workbench.store.watched import watched_runs

    cuda = torch.cuda.is_available() and not dry_run
    dev = torch.device("cuda" if cuda else "cpu")
    preset, warmup, steps, amp = ("base", WARMUP, STEPS, "bf16") if cuda else ("tiny", 1, 4, "fp32")
    if not cuda:
        print("CPU dry run (tiny preset, fp32, 4 steps): proves the code path; the figures say nothing about a GPU")
    model, optimizer, one_step = loop_parts("bev-perception", preset, amp, dev)
    store_path = Path(tempfile.mkdtemp()) / "watched.sqlite"
    with wb.watch(model, optimizer, name="gpu-check", store=store_path, warmup=warmup, flush_s=0.5) as w:
        for _ in range(warmup + steps):
            w.step(loss=one_step())
    with Store(store_path) as store:
        (run,) = watched_runs(store)
    watched_ms = run.summary.get("steady_median_ms")
    del model, optimizer, one_step  # the closure holds them too: freed before the workbench trial
    if cuda:
        torch.cuda.empty_cache()  # the workbench's worker gets the device as it would alone
    trial_ms = statistics.median(workbench_run("bev-perception", preset, amp, dev.type, warmup, steps)["step_ms"])
    if watched_ms is None:
        print(f"the watched run has no steady step ({run.status}, last step {run.last_step})")
        key("no steady watched step")
        return 1
    ratio = watched_ms / trial_ms
    off = cuda and abs(ratio - 1.0) > TIMER_TOLERANCE
    print(f"bev-perception {preset} {amp}: watched median {watched_ms:.2f} ms, workbench trial median "
          f"{trial_ms:.2f} ms, ratio {ratio:.3f}{'  MISMATCH' if off else ''} (over ±{TIMER_TOLERANCE:.0%} is one)")  # fmt: skip
    key(f"watched/trial {ratio:.3f}" + (" (CPU dry run)" if not cuda else "") + (" MISMATCH" if off else ""))
    return 1 if off else 0


# --- MFU -------------------------------------------------------------------------------------------


def mfu(dry_run: bool) -> int:
    """MFU of driving-vlm in bf16, eager and compiled: FLOPs counted on fake tensors, the peak from the table."""
    from workbench.analysis.flops import model_flops_utilization, step_flops
    from workbench.trials import run_trial

    cuda = torch.cuda.is_available() and not dry_run
    preset = "base" if cuda else "tiny"
    compiled = TrainConfig(amp="bf16", compile="default") if cuda else TrainConfig(
        amp="bf16", compile="default", compile_backend="aot_eager")  # fmt: skip
    if not cuda:
        print("CPU dry run (tiny preset; compiled = aot_eager): proves the code path; CPUs have no peak in the table")
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    figures, failed = [], 0
    for label, config in (("eager", TrainConfig(amp="bf16")), ("compiled", compiled)):
        result = run_trial("driving-vlm", config, preset=preset, warmup=3 if cuda else 1, steps=10 if cuda else 2,
                           device="cuda" if cuda else "cpu")  # fmt: skip
        if not result.ok:
            print(f"{label}: trial {result.status}: {result.message[:300]}")
            failed += 1
            continue
        flops = step_flops("driving-vlm", config, preset=preset)
        figure = model_flops_utilization(flops.total, result.median_step_ms, device_name, config)
        achieved = f"{figure.achieved_flops / 1e12:.1f} TFLOP/s" if figure.achieved_flops else "n/a"
        share = f"{figure.mfu:.1%}" if figure.mfu is not None else "n/a"
        print(f"{label:8} {flops.total / 1e9:10.1f} GFLOP/step (batch {flops.batch_size}), median "
              f"{result.median_step_ms:.2f} ms, {achieved}, peak: {figure.peak_source}; MFU {share}")  # fmt: skip
        figures.append(f"{label} {share}")
    key("MFU " + ", ".join(figures) + (" (CPU dry run)" if not cuda else ""))
    return 1 if failed else 0


PARTS: dict[str, Callable[[bool], int]] = {
    "device": device,
    "float8-plan": float8_plan,
    "compile-warmup": compile_warmup,
    "external-timer": external_timer,
    "watched": watched,
    "mfu": mfu,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=sorted(PARTS))
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, tiny preset: the code path only")
    args = parser.parse_args(argv)
    return PARTS[args.part](args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
