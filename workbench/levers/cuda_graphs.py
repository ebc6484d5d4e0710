"""CUDA graphs: capture the whole training step once, then replay it with one launch per step.

Follows PyTorch's documented whole-network capture (CUDA semantics notes, "Whole-network
capture"): static input tensors, warm-up iterations on a side stream, grads set to None
before capture so backward allocates them from the graph's private pool, capture of
forward + backward + optimizer.step, then per step: copy the new batch into the static inputs
and replay. It removes per-kernel launch overhead, at the price of fixed shapes, no host syncs
inside the step, and memory held by the graph's pool.

Unlike the documented snippet, the warm-up's effect on training is undone (parameters,
buffers, optimizer state and RNG restored) so the graphed run follows the same trajectory as
an eager run with the same seed; warm-up is compilation/initialisation, not training.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workbench.config import ConfigError, TrainConfig
from workbench.device import ALWAYS, Availability, no_cuda_reason
from workbench.levers.base import Lever, Space, SpaceContext, probed
from workbench.levers.checkpointing import checkpointed_modules
from workbench.levers.fragment import Snippet
from workbench.levers.record import Applied
from workbench.workloads.base import map_tensors

if TYPE_CHECKING:
    from workbench.levers.build import TrainStep

WARMUP_ITERS = 3
"""Eager iterations before capture: lazy initialisation (cuBLAS handles, optimizer state,
autotuning, compilation) must happen outside the graph. PyTorch's example uses 3."""

StepFn = Callable[[Sequence[Any]], torch.Tensor]


class CudaGraphStep:
    """Captures `step_fn` over static micro-batches on the first call; replays it afterwards."""

    def __init__(
        self, step_fn: StepFn, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
    ) -> None:
        self.step_fn, self.model, self.optimizer, self.device = step_fn, model, optimizer, device
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_batches: list[Any] = []
        self.static_loss: torch.Tensor | None = None
        self.replays = 0
        """Replays so far (the first call captures and then replays once)."""

    def __call__(self, micro_batches: Sequence[Any]) -> torch.Tensor:
        if self.graph is None:
            self._capture(micro_batches)
        else:
            self._copy_into_static(micro_batches)
        assert self.graph is not None and self.static_loss is not None
        self.graph.replay()
        self.replays += 1
        # A copy: the static output is overwritten by the next replay, and callers keep losses.
        return self.static_loss.clone()

    def _capture(self, micro_batches: Sequence[Any]) -> None:
        self.static_batches = [map_tensors(b, lambda t: t.clone()) for b in micro_batches]
        restore = snapshot_training_state(self.model, self.optimizer, self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), warnings.catch_warnings():
            # capturable=True optimizers warn when stepped uncaptured; the warm-up does so on purpose.
            warnings.filterwarnings("ignore", message=".*capturable=True.*")
            for _ in range(WARMUP_ITERS):
                self.step_fn(self.static_batches)
        torch.cuda.current_stream(self.device).wait_stream(side)
        restore()  # warm-up initialised state; it must not count as training steps
        # Grads to None: backward inside the capture allocates them from the graph's pool.
        self.optimizer.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        try:
            # "thread_local", not the default "global": in global mode CUDA forbids unsafe calls on
            # every thread while one captures, and a DataLoader's pin-memory thread (num_workers > 0,
            # pin_memory=true) allocating or querying pinned host memory mid-capture fails it. Only
            # this thread's calls are checked, and the capture itself never touches those buffers.
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.static_loss = self.step_fn(self.static_batches)
        except RuntimeError as exc:
            self.graph = None
            raise RuntimeError(
                "CUDA graph capture of the training step failed; the step must not synchronize with the "
                "host (.item(), printing tensors, data-dependent shapes) nor touch CPU tensors. "
                f"Set cuda_graphs=false for this workload. Cause: {exc}"
            ) from exc

    def _copy_into_static(self, micro_batches: Sequence[Any]) -> None:
        if len(micro_batches) != len(self.static_batches):
            raise ValueError(
                f"the CUDA graph was captured for {len(self.static_batches)} micro-batches, got {len(micro_batches)}"
            )
        for static, new in zip(self.static_batches, micro_batches):
            _copy_tensors(static, new)


