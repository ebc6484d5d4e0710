"""`LEVERS`: every lever, in the one order `build()` applies them, and the questions asked of all.

The order, and why (`build()` follows it; levers with nothing to apply sit where their setting
is read):
1. memory format first: it rewrites parameter storage; the optimizer state (zeros_like the
   parameters) and compiled kernels must see the final layout.
2. float8 swaps nn.Linear for torchao's Float8Linear: a module change all later steps must see
   (checkpointing patches the final modules, the optimizer holds the final parameters, compile
   traces the float8 casts to fuse them); torchtitan converts before parallelizing.
3. Liger's kernels patch a Hugging Face model's modules by type: a module change like float8.
4. tensor parallelism (then its sequence-parallel variant, applied with it) splits the plan's
   layers into DTensor shards over the tp ranks: a module change, so before checkpointing (which
   wraps the split blocks), compile (which traces them) and FSDP2 (which shards the rest over the
   dp ranks of the same mesh and must see the DTensors) — torchtitan's order: TP, AC, compile, FSDP.
   Async TP then enables symmetric memory for the tp group TP built; compile reads its pass.
5. activation checkpointing patches module forwards. Before compile, so dynamo traces the
   checkpointed regions (torchtitan: "turn on per-block compile after AC wrapping").
6. activation offload patches module forwards as checkpointing does, after it: on a module both
   target, offload wraps the checkpointed forward and moves only what checkpointing saves.
7. attention backend: FlexAttention swaps the attention call inside the model's modules, a module
   change, so before compile and the data-parallel wrappers; a forced SDPA kernel is a context
   around the step (forward and backward).
8. data parallelism: after checkpointing, whose wrapped forwards the shards must contain, and last
   of the parallel layouts (FSDP2 over the mesh's dp dimension when TP built one); before
   the optimizer, because FSDP2 swaps the parameters for sharded DTensors; before compile, so
   dynamo traces the wrapped forward (DDP: wrap, then compile).
9. optimizer once the model is final, so it holds the parameters that train. CUDA graphs need
   capturable Adam(W), so that is decided here already.
10. batching: micro-batches per optimizer step, which the step runs.
11. AMP: autocast around forward+loss, GradScaler for fp16 (no cast cache under CUDA graphs).
12. float32 precision and 13. intra-op threads: process-global flags, scoped to the step.
14. activation memory budget: a compiler setting read when the first forward compiles, so a
    context around forward like 11-13, compiled in.
15. compile last among module changes: it traces the final forward, with 11-14 active.
16. compiled autograd: a context around each backward, after compile, whose forward makes it.
17. CUDA graphs capture the step exactly as it finally runs (compiled, checkpointed, AMP).
18. uint8 images: the loader ships uint8 pixels; the step's batch preparation normalizes them
    once they are on the device, before anything the step runs reads them (channels_last
    included), so every lever above sees the float path's batch.
19. the data loader: outside the step (the loader that feeds it).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from workbench.config import ConfigError, TrainConfig
from workbench.device import Availability, device_info, resolve_device
from workbench.levers import (
    amp,
    async_tp,
    attention,
    batching,
    checkpointing,
    compile,
    compiled_autograd,
    cuda_graphs,
    distributed,
    float8,
    liger,
    loader,
    memory_budget,
    memory_format,
    offload,
    optimizer,
    precision,
    sequence_parallel,
    tensor_parallel,
    threads,
    uint8_images,
)
from workbench.levers.base import Lever

if TYPE_CHECKING:
    import torch

LEVERS: tuple[Lever, ...] = (
    memory_format.LEVER,
    float8.LEVER,
    liger.LEVER,
    tensor_parallel.LEVER,
    sequence_parallel.LEVER,
    async_tp.LEVER,
    checkpointing.LEVER,
    offload.LEVER,
    attention.LEVER,
    distributed.LEVER,
    optimizer.LEVER,
    batching.LEVER,
    amp.LEVER,
    precision.LEVER,
    threads.LEVER,
    memory_budget.LEVER,
    compile.LEVER,
    compiled_autograd.LEVER,
    cuda_graphs.LEVER,
    uint8_images.LEVER,
    loader.LEVER,
)

#: TrainConfig fields no lever owns: they say what is trained, not how fast.
NOT_LEVERS = ("lr", "seed", "extra")


def lever_of(field_name: str) -> Lever:
    """The lever that owns a TrainConfig field."""
    for lever in LEVERS:
        if field_name in lever.fields:
            return lever
    raise KeyError(f"no lever owns the field {field_name!r}")


def capabilities(device: str | torch.device | None = None) -> dict[str, dict[Any, Availability]]:
    """For every listed lever value: its Availability on this device (probed once per device)."""
    dev = resolve_device(device)
    caps: dict[str, dict[Any, Availability]] = {}
    for index in range(len(LEVERS)):
        caps.update(_lever_availability(index, str(dev)))
    return caps


@functools.lru_cache(maxsize=128)
def _lever_availability(index: int, device_str: str) -> dict[str, dict[Any, Availability]]:
    """One lever's table on one device: some probes run a kernel or import the compiler (~1 s)."""
    import torch

    return LEVERS[index].availability(torch.device(device_str))


def check_config(config: TrainConfig, device: str | torch.device | None = None) -> None:
    """Raise ConfigError when the config asks for something this device cannot do.

    Only the levers the config changes are probed: PyTorch's defaults (`TrainConfig()`) run on
    every device, and a process that checks a default config (the CLI before its workers, each
    worker) skips probes that import the compiler.
    """
    dev = resolve_device(device)
    default = _default_like(config)
    for index, lever in enumerate(LEVERS):
        if default is not None and all(getattr(config, name) == getattr(default, name) for name in lever.fields):
            continue
        for name, table in _lever_availability(index, str(dev)).items():
            value = getattr(config, name)
            availability = table.get(value)
            if availability is not None and not availability.available:
                raise ConfigError(f"{name}={value} is not available on {dev}: {availability.reason}")
    for lever in LEVERS:
        if lever.check is not None:
            lever.check(config, dev)


def _default_like(config: TrainConfig) -> TrainConfig | None:
    """The config's own class with every default (a subclass adds a user's lever fields), or None
    when that class has a field without one: then every lever is probed."""
    try:
        return type(config)()
    except (TypeError, ConfigError):
        return None


def capabilities_report(device: str | torch.device | None = None) -> dict[str, Any]:
    """Plain data for the CLI/JSON/UI: device facts plus every value's availability."""
    info = device_info(device)
    caps = capabilities(device)
    return {
        "device": info.to_dict(),
        "toggles": {
            name: {_key(v): {"available": a.available, "reason": a.reason} for v, a in table.items()}
            for name, table in caps.items()
        },
    }


def _key(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
