"""`Workload`: a model factory, its data and its loss — everything a trial needs but the config.

A workload knows nothing of measurement. Built-ins and users' own models share this
one type; `from_callables` adapts any ordinary `nn.Module` training setup.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    from workbench.config import TrainConfig


class WorkloadError(ValueError):
    """A workload that cannot be built or used; the message says how to fix it."""


Batch = Any
ForwardFn = Callable[["nn.Module", Batch], Any]
LossFn = Callable[[Any, Batch], "torch.Tensor"]
BatchFn = Callable[[int, "torch.Generator"], Batch]


def default_forward(model: nn.Module, batch: Batch) -> Any:
    """`model(x)` for a tensor batch or an `(x, target, ...)` tuple; `model(**batch)` for a dict
    batch (the Hugging Face convention: input_ids, attention_mask, labels, pixel_values, ...)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return model(batch)
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)) and batch:
        return model(batch[0])
    raise WorkloadError(
        f"cannot feed a batch of type {type(batch).__name__} to the model by default; "
        "pass forward_fn=lambda model, batch: model(...) to Workload.from_callables"
    )


def output_loss(output: Any, batch: Batch) -> torch.Tensor:
    """The loss a model computed itself: `output.loss` or `output["loss"]` (Hugging Face models
    given `labels` return one). The default when no `loss_fn` is given."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if loss is None:
        raise WorkloadError(
            f"the model's output ({type(output).__name__}) has no 'loss' attribute or key, and no loss_fn was "
            "given: pass loss_fn=lambda output, batch: ... to Workload.from_callables (or put the labels in "
            "the batch so the model computes its own loss)"
        )
    return cast("torch.Tensor", loss)


@dataclass(frozen=True)
class Uint8Images:
    """How a workload's images travel as uint8 (`TrainConfig.uint8_images`): the dataset that
    yields them unscaled, and what turns a batch of them, on the device, into the float path's."""

    dataset_fn: Callable[[int], Dataset[Any]]
    """`dataset_fn(seed)`: the same samples, images as uint8 pixels (0-255) instead of floats."""
    normalize: Callable[[Batch], Batch]
    """A batch already on the device → the same batch with its images scaled and normalized."""


