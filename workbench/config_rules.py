"""`TrainConfig`'s device-independent rules: bad values and combinations that can never work.

Run when a config is built, so a bad one fails before any trial, with a message saying how to
fix it. Grouped by the lever each rule concerns (see `workbench.levers`). The lowest layer: it
imports nothing of the workbench (no torch, no lever, not even `config`, which imports it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.config import TrainConfig


class ConfigError(ValueError):
    """A configuration that cannot run; the message says how to fix it."""


#: compile modes that capture CUDA graphs themselves (cudagraph trees).
COMPILE_MODES_WITH_CUDA_GRAPHS = ("reduce-overhead", "max-autotune")


def validate(cfg: TrainConfig) -> None:
    """The rules after each field's own type and choices (`TrainConfig` checks those first), in a
    fixed order: the first one broken is the one reported."""
    _check_numbers(cfg)
    _check_combinations(cfg)


# --- every number field: its type and range ---------------------------------------------------


def _check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")


def _check_numbers(cfg: TrainConfig) -> None:
    _check_int("batch_size", cfg.batch_size, 1, allow_none=True)
    _check_int("grad_accumulation", cfg.grad_accumulation, 1)
    _check_int("num_workers", cfg.num_workers, 0)
    _check_int("prefetch_factor", cfg.prefetch_factor, 1, allow_none=True)
    _check_int("seed", cfg.seed, 0)
    _check_int("intra_op_threads", cfg.intra_op_threads, 1, allow_none=True)
    _check_int("nproc_per_node", cfg.nproc_per_node, 1)
    _check_int("nnodes", cfg.nnodes, 1)
    _check_int("tensor_parallel", cfg.tensor_parallel, 1)
    cap = cfg.ddp_bucket_cap_mb
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < math.inf):
        raise ConfigError(f"ddp_bucket_cap_mb must be a positive number of MB (or none for 25), got {cap!r}")
    if isinstance(cfg.lr, bool) or not isinstance(cfg.lr, (int, float)) or not 0 < cfg.lr < math.inf:
        raise ConfigError(f"lr must be a positive number, and finite, got {cfg.lr!r}")


def _check_combinations(cfg: TrainConfig) -> None:
    # compile lever: its options need it on.
    if cfg.compile == "off" and (cfg.compile_fullgraph or cfg.compile_dynamic is not None):
        raise ConfigError("compile_fullgraph/compile_dynamic need compile on; set compile=default (or another mode)")
    if cfg.compile == "off" and cfg.compile_backend != "inductor":
        raise ConfigError("compile_backend is set but compile=off; set compile=default to use the backend")
    # activation_checkpointing lever: a target needs a policy.
    if cfg.activation_checkpointing == "off" and cfg.checkpoint_target != "auto":
        raise ConfigError(
            "checkpoint_target is set but activation_checkpointing=off; set activation_checkpointing=full or selective"
        )
    # cuda_graphs lever: what a captured step cannot contain.
    if cfg.cuda_graphs and cfg.compile in COMPILE_MODES_WITH_CUDA_GRAPHS:
        raise ConfigError(
            f"compile={cfg.compile} already captures CUDA graphs; "
            "set cuda_graphs=false, or use compile=default / max-autotune-no-cudagraphs with cuda_graphs=true"
        )
    if cfg.cuda_graphs and cfg.amp == "fp16":
        raise ConfigError(
            "cuda_graphs cannot capture fp16's GradScaler (its inf check synchronizes with the host); "
            "use amp=bf16, which needs no scaler"
        )
    if cfg.cuda_graphs and cfg.activation_checkpointing != "off":
        raise ConfigError(
            "cuda_graphs cannot capture activation checkpointing (recomputation reads the CUDA RNG state, "
            "which capture forbids); turn one of them off"
        )
    # data_loader lever: worker options need workers.
    if cfg.num_workers == 0 and cfg.prefetch_factor is not None:
        raise ConfigError("prefetch_factor needs num_workers > 0; set num_workers=2 (or more) or drop prefetch_factor")
    if cfg.num_workers == 0 and cfg.persistent_workers:
        raise ConfigError("persistent_workers needs num_workers > 0; set num_workers=2 (or more)")
    _check_distributed(cfg)
    _check_levers(cfg)


# --- data_parallel lever (strategy, world, DDP and FSDP2 options) -------------------------------

#: Fields that only mean something under one strategy, with their defaults.
_DDP_FIELDS: dict[str, Any] = {
    "ddp_bucket_cap_mb": None,
    "ddp_gradient_as_bucket_view": False,
    "ddp_static_graph": False,
    "comm_hook": "none",
}
_FSDP_FIELDS: dict[str, Any] = {"fsdp_reshard_after_forward": True, "fsdp_param_dtype": "fp32"}


def _check_distributed(cfg: TrainConfig) -> None:
    """Distributed fields: each belongs to a strategy, and a world needs a way to meet."""
    if not isinstance(cfg.rdzv_endpoint, str):
        raise ConfigError(f"rdzv_endpoint must be a 'HOST:PORT' string, got {cfg.rdzv_endpoint!r}")
    _check_model_parallel(cfg)
    if not cfg.launches_ranks:
        for name, default in {"nproc_per_node": 1, "nnodes": 1, "rdzv_endpoint": ""}.items():
            if getattr(cfg, name) != default:
                raise ConfigError(
                    f"{name}={getattr(cfg, name)} needs a distributed strategy; set strategy=ddp (or fsdp2)"
                )
    for fields, owner in ((_DDP_FIELDS, "ddp"), (_FSDP_FIELDS, "fsdp2")):
        for name, default in fields.items():
            if getattr(cfg, name) != default and cfg.strategy != owner:
                raise ConfigError(
                    f"{name}={getattr(cfg, name)} applies to strategy={owner} only (this config has "
                    f"strategy={cfg.strategy}); set strategy={owner} or drop {name}"
                )
    if cfg.rdzv_endpoint:
        host, _, port = cfg.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"rdzv_endpoint={cfg.rdzv_endpoint!r} is not HOST:PORT; give the first node's address, "
                "e.g. rdzv_endpoint=node0.cluster:29500"
            )
    if cfg.nnodes > 1 and not cfg.rdzv_endpoint:
        raise ConfigError(
            f"nnodes={cfg.nnodes} needs rdzv_endpoint=HOST:PORT: the first node's address, where "
            "torchrun's c10d rendezvous meets (e.g. rdzv_endpoint=node0:29500)"
        )
    if not cfg.launches_ranks:
        return
    if cfg.cuda_graphs:
        raise ConfigError(
            f"cuda_graphs with {_parallelism(cfg)} is not supported (collectives inside a captured "
            "graph need NCCL graph-safe setup the workbench does not do); turn one of them off"
        )
    if cfg.grad_accumulation > 1:
        raise ConfigError(
            f"grad_accumulation > 1 with {_parallelism(cfg)} is not supported yet (every micro-batch "
            "would synchronize gradients); raise batch_size instead, it is the global batch"
        )
    if cfg.fsdp_param_dtype == "bf16" and cfg.amp == "fp16":
        raise ConfigError(
            "fsdp_param_dtype=bf16 with amp=fp16 computes in two half dtypes at once; use amp=bf16 (or fp32)"
        )


# --- tensor_parallel and sequence_parallel levers: the 2-D mesh dp × tp --------------------------


def _check_model_parallel(cfg: TrainConfig) -> None:
    """The mesh must tile the ranks (dp × tp = nproc_per_node × nnodes); SP lives inside TP."""
    if not isinstance(cfg.sequence_parallel, bool):
        raise ConfigError(f"sequence_parallel must be true or false, got {cfg.sequence_parallel!r}")
    if cfg.sequence_parallel and cfg.tensor_parallel == 1:
        raise ConfigError(
            "sequence_parallel splits the sequence over the tensor-parallel ranks; set tensor_parallel=2 (or more)"
        )
    if not isinstance(cfg.async_tp, bool) or not isinstance(cfg.liger_kernels, bool):
        raise ConfigError("async_tp and liger_kernels must be true or false")
    if cfg.async_tp and (cfg.tensor_parallel == 1 or cfg.compile == "off"):
        raise ConfigError(
            "async_tp overlaps tensor parallelism's collectives inside compiled graphs: it needs "
            "tensor_parallel=2 (or more) and compile=default (or another mode)"
        )
    degree = cfg.tensor_parallel
    if degree == 1:
        return
    ranks = cfg.nproc_per_node * cfg.nnodes
    if cfg.strategy == "ddp":
        raise ConfigError(
            f"tensor_parallel={degree} with strategy=ddp is not supported: use strategy=fsdp2 (FSDP2 over the "
            "data-parallel ranks of a dp × tp mesh) or strategy=none (tensor parallelism alone)"
        )
    if ranks % degree:
        fitting = [d for d in range(2, ranks + 1) if ranks % d == 0]
        raise ConfigError(
            f"tensor_parallel={degree} does not divide the {ranks} ranks (nproc_per_node × nnodes = dp × tp); "
            f"degrees that would: {', '.join(map(str, fitting)) or 'none (one rank)'}, "
            f"or set nproc_per_node to a multiple of {degree}"
        )
    if cfg.strategy == "none" and ranks != degree:
        raise ConfigError(
            f"strategy=none with tensor_parallel={degree} uses every rank for tensor parallelism, but there are "
            f"{ranks}: set nproc_per_node × nnodes = {degree}, or strategy=fsdp2 to shard over dp = {ranks // degree}"
        )


def _parallelism(cfg: TrainConfig) -> str:
    """How the config's ranks split the work, for a message."""
    if cfg.tensor_parallel > 1:
        return f"strategy={cfg.strategy}, tensor_parallel={cfg.tensor_parallel}"
    return f"strategy={cfg.strategy}"


