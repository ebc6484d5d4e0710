"""Run under torchrun: one step of the tiny driving-vlm built with tensor (and sequence) parallelism
next to the same model in one piece on the same rank, and what each rank saw, as JSON.

    torchrun --nproc_per_node=2 tests/tp_rank_check.py OUT.json driving-vlm tensor_parallel=2,nproc_per_node=2

The workload is a built-in name (tiny preset) or a 'module:attr' spec. Rank 0 writes: the losses (split, whole), the largest gradient difference (full tensors), the
placements of a few parameters, and the collectives of one forward as DTensor's CommDebugMode and
the workbench's own counter saw them.
"""

from __future__ import annotations

import contextlib
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode

from workbench.config import TrainConfig
from workbench.distributed.collectives import CollectiveCounter
from workbench.levers.build import build
from workbench.workloads import load_workload
from workbench.workloads.base import move_batch

PLACED = (
    "blocks.0.attn.qkv.weight",
    "blocks.0.attn.proj.weight",
    "blocks.0.norm1.weight",
    "lm_head.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.embed_tokens.weight",
)


def main(out: str, workload_name: str, overrides: str) -> None:
    dist.init_process_group("gloo")
    workload = load_workload(workload_name, "tiny")
    config = TrainConfig().with_overrides(overrides)
    batch = move_batch(next(iter(workload.make_loader(config))), "cpu")  # every tp rank trains the same batch

    torch.manual_seed(config.seed)
    whole = workload.model_fn()
    whole_loss = workload.loss_fn(workload.forward_fn(whole, batch), batch)
    whole_loss.backward()

    step = build(workload, config, "cpu")
    # CommDebugMode's module tracker fails inside transformers' models (IndexError in
    # _fw_set_module_hook, torch 2.13): collectives are counted on the built-in workloads only.
    comm = CommDebugMode() if ":" not in workload_name else None
    with comm if comm is not None else contextlib.nullcontext(), CollectiveCounter() as counter:
        output = workload.forward_fn(step.model, batch)
    loss = workload.loss_fn(output, batch)
    loss.backward()

    grads = dict(whole.named_parameters())
    worst = 0.0
    for name, param in step.base_model.named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad  # a collective: every rank
        worst = max(worst, float((grad - grads[name].grad).abs().max()))
    params = dict(step.base_model.named_parameters())
    report = {
        "loss": float(loss.detach()),
        "whole_loss": float(whole_loss.detach()),
        "max_grad_diff": worst,
        "placements": {
            name: [str(p) for p in params[name].placements] if isinstance(params[name], DTensor) else None
            for name in PLACED
            if name in params
        },
        "local_shape": {
            name: list(getattr(params[name], "_local_tensor", params[name]).shape) for name in PLACED if name in params
        },
        "comm_counts": {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()} if comm else None,
        "counted": counter.counts,
        "applied": {a.toggle: a.detail for a in step.applied},
    }
    if dist.get_rank() == 0:
        with open(out, "w") as handle:
            json.dump(report, handle)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
