"""Figures that confirm the GPU-path fixes of issue 18 on a lent GPU (and what a CPU can show).

One short section per fix: the CUDA-graph peak against eager, a trial on cuda:1, where the
distributed peak is read, the peak-table row this GPU gets, NVLink counters over all links
against link 0 alone, the timed window under sync-debug mode, bf16 gating by compute
capability, DDP bucket views' memory, the recommendation for a step with host syncs, and the
caching allocator's block sizes against the estimator's model. Without CUDA the GPU sections
say so and the table/model sections still print. Exit 1 when a figure contradicts its fix.

    PYTHONPATH=. python3 benchmarks/gpu_path_figures.py
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Sequence

import torch
from torch import nn

MIB = 1 << 20
CUDA = torch.cuda.is_available()
failures: list[str] = []


def expect(ok: bool, what: str) -> None:
    if not ok:
        failures.append(what)
        print(f"   MISMATCH: {what}")


def peak_table() -> None:
    from workbench.peak_specs import lookup_spec

    names = [torch.cuda.get_device_name()] if CUDA else ["NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA GH200 480GB"]
    for name in names:
        spec = lookup_spec(name)
        if spec is None:
            print(f"   '{name}': no table row")
            expect(not CUDA, f"no peak-table row for '{name}'")
            continue
        line = (
            f"   '{name}' -> row '{spec.name}': bf16 {(spec.bf16_flops or 0) / 1e12:.1f} TFLOP/s, "
            f"tf32 {(spec.tf32_flops or 0) / 1e12:.1f}, {spec.memory_bandwidth / 1e12:.2f} TB/s, "
            f"table memory {spec.memory_bytes / 1e9:.0f} GB"
        )
        if CUDA:
            line += f", device reports {torch.cuda.get_device_properties(0).total_memory / 1e9:.1f} GB"
        print(line)


def nvlink() -> None:
    from workbench.measure.monitor import nvlink_field_request

    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        print(
            f"   NVML unavailable ({type(exc).__name__}); the request it would send is checked by tests/test_monitor.py"
        )
        return
    tx, rx = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        up = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                up += pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED
            except pynvml.NVMLError:
                continue

        def read(request: Sequence[object], handle: object = handle) -> tuple[float, float, int]:
            values = pynvml.nvmlDeviceGetFieldValues(handle, request)
            ok = [v for v in values if v.nvmlReturn == pynvml.NVML_SUCCESS]
            sums = {tx: 0.0, rx: 0.0}
            for v in ok:
                sums[v.fieldId] += float(v.value.ullVal)
            return sums[tx], sums[rx], len(ok)

        all_tx, all_rx, all_ok = read(nvlink_field_request(pynvml))
        zero_tx, zero_rx, _ = read([tx, rx])  # bare ids: scopeId 0, the old request
        sum_tx, sum_rx, links_ok = read(nvlink_field_request(pynvml, per_link=True))
        print(
            f"   GPU{index}: {up} NVLinks up; cumulative TX/RX KiB all-links scope {all_tx:.0f}/{all_rx:.0f} "
            f"({all_ok}/2 answered), link 0 only {zero_tx:.0f}/{zero_rx:.0f}, "
            f"per-link sum {sum_tx:.0f}/{sum_rx:.0f} ({links_ok} link fields answered)"
        )
    pynvml.nvmlShutdown()


def sync_free_window() -> None:
    from workbench.config import TrainConfig
    from workbench.measure import StepMeasured, TrialFinished, TrialRequest
    from workbench.measure.trial import run_trial_inline

    warmup, steps = 2, 5

    def guard(event: object) -> None:
        if isinstance(event, StepMeasured) and not event.timed and event.step == warmup - 1:
            torch.cuda.set_sync_debug_mode("error")
        elif isinstance(event, TrialFinished) or (isinstance(event, StepMeasured) and event.step == warmup + steps - 1):
            torch.cuda.set_sync_debug_mode("default")

    for pin in (False, True):
        try:
            request = TrialRequest("bev-perception", TrainConfig(pin_memory=pin), warmup=warmup, steps=steps,
                                   device="cuda", isolation="inline")  # fmt: skip
            result = run_trial_inline(request, on_event=guard)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        message = (result.message or "").splitlines()[:1]
        print(f"   pin_memory={pin}: timed window under sync-debug 'error' -> {result.status} {message}")
        print(f"      median step {result.median_step_ms or 0:.2f} ms")
        expect(result.status == "ok", f"a sync in the timed window with pin_memory={pin}")


def bf16_gating() -> None:
    from workbench.device import bf16_availability, native_half_dtype
    from workbench.levers import capabilities

    if not CUDA:
        for cap in ((7, 0), (7, 5), (8, 0), (9, 0)):
            print(f"   capability {cap}: bf16 {bf16_availability(cap)}, SDPA probe dtype {native_half_dtype(cap)}")
        return
    cap = torch.cuda.get_device_capability()
    caps = capabilities("cuda")
    print(
        f"   capability {cap}: torch.cuda.is_bf16_supported()={torch.cuda.is_bf16_supported()}, "
        f"amp=bf16 {caps['amp']['bf16']}, SDPA probe dtype {native_half_dtype(cap)}"
    )
    print("   attention backends: " + ", ".join(f"{k}={v.available}" for k, v in caps["attention_backend"].items()))
    expect(caps["amp"]["bf16"].available == (cap >= (8, 0)), "bf16 availability disagrees with compute capability")


def ddp_bucket_views() -> None:
    from workbench.config import TrainConfig
    from workbench.trials import run_trial

    peaks = {}
    for view in (False, True):
        config = TrainConfig(strategy="ddp", nproc_per_node=1, ddp_gradient_as_bucket_view=view)
        result = run_trial("e2e-planner", config, warmup=2, steps=5, device="cuda", timeout_s=240)
        detail = next((a["detail"] for a in result.applied if a["toggle"] == "strategy"), "")
        peaks[view] = result.peak_memory_bytes
        print(
            f"   gradient_as_bucket_view={view}: {result.status}, peak {(result.peak_memory_bytes or 0) / MIB:.2f} MiB, "
            f"median {result.median_step_ms or 0:.2f} ms; set_to_none=False in record: {'set_to_none=False' in detail}"
        )
    if peaks[False] and peaks[True]:
        print(f"   bucket views save {(peaks[False] - peaks[True]) / MIB:.2f} MiB of peak")


class ReadsTheHost(nn.Module):
    """Many tiny kernels (an idle GPU) and an .item() per step (which would fail a graph capture)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(60))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        if x.mean().item() > 1e9:
            x = x * 0
        return x