def snapshot_training_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> Callable[[], None]:
    """Remember parameters, buffers and RNG state; the returned function puts them back.

    Parameters and buffers are copied back in place (the graph keeps their addresses) and the
    optimizer state is zeroed in place: zero is the fresh state of AdamW (step, moments) and of
    SGD's momentum buffer (buf = 0.9 * 0 + grad equals its first-step initialisation).
    """
    tensors = [*model.parameters(), *model.buffers()]
    with torch.no_grad():
        saved = [t.detach().clone() for t in tensors]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore() -> None:
        with torch.no_grad():
            for tensor, value in zip(tensors, saved):
                tensor.copy_(value)
            for state in optimizer.state.values():
                for entry in state.values():
                    if isinstance(entry, torch.Tensor):
                        entry.zero_()
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)

    return restore


def _copy_tensors(static: Any, new: Any) -> None:
    """Copy a (nested) batch into the static one; shapes must match exactly (copy_ would broadcast)."""
    if isinstance(static, torch.Tensor):
        if not isinstance(new, torch.Tensor) or new.shape != static.shape or new.dtype != static.dtype:
            got = f"{tuple(new.shape)} {new.dtype}" if isinstance(new, torch.Tensor) else type(new).__name__
            raise ValueError(
                f"CUDA graphs need fixed batch shapes: captured {tuple(static.shape)} {static.dtype}, got {got}"
            )
        static.copy_(new, non_blocking=True)
    elif isinstance(static, dict):
        for key in static:
            _copy_tensors(static[key], new[key])
    elif isinstance(static, (list, tuple)):
        for s, n in zip(static, new):
            _copy_tensors(s, n)


