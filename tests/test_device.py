"""Capabilities: every toggle value's availability on this device, with a reason when it cannot run."""

from __future__ import annotations

import pytest
import torch

from workbench.config import ConfigError, TrainConfig
from workbench.device import device_info, resolve_device
from workbench.levers import capabilities, capabilities_report, check_config
from workbench.peak_specs import known_devices, lookup_spec

needs_cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts CPU-only behaviour")


@needs_cpu_only
def test_cpu_capabilities_refuse_gpu_only_toggles_with_reasons() -> None:
    caps = capabilities("cpu")
    assert not caps["cuda_graphs"][True].available
    assert "CUDA" in caps["cuda_graphs"][True].reason
    assert not caps["compile"]["reduce-overhead"].available
    assert "CUDA graphs" in caps["compile"]["reduce-overhead"].reason
    assert not caps["pin_memory"][True].available
    assert not caps["matmul_precision"]["high"].available
    assert "TF32" in caps["matmul_precision"]["high"].reason
    assert caps["cudnn_tf32"][True].available  # PyTorch's default; off would change nothing here
    assert not caps["cudnn_tf32"][False].available
    assert "on CPU turning it off changes nothing" in caps["cudnn_tf32"][False].reason
    assert caps["optimizer_impl"]["default"].reason == "PyTorch's choice on cpu: for-loop"
    for value, availability in caps["attention_backend"].items():
        if not availability.available:
            assert availability.reason, f"{value} is unavailable without a reason"


