"""The paste-able plain-PyTorch snippet: header, imports, helpers and sections, from the levers.

The snippet is generated text, not a copy of `workbench.levers`: users paste it into
their own training scripts, so it must not import workbench and should hold only what the
config turns on. The price is a second implementation of each toggle; tests run the snippet
on a model of their own and check every toggle on the user's objects to keep the two equal.
"""

from __future__ import annotations

import json
import re
from typing import Any

from workbench.config import ConfigError, TrainConfig, field_doc
from workbench.export.command import cli_text
from workbench.export.nvtx import NVTX_RANGE, with_nvtx_ranges
from workbench.levers import registry
from workbench.levers.fragment import Snippet, call, comment, q

_DEVICE = re.compile(r"[a-z]+(:[0-9]+)?")


def to_snippet(config: TrainConfig, *, device: str = "cuda", nvtx: bool = False) -> str:
    """Plain-PyTorch code applying `config` to the user's own model, optimizer, data and loop.

    The snippet defines `optimize_model`, `make_optimizer`, `make_loader` and `train_step`
    (plus `make_graphed_step` under CUDA graphs); each lever adds its part, in the registry's
    order (the order `build()` applies them), and this function lays the sections out with a
    header listing the config and a usage example. `nvtx=True` wraps the step and each phase
    of `train_step` in NVTX ranges (Nsight Systems shows them; no-ops off CUDA).
    """
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise ConfigError(f"device must be a device string such as 'cuda', 'cuda:1' or 'cpu', got {device!r}")
    snippet = Snippet(device=device, imports={"import torch", "from torch import nn", "from typing import Any"})
    snippet.imports.add("from collections.abc import Callable, Mapping, Sequence")
    snippet.constants += [f"DEVICE = torch.device({q(device)})", f"SEED = {config.seed}"]
    snippet.statements.append(
        "# The measured run's seed: equal initial weights and data order. Keep this line above\n"
        "# the one that builds your model.\n"
        "torch.manual_seed(SEED)"
    )
    for lever in registry.LEVERS:
        if lever.snippet is not None:
            lever.snippet(config, snippet)
    snippet.constants += [
        "",
        "# A micro-batch is a tensor, an (inputs, targets, ...) tuple or a dict of the model's",
        "# keyword arguments (Hugging Face style), nested freely: the workbench's convention.",
        "Batch = Any",
        "LossFn = Callable[[Any, Batch], torch.Tensor]  # loss_fn(output, batch)",
        "ForwardFn = Callable[[nn.Module, Batch], Any]  # forward_fn(model, batch)",
    ]
    snippet.imports.add("from torch.utils.data import DataLoader, Dataset")
    snippet.functions += [*snippet.helpers, _optimize_model(snippet), snippet.make_optimizer, _make_loader(snippet)]
    snippet.functions += _BATCH_HELPERS
    if nvtx:
        snippet.imports.add("from contextlib import nullcontext")
        snippet.functions += [NVTX_RANGE, with_nvtx_ranges(_train_step(snippet))]
    else:
        snippet.functions.append(_train_step(snippet))
    if snippet.graphed_step:
        snippet.functions.append(snippet.graphed_step)
    return snippet.text(_header(config, device))


def _header(config: TrainConfig, device: str) -> list[str]:
    """Comment lines: what this is, the config (one entry per non-default field) and usage."""
    lines = [
        "# Training step exported from the PyTorch training workbench. Plain PyTorch: paste",
        f"# it into your training script. Exported for device {q(device)}.",
        "#",
    ]
    changed = TrainConfig().diff(config)
    if not changed:
        lines.append("# Configuration: PyTorch defaults (fp32, eager, AdamW, no loader workers).")
    else:
        lines.append("# Configuration (the fields that differ from PyTorch defaults):")
    for name, (_, value) in changed.items():
        shown = json.dumps(value) if name == "extra" else cli_text(value)
        what = _what(name, value, config)
        if name == "pin_memory" and not device.startswith("cuda"):
            what += "; left out here: it only speeds up copies to a GPU"
        lines += comment(f"{name}={shown}: {what}", indent="#   ", rest="#       ")
    model = "optimize_model(MyModel())"
    if config.activation_checkpointing != "off" and config.checkpoint_target == "auto":
        model = 'optimize_model(MyModel(), checkpoint_target="MyBlock")'
    batch_size = "" if config.batch_size is not None else ", batch_size=32"
    lines += [
        "#",
        "# Usage, with your model, dataset and loss function:",
        f"#     model = {model}",
        "#     optimizer = make_optimizer(model)  # after optimize_model",
        f"#     loader = make_loader(my_dataset{batch_size})",
    ]
    get = "[next(data) for _ in range(GRAD_ACCUMULATION)]"
    step = "train_step(model, optimizer, batches, loss_fn)"
    lines.append("#     # loss_fn(output, batch); leave it out when the model returns its own loss")
    if config.cuda_graphs:
        lines += [
            "#     first = list(itertools.islice(loader, GRAD_ACCUMULATION))",
            "#     graphed_step = make_graphed_step(model, optimizer, first, loss_fn)",
        ]
        step = "graphed_step(batches)"
    lines += [
        "#     for epoch in range(num_epochs):",
        "#         data = iter(loader)",
        "#         for _ in range(len(loader) // GRAD_ACCUMULATION):",
        f"#             batches = {get}",
        f"#             loss = {step}",
    ]
    return lines


def _what(name: str, value: Any, config: TrainConfig) -> str:
    """What a non-default field does, said for its value by its lever; the field's docstring otherwise."""
    owner = next((lever for lever in registry.LEVERS if name in lever.fields), None)
    what = owner.describe(name, value, config) if owner is not None and owner.describe is not None else None
    return what or _NOT_LEVERS.get(name) or field_doc(name)