def apply_cuda_graphs(
    step_fn: StepFn, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> tuple[CudaGraphStep, Applied]:
    """Wrap the eager step in a `CudaGraphStep`; refuses anything but a CUDA device."""
    if device.type != "cuda":
        raise ConfigError(
            f"cuda_graphs=true needs a CUDA device; this step runs on {device.type}. Set cuda_graphs=false"
        )
    if not torch.cuda.is_available():
        raise ConfigError("cuda_graphs=true needs CUDA, but torch.cuda.is_available() is False")
    if checkpointed_modules(model):
        # torch.utils.checkpoint stashes the CUDA RNG state in forward, which CUDA forbids during
        # capture ("Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture").
        raise ConfigError(
            "cuda_graphs=true cannot capture activation checkpointing: checkpoint reads the CUDA RNG state, "
            "which is forbidden during graph capture; set activation_checkpointing=off or cuda_graphs=false"
        )
    if any(not group.get("capturable", True) for group in optimizer.param_groups):
        raise ConfigError("cuda_graphs=true needs an optimizer built with capturable=True (build() does this)")
    detail = (
        f"whole step (forward, backward, optimizer) captured on the first call after {WARMUP_ITERS} warm-up "
        "iterations (undone), replayed after copying each batch into static inputs; batch shapes are fixed"
    )
    return CudaGraphStep(step_fn, model, optimizer, device), Applied("cuda_graphs", True, detail)


def cuda_graphs_availability(value: bool, dev: torch.device) -> Availability:
    if not value or dev.type == "cuda":
        return ALWAYS
    return Availability(False, f"CUDA graphs need a CUDA device; this trial runs on {dev.type} ({no_cuda_reason()})")


def graphed_step_source(config: TrainConfig) -> str:
    """`make_graphed_step`: PyTorch's whole-network CUDA-graph capture of `train_step`."""
    warm_up = [
        "    with torch.cuda.stream(side_stream):",
        f"        for _ in range({WARMUP_ITERS}):",
        "            train_step(model, optimizer, static_batches, loss_fn, forward_fn)",
    ]
    if config.optimizer == "adamw":
        warm_up = [
            "    with torch.cuda.stream(side_stream), warnings.catch_warnings():",
            "        # capturable=True optimizers warn when stepped outside a graph; intended here.",
            '        warnings.filterwarnings("ignore", message=".*capturable=True.*")',
            *warm_up[1:],
        ]
    lines = [
        "def make_graphed_step(",
        "    model: nn.Module,",
        "    optimizer: torch.optim.Optimizer,",
        "    example_batches: Sequence[Batch],",
        "    loss_fn: LossFn = output_loss,",
        "    forward_fn: ForwardFn = forward,",
        ") -> Callable[[Sequence[Batch]], torch.Tensor]:",
        '    """Capture train_step once as a CUDA graph; the returned step(batches) replays it.',
        "",
        "    PyTorch's whole-network capture: static inputs, warm-up on a side stream, capture",
        "    of forward, backward and optimizer step, then per step a copy of the new batches",
        "    into the static inputs and one replay. Later batches need the example batches'",
        "    shapes, and the step must not synchronize with the host (.item(), print).",
        '    """',
        "    static_batches = [to_device(batch, copy=True) for batch in example_batches]",
        "    # Lazy initialisation (optimizer state, cuBLAS handles, compilation) cannot be",
        "    # captured: run a few steps first. As in PyTorch's recipe, they really train.",
        "    side_stream = torch.cuda.Stream(DEVICE)",
        "    side_stream.wait_stream(torch.cuda.current_stream(DEVICE))",
        *warm_up,
        "    torch.cuda.current_stream(DEVICE).wait_stream(side_stream)",
        "    # train_step begins with zero_grad(set_to_none=True): backward then allocates the",
        "    # gradients from the graph's private memory pool, where replays find them.",
        "    graph = torch.cuda.CUDAGraph()",
        "    # thread_local: a DataLoader's pin-memory thread may pin memory meanwhile.",
        '    with torch.cuda.graph(graph, capture_error_mode="thread_local"):',
        "        static_loss = train_step(model, optimizer, static_batches, loss_fn, forward_fn)",
        "",
        "    def graphed_step(batches: Sequence[Batch]) -> torch.Tensor:",
        "        for static, batch in zip(static_batches, batches, strict=True):",
        "            pairs = zip(tensors_of(static), tensors_of(batch), strict=True)",
        "            for static_tensor, tensor in pairs:",
        "                if tensor.shape != static_tensor.shape:",
        "                    raise ValueError(",
        '                        f"CUDA graph replay needs the captured shape "',
        '                        f"{tuple(static_tensor.shape)}, got {tuple(tensor.shape)}"',
        "                    )",
        "                static_tensor.copy_(tensor, non_blocking=True)",
        "        graph.replay()",
        "        return static_loss.clone()  # the next replay overwrites static_loss",
        "",
        "    return graphed_step",
    ]
    return "\n".join(lines)


def _snippet(config: TrainConfig, snippet: Snippet) -> None:
    if not config.cuda_graphs:
        return
    if not snippet.on_cuda:
        raise ConfigError(f"cuda_graphs=true needs a CUDA device; export it with device='cuda', not {snippet.device!r}")
    snippet.statements.insert(
        0,
        "# CUDA graphs (make_graphed_step) exist only on CUDA devices: fail here, with the\n"
        "# reason, rather than deep inside .to() or the capture.\n"
        "if not torch.cuda.is_available():\n"
        "    raise RuntimeError(\n"
        '        "This training step captures CUDA graphs, which need a CUDA device, but "\n'
        '        "torch.cuda.is_available() is False. Export the configuration with "\n'
        '        "cuda_graphs=false to train on this machine."\n'
        "    )",
    )
    drop_last = "drop_last=True  # a short last batch would recompile/break the graph"
    if drop_last not in snippet.loader_args:
        snippet.loader_args.append(drop_last)
    if config.optimizer == "adamw":
        snippet.imports.add("import warnings")
    snippet.graphed_step = graphed_step_source(config)


def _space(ctx: SpaceContext) -> Space:
    return {"cuda_graphs": ctx.available("cuda_graphs")}


def _apply(step: TrainStep) -> None:
    """Captures the step exactly as it finally runs (compiled, checkpointed, AMP): last."""
    if step.config.cuda_graphs:
        step.graphed, record = apply_cuda_graphs(step.eager_step, step.base_model, step.optimizer, step.device)
        step.applied.append(record)


def _describe(name: str, value: Any, config: TrainConfig) -> str | None:
    return "capture the whole step as one CUDA graph and replay it"


LEVER = Lever(
    name="cuda_graphs",
    fields=("cuda_graphs",),
    summary="capture the whole step once and replay it: removes launch overhead on small, launch-bound steps",
    availability=probed(cuda_graphs=cuda_graphs_availability),
    snippet=_snippet,
    space=_space,
    apply=_apply,
    describe=_describe,
)