@dataclass
class Workload:
    """A training workload. `loss_fn(output, batch)` must return a scalar tensor."""

    name: str
    model_fn: Callable[[], nn.Module]
    loss_fn: LossFn
    batch_size: int
    """Default micro-batch size (`TrainConfig.batch_size` overrides it)."""
    dataset_fn: Callable[[int], Dataset[Any]] | None = None
    """`dataset_fn(seed)` -> map-style dataset of single samples (collated by the loader)."""
    batch_fn: BatchFn | None = None
    """`batch_fn(batch_size, generator)` -> one whole batch; used when there is no dataset."""
    forward_fn: ForwardFn = default_forward
    collate_fn: Callable[[list[Any]], Batch] | None = None
    checkpoint_target: str | None = None
    """What `checkpoint_target='auto'` means here: the class name of the repeated block."""
    preset: str | None = None
    description: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    """Options the workload was built with (e.g. sample_cost_ms), recorded with results."""
    source: dict[str, Any] | None = None
    """How to rebuild it elsewhere: {'kind': 'builtin'|'spec', 'name': ..., 'preset': ..., 'options': ...}."""
    uint8_images: Uint8Images | None = None
    """The uint8 path for its images, when the workload offers one (`TrainConfig.uint8_images`)."""
    tp_plan: Mapping[str, Any] | None = None
    """How tensor_parallel splits the model: module-name pattern ('blocks.*.attn.qkv') → style,
    a name ('colwise', 'rowwise', 'colwise_rep', 'sequence_parallel', 'sequence_region', the
    Hugging Face vocabulary) or a DTensor ParallelStyle. None: a Hugging Face model's own
    `config.base_model_tp_plan`, else tensor_parallel is refused."""

    def __post_init__(self) -> None:
        if (self.dataset_fn is None) == (self.batch_fn is None):
            raise WorkloadError(f"workload '{self.name}': give exactly one of dataset_fn or batch_fn")
        if not callable(self.model_fn) or not callable(self.loss_fn) or not callable(self.forward_fn):
            raise WorkloadError(f"workload '{self.name}': model_fn, loss_fn and forward_fn must be callables")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise WorkloadError(
                f"workload '{self.name}': batch_size must be a positive integer, got {self.batch_size!r}"
            )

    @classmethod
    def from_callables(
        cls,
        model_fn: Callable[[], nn.Module],
        loss_fn: LossFn | None = None,
        *,
        batch_fn: BatchFn | None = None,
        dataset_fn: Callable[..., Dataset[Any]] | None = None,
        forward_fn: ForwardFn | None = None,
        batch_size: int = 8,
        collate_fn: Callable[[list[Any]], Batch] | None = None,
        checkpoint_target: str | None = None,
        name: str = "custom",
        description: str = "",
        tp_plan: Mapping[str, Any] | None = None,
    ) -> Workload:
        """Wrap a user's own model: `model_fn()` builds it, `loss_fn(output, batch)` scores it.

        Data comes from `batch_fn(batch_size)` / `batch_fn(batch_size, generator)` (whole
        synthetic batches) or `dataset_fn()` / `dataset_fn(seed)` (a map-style dataset of samples).
        Without `forward_fn` a dict batch is fed as `model(**batch)`; without `loss_fn` the
        output's own `loss` (attribute or key) is the loss — the Hugging Face conventions.
        `tp_plan` says how tensor_parallel splits the model (see `Workload.tp_plan`).
        """
        ds_fn = _accepting_seed(dataset_fn) if dataset_fn is not None else None
        return cls(
            name=name,
            model_fn=model_fn,
            loss_fn=loss_fn or output_loss,
            batch_size=batch_size,
            dataset_fn=ds_fn,
            batch_fn=_accepting_generator(batch_fn) if batch_fn is not None else None,
            forward_fn=forward_fn or default_forward,
            collate_fn=collate_fn,
            checkpoint_target=checkpoint_target,
            description=description,
            tp_plan=tp_plan,
        )

    # --- data ---------------------------------------------------------------------

    def effective_batch_size(self, config: TrainConfig) -> int:
        return config.batch_size or self.batch_size

    def make_dataset(self, config: TrainConfig) -> Dataset[Any]:
        if self.batch_fn is not None:
            return cast("Dataset[Any]", BatchFnDataset(self.batch_fn, self.effective_batch_size(config), config.seed))
        assert self.dataset_fn is not None
        if config.uint8_images:
            if self.uint8_images is None:
                raise WorkloadError(
                    f"workload '{self.name}' has no uint8 path for its images; drop uint8_images "
                    "(bev-perception with extra.camera_files=true has one)"
                )
            return self.uint8_images.dataset_fn(config.seed)
        return self.dataset_fn(config.seed)

    def make_loader(self, config: TrainConfig, timed_stages: bool = False) -> DataLoader[Any]:
        """A deterministic DataLoader with the config's loader settings (same seed → same batches).

        `timed_stages`: each item is `(batch, BatchStages)`, the samples' stage times and the
        collate's taken where they ran (`workloads.stages`); for a dataset of samples only."""
        import torch
        from torch.utils.data import DataLoader, IterableDataset

        from workbench.device import pin_memory_supported
        from workbench.workloads.stages import TimedCollate, TimedSamples

        dataset = self.make_dataset(config)
        collate_fn = self.collate_fn
        if timed_stages:
            if self.batch_fn is not None or isinstance(dataset, IterableDataset):
                raise WorkloadError(f"workload '{self.name}': stage times need a map-style dataset of samples")
            dataset, collate_fn = cast("Dataset[Any]", TimedSamples(dataset)), TimedCollate(collate_fn)
        kwargs: dict[str, Any] = {
            "num_workers": config.num_workers,
            "pin_memory": config.pin_memory and pin_memory_supported(),
            "shuffle": False,  # order is part of determinism; the data are synthetic anyway
        }
        if config.num_workers > 0:
            # Loader workers started by spawn or forkserver (macOS, Python >= 3.14, a notebook that set
            # it) re-pickle the dataset with the standard pickler, which cannot find a class defined in
            # a notebook or script (the trial worker's __main__ is not the user's): ship it by value.
            if not isinstance(dataset, IterableDataset):  # the loader treats those by their type
                dataset = cast("Dataset[Any]", ShippedByValue(dataset))
            collate_fn = ShippedByValue(collate_fn) if collate_fn is not None else None
            kwargs["persistent_workers"] = config.persistent_workers
            if config.prefetch_factor is not None:
                kwargs["prefetch_factor"] = config.prefetch_factor
            kwargs["generator"] = torch.Generator().manual_seed(config.seed)
        if self.batch_fn is not None:
            return DataLoader(dataset, batch_size=None, **kwargs)
        return DataLoader(
            dataset,
            batch_size=self.effective_batch_size(config),
            drop_last=True,
            collate_fn=collate_fn,
            **kwargs,
        )

    def batches(self, config: TrainConfig, timed_stages: bool = False) -> Iterator[Batch]:
        """Endless batches: the loader is iterated again when it runs out (`timed_stages`: see `make_loader`)."""
        loader = self.make_loader(config, timed_stages)
        while True:
            produced = False
            for batch in loader:
                produced = True
                yield batch
            if not produced:
                raise WorkloadError(
                    f"workload '{self.name}' produced no batch: its dataset has fewer samples than one batch "
                    f"({self.effective_batch_size(config)}); lower batch_size or enlarge the dataset"
                )

    def samples_in(self, batch: Batch) -> int:
        """Samples in a batch: the leading dimension of its first tensor."""
        tensor = _first_tensor(batch)
        if tensor is None or tensor.dim() == 0:
            raise WorkloadError(f"workload '{self.name}': cannot count samples in a batch without a batched tensor")
        return int(tensor.shape[0])

    def describe(self) -> str:
        preset = f" [{self.preset}]" if self.preset else ""
        return f"{self.name}{preset}"


