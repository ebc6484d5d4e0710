"""Data parallelism: wrap the model in DDP or shard it with FSDP2, on an initialized process group.

Applied by `build()` after activation checkpointing and before the optimizer: FSDP2 replaces
parameters with sharded DTensors, so the optimizer must be built on the result, and compile
then traces the wrapped forward (PyTorch's recommended order for DDP: wrap, then compile, so
DDPOptimizer can split the graph at bucket boundaries). The process group itself belongs to
the launcher (`workbench.distributed`); this module never creates one.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workbench.config import ConfigError, TrainConfig
from workbench.device import ALWAYS, Availability, bf16_availability, cpu_cores, cuda_capability, distributed_backend
from workbench.levers.base import Lever, Table, always, probed
from workbench.levers.checkpointing import find_targets, resolve_target
from workbench.levers.record import Applied, name_list

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from workbench.levers.build import TrainStep

DEFAULT_BUCKET_CAP_MB = 25.0
"""DistributedDataParallel's own default bucket size, reported when the config leaves it unset."""


def apply_data_parallel(
    model: nn.Module,
    config: TrainConfig,
    device: torch.device,
    block_target: str | None = None,
    mesh: DeviceMesh | None = None,
) -> tuple[nn.Module, Applied]:
    """DDP wrapper or FSDP2-sharded model for `config.strategy`; what runs forward from now on.

    `block_target` is the workload's repeated block class (its checkpoint target): FSDP2 shards
    each such block as one unit, so a block's parameters are gathered just before it runs.
    `mesh`: the data-parallel dimension of a dp × tp mesh (FSDP2 over it); None is every rank.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError(
            f"strategy={config.strategy} needs an initialized process group: run the trial through "
            "run_trial (which launches torchrun) or `torchrun ... -m workbench.distributed`"
        )
    if config.strategy == "ddp":
        return apply_ddp(model, config, device)
    if config.strategy == "fsdp2":
        return apply_fsdp2(model, config, block_target, mesh)
    raise ConfigError(f"strategy={config.strategy!r} is not a data-parallel strategy; use ddp or fsdp2")


def grads_stay_bucket_views(config: TrainConfig) -> bool:
    """Whether `zero_grad` must zero gradients in place (set_to_none=False) rather than drop them.

    With gradient_as_bucket_view each `.grad` *is* a view into DDP's all-reduce bucket. Set to
    None, backward allocates a fresh gradient every step and the reducer copies it into the
    bucket before re-pointing `.grad` at the view: the memory and the copy the option saves
    come back (PyTorch's Reducer handles "users may set grad to be None" with exactly that copy).
    """
    return config.strategy == "ddp" and config.ddp_gradient_as_bucket_view


def apply_ddp(model: nn.Module, config: TrainConfig, device: torch.device) -> tuple[nn.Module, Applied]:
    """DistributedDataParallel with the config's bucket size, bucket views, static graph and hook."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    kwargs: dict[str, Any] = {
        "gradient_as_bucket_view": config.ddp_gradient_as_bucket_view,
        "static_graph": config.ddp_static_graph,
    }
    if config.ddp_bucket_cap_mb is not None:
        kwargs["bucket_cap_mb"] = config.ddp_bucket_cap_mb
    if device.type == "cuda":
        kwargs["device_ids"] = [device.index if device.index is not None else torch.cuda.current_device()]
    wrapped = DistributedDataParallel(model, **kwargs)
    hook_text = _register_comm_hook(wrapped, config.comm_hook, dist.get_backend())
    cap = config.ddp_bucket_cap_mb if config.ddp_bucket_cap_mb is not None else DEFAULT_BUCKET_CAP_MB
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    detail = (
        f"DistributedDataParallel over {dist.get_world_size()} {dist.get_backend()} ranks: "
        f"{grads / 2**20:.1f} MiB of gradients all-reduced in {cap:g} MB buckets during backward"
        f"; gradient_as_bucket_view={config.ddp_gradient_as_bucket_view}, static_graph={config.ddp_static_graph}"
        f"; {hook_text}"
    )
    if grads_stay_bucket_views(config):
        detail += (
            "; zero_grad(set_to_none=False): gradients stay views into the buckets between steps "
            "(None would allocate fresh ones and copy them in every step)"
        )
    return wrapped, Applied("strategy", "ddp", detail)


