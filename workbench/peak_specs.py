"""Peak dense FLOP/s and memory bandwidth of common training accelerators, for MFU and rooflines.

Figures are the vendors' datasheet numbers *without* structured sparsity. A device
name is matched by pattern, because `torch.cuda.get_device_name()` spells the same
part several ways ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TERA = 1e12


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    bf16_flops: float | None
    fp16_flops: float
    tf32_flops: float | None
    fp32_flops: float
    memory_bandwidth: float
    """Bytes per second."""
    memory_bytes: float

    def peak_flops(self, dtype: str) -> float | None:
        """Peak for an AMP dtype name ('bf16', 'fp16', 'fp32', 'tf32'); None when unsupported."""
        return {"bf16": self.bf16_flops, "fp16": self.fp16_flops, "tf32": self.tf32_flops, "fp32": self.fp32_flops}.get(
            dtype
        )


def _spec(
    name: str, bf16: float | None, fp16: float, tf32: float | None, fp32: float, bw_gbs: float, mem_gb: float
) -> DeviceSpec:
    return DeviceSpec(
        name=name,
        bf16_flops=bf16 * TERA if bf16 else None,
        fp16_flops=fp16 * TERA,
        tf32_flops=tf32 * TERA if tf32 else None,
        fp32_flops=fp32 * TERA,
        memory_bandwidth=bw_gbs * 1e9,
        memory_bytes=mem_gb * 1e9,
    )


# Ordered: the first pattern that matches wins, so every variant comes before the pattern its
# name also contains ("H200 NVL" before "H200", "GH200" before "H200", "H100 NVL" before "H100").
# Grace-Hopper parts carry an H100-class die with their own memory; "GB200" must not fall into B200.
_TABLE: list[tuple[str, DeviceSpec]] = [
    # GB200: per GPU of the NVL72 datasheet (rack figures / 72).
    (r"GB200", _spec("GB200", 2500, 2500, 1250, 80, 8000, 186)),
    (r"\bB200", _spec("B200", 2250, 2250, 1100, 80, 8000, 192)),
    (r"GH200.*(144|HBM3e)", _spec("GH200 144GB", 989.4, 989.4, 494.7, 66.9, 4900, 144)),
    (r"GH200", _spec("GH200 96GB", 989.4, 989.4, 494.7, 66.9, 4000, 96)),
    (r"H200.*NVL", _spec("H200 NVL", 835.5, 835.5, 417.5, 60, 4800, 141)),
    (r"H200", _spec("H200 SXM", 989.4, 989.4, 494.7, 66.9, 4800, 141)),
    (r"H100.*NVL", _spec("H100 NVL", 835.5, 835.5, 417.8, 60, 3900, 94)),
    (r"H100.*PCIe", _spec("H100 PCIe", 756.5, 756.5, 378, 51.2, 2000, 80)),
    (r"H100", _spec("H100 SXM", 989.4, 989.4, 494.7, 66.9, 3350, 80)),
    (r"A100.*(PCIE|PCIe).*40", _spec("A100 PCIe 40GB", 312, 312, 156, 19.5, 1555, 40)),
    (r"A100.*(PCIE|PCIe)", _spec("A100 PCIe 80GB", 312, 312, 156, 19.5, 1935, 80)),
    (r"A100.*40", _spec("A100 SXM 40GB", 312, 312, 156, 19.5, 1555, 40)),
    (r"A100", _spec("A100 SXM 80GB", 312, 312, 156, 19.5, 2039, 80)),
    (r"L40S", _spec("L40S", 362.05, 362.05, 183, 91.6, 864, 48)),
    (r"L40\b", _spec("L40", 181, 181, 90.5, 90.5, 864, 48)),
    (r"\bL4\b", _spec("L4", 121, 121, 60, 30.3, 300, 24)),
    (r"A10G", _spec("A10G", 70, 70, 35, 31.2, 600, 24)),
    (r"\bA10\b", _spec("A10", 125, 125, 62.5, 31.2, 600, 24)),
    (r"V100", _spec("V100", None, 125, None, 15.7, 900, 32)),
    (r"MI300X", _spec("MI300X", 1307.4, 1307.4, 653.7, 163.4, 5300, 192)),
]


def lookup_spec(device_name: str) -> DeviceSpec | None:
    """The table entry for a device name as PyTorch reports it, or a short table name ('H100 SXM')."""
    for pattern, spec in _TABLE:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return spec
    return None


def known_devices() -> list[str]:
    return [spec.name for _, spec in _TABLE]