def recommendation_with_syncs() -> None:
    from workbench.analysis.diagnose import diagnose
    from workbench.config import TrainConfig
    from workbench.measure.profile import ProfileOptions
    from workbench.trials import run_trial
    from workbench.workloads import Workload

    workload = Workload.from_callables(model_fn=ReadsTheHost, batch_fn=lambda n, g: torch.randn(n, 8, generator=g),
                                       loss_fn=lambda out, batch: out.pow(2).mean(), batch_size=2)  # fmt: skip
    result = run_trial(workload, TrainConfig(), warmup=2, steps=4, device="cuda", profile=ProfileOptions(active=2))
    diagnosis = diagnose(result)
    overhead = next((f for f in diagnosis.findings if f.kind == "overhead"), None)
    if overhead is None:
        print(f"   no overhead finding (kinds {diagnosis.kinds()})")
        return
    print("   overhead recommendations: " + " | ".join(f"{r.title} {r.changes}" for r in overhead.recommendations[:3]))
    expect(not any(r.changes.get("cuda_graphs") for r in overhead.recommendations), "cuda_graphs offered with syncs")


def allocator_model() -> None:
    from workbench.config import TrainConfig
    from workbench.estimate import cublas_workspace_bytes, cuda_block_bytes, estimate_memory
    from workbench.trials import run_trial

    env = {
        k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE")
    }
    print(f"   environment: {env}")
    for nbytes in (5 * MIB, 10 * MIB + 1, 11 * MIB, 11 * MIB + 1, 103 * MIB - 4096):
        model = cuda_block_bytes(nbytes)
        if not CUDA:
            print(f"   {nbytes} B -> model {model} B")
            continue
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        tensor = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        grown = torch.cuda.memory_allocated() - before
        del tensor
        print(f"   {nbytes} B -> allocator {grown} B, model {model} B")
        expect(grown == model, f"block of {nbytes} B: allocator {grown}, model {model}")
    if not CUDA:
        return
    name = torch.cuda.get_device_name()
    real_workspace = getattr(torch.backends.cuda, "cublas_workspace_size", None)
    print(
        f"   cuBLAS workspace per handle: model {cublas_workspace_bytes(name) / MIB:.3f} MiB, "
        f"torch reports {real_workspace() / MIB if real_workspace else 'n/a'}"
    )
    for workload in ("e2e-planner", "bev-perception"):
        real = run_trial(workload, TrainConfig(), warmup=2, steps=3, device="cuda", preset="tiny")
        estimate = estimate_memory(workload, TrainConfig(), name, preset="tiny")
        gap = estimate.peak_bytes - (real.peak_memory_bytes or 0)
        print(
            f"   {workload} tiny: estimate {estimate.peak_bytes / MIB:.1f} MiB, real {(real.peak_memory_bytes or 0) / MIB:.1f} "
            f"MiB, estimate - real {gap / MIB:+.1f} MiB, stated bound ±{estimate.error_bound_bytes / MIB:.1f} MiB"
        )