class BatchFnDataset:
    """Item i is `batch_fn(batch_size, generator seeded by (seed, i))`: reproducible whole batches."""

    def __init__(self, batch_fn: BatchFn, batch_size: int, seed: int, length: int = 1_000_000) -> None:
        self.batch_fn, self.batch_size, self.seed, self.length = batch_fn, batch_size, seed, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Batch:
        import torch

        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return self.batch_fn(self.batch_size, generator)


class ShippedByValue:
    """A dataset or callable that pickles itself with cloudpickle: DataLoader workers started by
    spawn or forkserver then rebuild it whatever module its class lives in (a forked worker never
    pickles it). Indexing and calls pass straight through."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        import cloudpickle

        return _unship, (cloudpickle.dumps(self.inner),)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: Any) -> Any:
        return self.inner[index]

    def __getitems__(self, indices: list[Any]) -> Any:
        fetch = getattr(self.inner, "__getitems__", None)
        return fetch(indices) if fetch is not None else [self.inner[i] for i in indices]

    def __call__(self, *args: Any) -> Any:
        return self.inner(*args)


def _unship(payload: bytes) -> Any:
    import cloudpickle

    return cloudpickle.loads(payload)


def move_batch(batch: Batch, device: torch.device | str, non_blocking: bool = False) -> Batch:
    """Copy every tensor in a (nested) batch to `device`."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return {k: move_batch(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [move_batch(v, device, non_blocking) for v in batch]
        return type(batch)(moved) if not hasattr(batch, "_fields") else type(batch)(*moved)
    return batch


def map_tensors(batch: Batch, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    """Apply `fn` to every tensor in a (nested) batch."""
    import torch

    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {k: map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        mapped = [map_tensors(v, fn) for v in batch]
        return type(batch)(mapped) if not hasattr(batch, "_fields") else type(batch)(*mapped)
    return batch


def _first_tensor(batch: Batch) -> torch.Tensor | None:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    for value in values:
        found = _first_tensor(value)
        if found is not None:
            return found
    return None


def _accepting_generator(batch_fn: Callable[..., Batch]) -> BatchFn:
    """Let users pass `batch_fn(batch_size)` or `batch_fn(batch_size, generator)`; refuse any other
    signature here, not deep inside the DataLoader."""
    if not callable(batch_fn):
        raise WorkloadError(f"batch_fn must be a callable, got {type(batch_fn).__name__}")
    expected = "batch_fn(batch_size) or batch_fn(batch_size, generator), returning one whole batch"
    try:
        signature = inspect.signature(batch_fn)
    except (TypeError, ValueError):
        return batch_fn  # a builtin or C callable: nothing to inspect, take it as the two-argument form
    for arguments in ((0, None), (0,)):
        try:
            signature.bind(*arguments)
        except TypeError:
            continue
        return batch_fn if len(arguments) == 2 else _IgnoringGenerator(batch_fn)
    raise WorkloadError(f"batch_fn{signature} has the wrong signature: expected {expected}")


class _IgnoringGenerator:
    """`batch_fn(batch_size)` seen as `batch_fn(batch_size, generator)`. It draws from torch's global
    generator, so that one is seeded from the batch's own for the call: the same seed still gives
    the same batches, which the numerics check between configurations relies on."""

    def __init__(self, batch_fn: Callable[[int], Batch]) -> None:
        self.batch_fn = batch_fn

    def __call__(self, batch_size: int, generator: torch.Generator) -> Batch:
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(generator.initial_seed())
            return self.batch_fn(batch_size)

    def __repr__(self) -> str:
        return repr(self.batch_fn)


def _accepting_seed(dataset_fn: Callable[..., Dataset[Any]]) -> Callable[[int], Dataset[Any]]:
    """Let users pass `dataset_fn()` or `dataset_fn(seed)`."""
    try:
        takes_seed = len(inspect.signature(dataset_fn).parameters) >= 1
    except (TypeError, ValueError):
        takes_seed = False
    if takes_seed:
        return dataset_fn
    return lambda seed: dataset_fn()