# --- the compiler-level levers: activation_memory_budget, activation_offload, float8,
# --- attention_backend=flex, compiled_autograd ---------------------------------------------

#: Compile backends that never consult the activation memory budget: 'eager' runs no AOTAutograd,
#: 'aot_eager_default_partitioner' partitions with the default (save-everything) partitioner, not the
#: min-cut one that inductor and aot_eager use (torch 2.13's torch/_dynamo/backends/debugging.py).
BACKENDS_WITHOUT_MEMORY_BUDGET = ("eager", "aot_eager_default_partitioner")


def check_budget_value(budget: Any) -> None:
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0.0 <= budget <= 1.0:
        raise ConfigError(
            f"activation_memory_budget must be a number from 0 to 1 (1.0 = off), got {budget!r}; "
            "e.g. activation_memory_budget=0.5 keeps half of the compiled graph's saved activations"
        )


def _check_levers(cfg: TrainConfig) -> None:
    """Levers that act through the compiler need it on, with a backend that honours them."""
    # activation_memory_budget lever
    if cfg.activation_memory_budget < 1.0:
        if cfg.compile == "off":
            raise ConfigError(
                f"activation_memory_budget={cfg.activation_memory_budget} acts through torch.compile's partitioner, "
                "but compile=off; set compile=default, or activation_checkpointing=full/selective for eager"
            )
        if cfg.compile_backend in BACKENDS_WITHOUT_MEMORY_BUDGET:
            raise ConfigError(
                f"compile_backend={cfg.compile_backend} ignores activation_memory_budget (no min-cut partitioner); "
                "use compile_backend=inductor (or aot_eager to check plumbing cheaply)"
            )
    # activation_offload lever
    if cfg.activation_offload != "off" and cfg.cuda_graphs:
        raise ConfigError(
            "activation_offload copies saved activations into host memory allocated each step, which a CUDA "
            "graph cannot capture; turn one of them off"
        )
    # float8 lever
    if cfg.float8 != "off" and cfg.compile == "off":
        raise ConfigError(
            f"float8={cfg.float8} needs compile on: torch.compile fuses float8's scaling and casting kernels, "
            "without it they cost more than the float8 GEMMs save; set compile=default"
        )
    # attention_backend lever (flex)
    if cfg.attention_backend == "flex" and cfg.compile == "off":
        raise ConfigError(
            "attention_backend=flex needs compile on: without torch.compile FlexAttention runs an unfused "
            "reference that materializes the whole score matrix; set compile=default"
        )
    # compiled_autograd lever
    if cfg.compiled_autograd and cfg.compile == "off":
        raise ConfigError(
            "compiled_autograd compiles the backward of a compiled step, but compile=off; set compile=default"
        )
    if cfg.compiled_autograd and cfg.strategy == "ddp":
        raise ConfigError(
            "compiled_autograd with strategy=ddp needs DDP's Python reducer (torch._dynamo.config.optimize_ddp="
            "'python_reducer'), which the workbench does not set up; use strategy=fsdp2 or compiled_autograd=false"
        )