#: The words for the fields no lever owns (they say what is trained, not how fast).
_NOT_LEVERS = {
    "lr": "learning rate",
    "seed": "seed of the initial weights and the data order",
    "extra": "options of the workbench's workload; not part of the training step",
}


def _optimize_model(snippet: Snippet) -> str:
    """`optimize_model`: the move to DEVICE, then each lever's model step in registry order."""
    params = "".join(f", {param}" for param in snippet.model_params)
    signature = f"def optimize_model(model: nn.Module{params}) -> nn.Module:"
    doc = ['    """Move `model` to DEVICE and apply the measured model optimizations.', "", *snippet.model_doc]
    doc += ["    Call it before make_optimizer: the optimizer must hold the final parameters.", '    """']
    body = [*snippet.model_move, *snippet.model_steps]
    if snippet.model_return:
        body += snippet.model_return
    elif snippet.model_steps:
        body.append("    return model")
    else:  # nothing after the move: return it directly
        body[-1] = body[-1].replace("model = ", "return ", 1)
    return "\n".join([signature, *doc, *body])


def _make_loader(snippet: Snippet) -> str:
    """`make_loader`: DataLoader with the measured batch size and the levers' loader arguments."""
    args = ["dataset", "batch_size=batch_size", "shuffle=True", "collate_fn=collate_fn", *snippet.loader_args]
    args.append("generator=torch.Generator().manual_seed(SEED)")
    lines = [
        "def make_loader(",
        "    dataset: Dataset,",
        f"    batch_size: int{snippet.loader_batch_default},",
        "    collate_fn: Callable[[list[Any]], Batch] | None = None,",
        ") -> DataLoader:",
        '    """Micro-batches with the measured loader settings, shuffled in SEED\'s order.',
        "",
        "    collate_fn: as your own loader's (e.g. images stacked, per-image labels as a list).",
        '    """',
    ]
    return "\n".join([*lines, *call("return DataLoader", args, indent=4, explode=True)])


def _train_step(snippet: Snippet) -> str:
    """`train_step`: one optimizer step over the micro-batches, with the levers' contexts."""
    lines = [
        "def train_step(",
        "    model: nn.Module,",
        "    optimizer: torch.optim.Optimizer,",
        "    batches: Sequence[Batch],",
        "    loss_fn: LossFn = output_loss,",
        "    forward_fn: ForwardFn = forward,",
        ") -> torch.Tensor:",
        '    """One optimizer step over GRAD_ACCUMULATION micro-batches; returns their mean loss.',
        "",
        "    The loss stays on the device: reading it (.item()) makes the host wait for it.",
        '    """',
        "    optimizer.zero_grad(set_to_none=True)",
        "    losses = []",
        "    for batch in batches:",
        *(f"        {line}" for line in [*snippet.to_device, *snippet.batch_lines]),
    ]
    indent = "        "
    for comments, context in snippet.micro_contexts:
        lines += [*(indent + line for line in comments), f"{indent}with {context}:"]
        indent += "    "
    inner = indent
    for comments, context in snippet.forward_contexts:
        lines += [*(inner + line for line in comments), f"{inner}with {context}:"]
        inner += "    "
    lines.append(f"{inner}loss = loss_fn(forward_fn(model, batch), batch)")
    lines += [
        f"{indent}# Dividing by the micro-batch count makes the accumulated gradient the mean",
        f"{indent}# over all micro-batches, as one big batch would give.",
    ]
    inner = indent
    for context in snippet.backward_contexts:
        lines.append(f"{inner}with {context}:")
        inner += "    "
    lines += [f"{inner}{snippet.backward}", "        losses.append(loss.detach())"]
    lines += [f"    {line}" for line in snippet.optimizer_step]
    lines.append("    return torch.stack(losses).mean()")
    return "\n".join(lines)


#: default forward (a dict batch is the model's keyword arguments) and the model's own loss.
_BATCH_HELPERS = [
    """def map_tensors(batch: Batch, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    \"\"\"Apply fn to every tensor of a nested batch (tensors, tuples, lists, dicts).\"\"\"
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {key: map_tensors(value, fn) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        items = [map_tensors(value, fn) for value in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch""",
    """def tensors_of(batch: Batch) -> list[torch.Tensor]:
    \"\"\"The tensors of a nested batch, in a fixed order.\"\"\"
    found: list[torch.Tensor] = []
    map_tensors(batch, lambda tensor: found.append(tensor) or tensor)
    return found""",
    """def to_device(batch: Batch, non_blocking: bool = False, copy: bool = False) -> Batch:
    \"\"\"Every tensor of a nested batch on DEVICE.\"\"\"
    return map_tensors(
        batch, lambda tensor: tensor.to(DEVICE, non_blocking=non_blocking, copy=copy)
    )""",
    """def forward(model: nn.Module, batch: Batch) -> Any:
    \"\"\"model(**batch) for a dict, model(batch[0]) for an (inputs, targets, ...)
    tuple, model(batch) for a tensor. For anything else, pass your own forward_fn.\"\"\"
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(batch[0])
    return model(batch)""",
    """def output_loss(output: Any, batch: Batch) -> torch.Tensor:
    \"\"\"The model's own loss, output.loss or output["loss"]: the default loss_fn (Hugging
    Face models given labels return one).\"\"\"
    if isinstance(output, Mapping):
        loss = output.get("loss")
    else:
        loss = getattr(output, "loss", None)
    if loss is None:
        raise ValueError("the model returned no loss: pass loss_fn(output, batch)")
    return loss""",
]