def test_sdpa_probe_matches_what_pytorch_really_does() -> None:
    """The capability table must agree with running the kernel: an independent check of the probe."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 16, 64)
    for name, backend in (("math", SDPBackend.MATH), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):  # fmt: skip
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, q, q)
            runs = True
        except RuntimeError:
            runs = False
        assert capabilities("cpu")["attention_backend"][name].available == runs, name


@needs_cpu_only
def test_asking_for_an_unavailable_toggle_is_a_config_error_not_a_no_op() -> None:
    for overrides, reason in [
        ("cuda_graphs=true", "CUDA graphs need a CUDA device"),
        ("compile=reduce-overhead", "reduce-overhead"),
        ("pin_memory=true", "no GPU"),
        ("attention_backend=efficient", "efficient SDPA kernel cannot run"),
        ("cudnn_tf32=false", "cudnn_tf32=False is not available on cpu"),
    ]:
        with pytest.raises(ConfigError, match=reason):
            check_config(TrainConfig().with_overrides(overrides), "cpu")
    check_config(TrainConfig(amp="bf16", channels_last=True, optimizer_impl="fused"), "cpu")


def test_unknown_compile_backend_names_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"not registered; choose one of:.*inductor"):
        check_config(TrainConfig(compile="default", compile_backend="nope"), "cpu")


@needs_cpu_only
def test_resolve_device_explains_missing_cuda() -> None:
    assert resolve_device(None).type == "cpu"
    with pytest.raises(ConfigError, match=r"CPU-only|no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(ConfigError, match="unknown device"):
        resolve_device("tpu:banana")


def test_device_info_and_report_are_plain_data() -> None:
    info = device_info("cpu")
    assert info.type == "cpu" and info.count == 1 and info.cpu_cores >= 1
    assert info.torch_version == torch.__version__
    report = capabilities_report("cpu")
    assert report["toggles"]["amp"]["bf16"] == {"available": True, "reason": ""}
    assert set(report["toggles"]["cuda_graphs"]) == {"true", "false"}


@pytest.mark.parametrize(
    ("torch_name", "table_name", "bf16_tflops", "bandwidth_tbs"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4, 3.35),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.5, 2.0),
        ("NVIDIA H200", "H200 SXM", 989.4, 4.8),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", 312, 2.039),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB", 312, 1.555),
        ("NVIDIA L40S", "L40S", 362.05, 0.864),
        ("NVIDIA L4", "L4", 121, 0.3),
    ],
)
def test_peak_table_matches_datasheets(
    torch_name: str, table_name: str, bf16_tflops: float, bandwidth_tbs: float
) -> None:
    spec = lookup_spec(torch_name)
    assert spec is not None and spec.name == table_name
    assert spec.peak_flops("bf16") == pytest.approx(bf16_tflops * 1e12)
    assert spec.memory_bandwidth == pytest.approx(bandwidth_tbs * 1e12)


# The names `torch.cuda.get_device_name()` / nvidia-smi report, one or more per table row.
PRODUCT_NAMES = {
    "NVIDIA GB200": "GB200",
    "NVIDIA B200": "B200",
    "NVIDIA GH200 144G HBM3e": "GH200 144GB",
    "NVIDIA GH200 480GB": "GH200 96GB",
    "NVIDIA H200 NVL": "H200 NVL",
    "NVIDIA H200": "H200 SXM",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA A100-PCIE-40GB": "A100 PCIe 40GB",
    "NVIDIA A100 80GB PCIe": "A100 PCIe 80GB",
    "NVIDIA A100-SXM4-40GB": "A100 SXM 40GB",
    "NVIDIA A100-SXM4-80GB": "A100 SXM 80GB",
    "NVIDIA L40S": "L40S",
    "NVIDIA L40": "L40",
    "NVIDIA L4": "L4",
    "NVIDIA A10G": "A10G",
    "NVIDIA A10": "A10",
    "Tesla V100-SXM2-32GB": "V100",
    "AMD Instinct MI300X": "MI300X",
}


@pytest.mark.parametrize(("product_name", "table_name"), sorted(PRODUCT_NAMES.items()))
def test_every_product_name_finds_its_own_row(product_name: str, table_name: str) -> None:
    spec = lookup_spec(product_name)
    assert spec is not None and spec.name == table_name


def test_every_table_row_is_reached_by_a_product_name() -> None:
    """A row that no real name reaches is shadowed by a more generic pattern above it."""
    assert set(PRODUCT_NAMES.values()) == set(known_devices())


def test_nvl_and_grace_hopper_parts_get_their_own_figures() -> None:
    h200_nvl = lookup_spec("NVIDIA H200 NVL")
    assert h200_nvl is not None
    assert h200_nvl.peak_flops("bf16") == pytest.approx(835.5e12)
    assert h200_nvl.peak_flops("tf32") == pytest.approx(417.5e12)
    gh200 = lookup_spec("NVIDIA GH200 480GB")
    assert gh200 is not None
    assert gh200.memory_bytes == pytest.approx(96e9) and gh200.memory_bandwidth == pytest.approx(4.0e12)


def test_peak_table_knows_unsupported_dtypes_and_unknown_devices() -> None:
    v100 = lookup_spec("Tesla V100-SXM2-32GB")
    assert v100 is not None and v100.peak_flops("bf16") is None
    assert lookup_spec("AMD Ryzen 9 7950X") is None


# --- distributed capabilities -------------------------------------------------------


@needs_cpu_only
def test_cpu_allows_small_gloo_worlds_and_refuses_the_bf16_hook_with_its_reason() -> None:
    import os

    caps = capabilities("cpu")
    assert caps["strategy"]["ddp"].available and caps["strategy"]["fsdp2"].available
    assert not caps["comm_hook"]["bf16"].available
    assert "NCCL" in caps["comm_hook"]["bf16"].reason and "comm_hook=fp16" in caps["comm_hook"]["bf16"].reason
    assert caps["comm_hook"]["fp16"].available
    assert caps["nproc_per_node"][2].available  # the smallest real world runs even on a tiny machine
    cores = len(os.sched_getaffinity(0))
    too_many = max(2, cores) + 1
    with pytest.raises(ConfigError, match=f"nproc_per_node={too_many} is not available on cpu.*CPU core"):
        check_config(TrainConfig(strategy="ddp", nproc_per_node=too_many), "cpu")
    with pytest.raises(ConfigError, match="comm_hook=bf16 is not available on cpu"):
        check_config(TrainConfig(strategy="ddp", nproc_per_node=2, comm_hook="bf16"), "cpu")
    check_config(TrainConfig(strategy="fsdp2", nproc_per_node=2, fsdp_param_dtype="bf16", amp="bf16"), "cpu")
    report = capabilities_report("cpu")["toggles"]
    assert set(report["nproc_per_node"]) >= {"1", "2"} and "bf16" in report["comm_hook"]


def test_gpu_worlds_need_one_device_per_rank() -> None:
    from workbench.levers.distributed import world_size_availability

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    count = torch.cuda.device_count()
    assert world_size_availability(count, torch.device("cuda")).available
    refused = world_size_availability(count + 1, torch.device("cuda"))
    assert not refused.available and f"{count} CUDA device" in refused.reason


# --- bf16 only where the GPU runs it natively ----------------------------------------


@pytest.mark.parametrize(
    ("capability", "native"),
    [
        ((6, 0), False),
        ((7, 0), False),
        ((7, 5), False),
        ((8, 0), True),
        ((8, 6), True),
        ((9, 0), True),
        ((10, 0), True),
    ],
)
def test_bf16_is_offered_from_compute_capability_8_0(capability: tuple[int, int], native: bool) -> None:
    # torch.cuda.is_bf16_supported() says True on V100 (7.0) and T4 (7.5): emulation, not hardware.
    from workbench.device import bf16_availability, native_half_dtype

    availability = bf16_availability(capability)
    assert availability.available is native
    assert native_half_dtype(capability) == (torch.bfloat16 if native else torch.float16)
    if not native:
        assert f"{capability[0]}.{capability[1]}" in availability.reason and "8.0" in availability.reason
        assert "fp16" in availability.reason


def test_amp_and_fsdp_bf16_gate_on_the_device_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gating decision given a V100's capability tuple (only the tuple is supplied, no GPU call)."""
    from workbench.levers import amp, distributed

    asked: list[torch.device] = []

    def v100(dev: torch.device) -> tuple[int, int]:
        asked.append(dev)
        return (7, 0)

    monkeypatch.setattr(amp, "cuda_capability", v100)
    monkeypatch.setattr(distributed, "cuda_capability", v100)
    cuda1 = torch.device("cuda:1")
    assert not amp.amp_availability("bf16", cuda1).available
    assert amp.amp_availability("fp16", cuda1).available
    assert not distributed.fsdp_param_dtype_availability("bf16", cuda1).available
    assert asked == [cuda1, cuda1]  # the trial's device, not whichever device is current