def _register_comm_hook(wrapped: Any, hook: str, backend: str) -> str:
    """Register the gradient-compression hook; bf16 only where PyTorch allows it (NCCL)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if hook == "none":
        return "no comm hook (fp32 all-reduce)"
    if hook == "bf16" and backend != "nccl":
        raise ConfigError(
            f"comm_hook=bf16 needs the NCCL backend (DDP's bf16_compress_hook requires CUDA 11+ and NCCL 2.10+); "
            f"this trial runs on {backend}: use comm_hook=fp16"
        )
    function = default_hooks.fp16_compress_hook if hook == "fp16" else default_hooks.bf16_compress_hook
    wrapped.register_comm_hook(state=None, hook=function)
    return f"{function.__name__}: gradients cast to {hook} for the all-reduce (half the bytes), back to fp32 after"


def apply_fsdp2(
    model: nn.Module, config: TrainConfig, block_target: str | None, mesh: DeviceMesh | None = None
) -> tuple[nn.Module, Applied]:
    """`fully_shard` each repeated block, then the root: one all-gather per block in forward.

    With fsdp_param_dtype=bf16, BatchNorm layers get their own fp32 policy: bf16 batch statistics
    lose precision, and an fp32 BatchNorm only meets its bf16 neighbours under autocast, so
    that combination requires amp=bf16 (seen on CPU: without autocast the next layer fails
    with "mat1 and mat2 must have the same dtype").
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    if config.fsdp_param_dtype == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    norms = [name for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    notes: list[str] = []
    if config.fsdp_param_dtype == "bf16" and norms:
        if config.amp != "bf16":
            raise ConfigError(
                f"fsdp_param_dtype=bf16 on a model with {len(norms)} BatchNorm layer(s) ({name_list(norms, 3)}) "
                "needs amp=bf16: the BatchNorm layers are kept in fp32, and only autocast lets them meet "
                "bf16 neighbours; set amp=bf16, or fsdp_param_dtype=fp32"
            )
        modules = dict(model.named_modules())
        fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
        for name in norms:
            fully_shard(
                modules[name], mesh=mesh, mp_policy=fp32, reshard_after_forward=config.fsdp_reshard_after_forward
            )
        notes.append(f"{len(norms)} BatchNorm layer(s) kept fp32 (own fp32 policy, autocast on)")
    blocks = _blocks(model, config, block_target)
    modules = dict(model.named_modules())
    for name in blocks:
        fully_shard(modules[name], mesh=mesh, mp_policy=policy, reshard_after_forward=config.fsdp_reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=config.fsdp_reshard_after_forward)
    import torch.distributed as dist

    unit = f"{len(blocks)} block(s) ({name_list(blocks, 4)}) + root" if blocks else "the root module only"
    precision = "params bf16, gradients reduced in fp32" if config.fsdp_param_dtype == "bf16" else "fp32"
    ranks = mesh.size() if mesh is not None else dist.get_world_size()
    over = " (the dp dimension of the dp × tp mesh)" if mesh is not None else ""
    detail = (
        f"fully_shard over {ranks} {dist.get_backend()} ranks{over}: {unit}; "
        f"reshard_after_forward={config.fsdp_reshard_after_forward}; {precision}"
    )
    if notes:
        detail += "; " + "; ".join(notes)
    return model, Applied("strategy", "fsdp2", detail)


def _blocks(model: nn.Module, config: TrainConfig, block_target: str | None) -> list[str]:
    """The sharding units: the checkpoint target when one is set, else the workload's block class."""
    target = config.checkpoint_target if config.checkpoint_target != "auto" else block_target
    if not target:
        return []  # a model without a known block is sharded as one unit: correct, less overlap
    names = find_targets(model, resolve_target(target, block_target))
    return [n for n in names if n]  # the root is sharded last, separately


WORLD_SIZES_SHOWN = (1, 2, 4, 8)
"""nproc_per_node values `capabilities()` lists; `check_config` judges any value."""

CPU_RANKS_MAX_FLOOR = 2
"""Gloo ranks allowed on CPU even with fewer cores: the smallest world that exercises the real path."""
CPU_RANKS_MAX_VARIABLE = "WORKBENCH_CPU_RANKS_MAX"
"""Raises that limit on purpose: to check a larger world's behaviour (which rank is named, how a
failure is reported) on a small machine, where its step times are time-shared and mean little."""


def _ranks_allowed_by_user() -> int:
    value = os.environ.get(CPU_RANKS_MAX_VARIABLE, "")
    try:
        return int(value) if value else 0
    except ValueError:
        raise ConfigError(f"{CPU_RANKS_MAX_VARIABLE}={value!r} must be a whole number of gloo ranks") from None


def world_size_availability(nproc: int, dev: torch.device) -> Availability:
    """Can this node run `nproc` ranks? One GPU per rank on CUDA; a small gloo world on CPU."""
    if dev.type == "cuda":
        count = torch.cuda.device_count()
        if nproc > count:
            return Availability(False, f"this machine has {count} CUDA device(s); each rank needs its own GPU")
        return ALWAYS
    cores = cpu_cores()
    limit = max(CPU_RANKS_MAX_FLOOR, cores, _ranks_allowed_by_user())
    if nproc > limit:
        return Availability(
            False,
            f"{nproc} gloo ranks on {cores} CPU core(s) would time-share cores; the step times would mean nothing "
            f"(set {CPU_RANKS_MAX_VARIABLE}={nproc} to run them anyway, for their behaviour, not their speed)",
        )
    return Availability(True, "gloo ranks on CPU cores, one thread each: shows the mechanics, not GPU speed")


def strategy_availability(value: str, dev: torch.device) -> Availability:
    if value == "none":
        return ALWAYS
    import torch.distributed as dist

    if not dist.is_available():
        return Availability(False, "this PyTorch build has no torch.distributed")
    backend = distributed_backend(dev)
    if not (dist.is_nccl_available() if backend == "nccl" else dist.is_gloo_available()):
        return Availability(False, f"this PyTorch build has no {backend} backend")
    if value == "fsdp2" and importlib.util.find_spec("torch.distributed.fsdp") is None:
        return Availability(False, "FSDP2 (torch.distributed.fsdp.fully_shard) needs torch >= 2.6")
    return ALWAYS


def comm_hook_availability(value: str, dev: torch.device) -> Availability:
    if value == "bf16" and distributed_backend(dev) != "nccl":
        return Availability(
            False,
            "DDP's bf16_compress_hook requires CUDA 11+ and NCCL 2.10+; PyTorch refuses it on gloo: use comm_hook=fp16",
        )
    if value == "bf16":
        version = tuple(torch.cuda.nccl.version()) if torch.distributed.is_nccl_available() else ()
        if version < (2, 10):
            return Availability(False, f"DDP's bf16_compress_hook needs NCCL 2.10+, this build has {version or 'none'}")
    if value == "fp16" and dev.type == "cpu":
        return Availability(True, "on CPU the casts cost about what the halved bytes save over local gloo")
    return ALWAYS


def fsdp_param_dtype_availability(value: str, dev: torch.device) -> Availability:
    if value == "bf16" and dev.type == "cuda":
        return bf16_availability(cuda_capability(dev))
    return ALWAYS


def _availability(dev: torch.device) -> Table:
    table = probed(
        strategy=strategy_availability, comm_hook=comm_hook_availability, fsdp_param_dtype=fsdp_param_dtype_availability
    )(dev)
    table.update(always("ddp_gradient_as_bucket_view", "ddp_static_graph", "fsdp_reshard_after_forward")(dev))
    # World sizes are integers, not choices: list the usual ones for a control to offer.
    table["nproc_per_node"] = {n: world_size_availability(n, dev) for n in WORLD_SIZES_SHOWN}
    return table


def _check(config: TrainConfig, dev: torch.device) -> None:
    if config.strategy != "none":
        world = world_size_availability(config.nproc_per_node, dev)
        if not world.available:
            raise ConfigError(f"nproc_per_node={config.nproc_per_node} is not available on {dev}: {world.reason}")


def _apply(step: TrainStep) -> None:
    """After the model changes, whose modules the wrappers must contain; before the optimizer,
    because FSDP2 swaps the parameters for sharded DTensors; before compile, which traces the
    wrapped forward."""
    if step.config.strategy != "none":
        mesh = step.device_mesh["dp"] if step.device_mesh is not None else None
        step.model, record = apply_data_parallel(
            step.base_model, step.config, step.device, step.workload.checkpoint_target, mesh
        )
        step.applied.append(record)


_FIELDS = (
    "strategy",
    "nproc_per_node",
    "rdzv_endpoint",
    "nnodes",
    "ddp_bucket_cap_mb",
    "ddp_gradient_as_bucket_view",
    "ddp_static_graph",
    "comm_hook",
    "fsdp_reshard_after_forward",
    "fsdp_param_dtype",
)
_NOT_TUNED = "distributed tuning is not supported yet; tune one process, then scale out"

LEVER = Lever(
    name="data_parallel",
    fields=_FIELDS,
    summary="DDP or FSDP2 over several processes (torchrun): more samples per second, or a model too big for one",
    availability=_availability,
    open_fields=("rdzv_endpoint", "nnodes", "ddp_bucket_cap_mb"),
    check=_check,
    not_exported="the snippet is one process's step; a distributed run is exported as its torchrun command "
    "(`workbench export --format command`), which runs the workbench's own rank entry point",
    not_searched=_NOT_TUNED,
    fixed={name: _NOT_TUNED for name in _FIELDS},
    apply=_apply,
)