class HeldActivations(nn.Module):
    """~64 MiB of activations kept for backward at batch 2048: a peak the weights cannot explain."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(8)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def graph_capture_peak() -> None:
    from workbench.config import TrainConfig
    from workbench.trials import run_trial
    from workbench.workloads import Workload

    workload = Workload.from_callables(
        model_fn=HeldActivations,
        batch_fn=lambda n, g: (torch.randn(n, 1024, generator=g), torch.randn(n, 1024, generator=g)),
        loss_fn=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
        batch_size=2048,
    )
    peaks = {}
    for graphs in (False, True):
        result = run_trial(workload, TrainConfig(cuda_graphs=graphs), warmup=3, steps=5, device="cuda")
        peaks[graphs] = result.peak_memory_bytes or 0
        print(
            f"   cuda_graphs={graphs}: {result.status}, peak {peaks[graphs] / MIB:.1f} MiB ({result.memory_method[:90]})"
        )
    expect(peaks[True] >= 0.8 * peaks[False], "a CUDA-graph trial reports far less peak memory than eager")


def second_device() -> None:
    from workbench.config import TrainConfig
    from workbench.trials import run_trial

    if torch.cuda.device_count() < 2:
        print("   skipped: one CUDA device")
        return
    result = run_trial("e2e-planner", TrainConfig(cuda_graphs=True), warmup=3, steps=5, device="cuda:1")
    print(f"   cuda:1 with cuda_graphs: {result.status}, median {result.median_step_ms or 0:.2f} ms")
    expect(result.ok, f"a cuda_graphs trial on cuda:1 failed: {result.message[:120]}")


def distributed_peak() -> None:
    from workbench.config import TrainConfig
    from workbench.trials import run_trial

    result = run_trial("e2e-planner", TrainConfig(strategy="ddp", nproc_per_node=1), warmup=2, steps=5,
                       device="cuda", timeout_s=240)  # fmt: skip
    print(f"   ddp x1: {result.status}, peak {(result.peak_memory_bytes or 0) / MIB:.2f} MiB; {result.memory_method}")
    expect("right after the timed window" in result.memory_method, "the distributed peak is not read after the window")


SECTIONS: list[tuple[str, Callable[[], None], bool]] = [
    ("6 peak table row for this device", peak_table, False),
    ("3 NVLink counters: all links vs link 0", nvlink, False),
    ("5 bf16 gated on compute capability", bf16_gating, False),
    ("11 caching-allocator blocks vs the estimator's model", allocator_model, False),
    ("4 timed window under sync-debug mode (inline trial)", sync_free_window, True),
    ("10 recommendation for an idle GPU whose step syncs", recommendation_with_syncs, True),
    ("7 DDP gradient_as_bucket_view peak memory (1 rank)", ddp_bucket_views, True),
    ("1 CUDA-graph peak includes the capture (vs eager)", graph_capture_peak, True),
    ("2 a CUDA-graph trial on cuda:1", second_device, True),
    ("9 distributed peak read right after the timed window", distributed_peak, True),
]


def main() -> int:
    print(f"torch {torch.__version__}, {'CUDA ' + torch.cuda.get_device_name() if CUDA else 'no CUDA'}")
    for title, run, needs_cuda in SECTIONS:
        print(f"-- item {title}")
        if needs_cuda and not CUDA:
            print("   skipped: needs a CUDA device")
            continue
        try:
            run()
        except Exception as exc:
            failures.append(f"{title}: {type(exc).__name__}: {exc}")
            print(f"   ERROR {type(exc).__name__}: {exc}")
            traceback.print_exc(limit=3)
    print(f"-- {len(failures)} mismatch(es)" + (": " + "; ".join(failures) if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
