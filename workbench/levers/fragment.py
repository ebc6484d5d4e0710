"""The exported snippet's sections, and the text helpers lever fragments write them with.

A lever's `snippet(config, snippet)` adds its imports, constants, statements, helper functions
and lines to these sections; `workbench.export.snippet` assembles them. The generated code must
read as a careful user would write it: ruff-formatted, within LINE_LENGTH, imports sorted.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field

LINE_LENGTH = 88
"""Generated lines fit ruff's and black's default width: code that users paste lands in
projects with the strictest common setting."""


Context = tuple[list[str], str]
"""Comment lines, then the expression of a `with` block (e.g. 'torch.autocast(...)')."""


@dataclass
class Snippet:
    """The sections of a snippet: levers add to them, `export.snippet` lays them out.

    Top level: `imports`, `constants`, `statements` and `helpers` (lever functions). The
    functions the user calls are built from their own sections: `optimize_model` (the model
    steps, in registry order), `make_optimizer`, `make_loader` (its arguments) and `train_step`
    (batch lines, contexts around each micro-batch and its forward, the backward call and its
    contexts, the optimizer step).
    """

    device: str = "cuda"
    imports: set[str] = field(default_factory=set)
    constants: list[str] = field(default_factory=list)
    statements: list[str] = field(default_factory=list)
    helpers: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    model_params: list[str] = field(default_factory=list)
    """Extra parameters of optimize_model, with their docstring lines in `model_doc`."""
    model_doc: list[str] = field(default_factory=list)
    model_move: list[str] = field(default_factory=lambda: ["    model = model.to(DEVICE)"])
    model_steps: list[str] = field(default_factory=list)
    model_return: list[str] = field(default_factory=list)
    """The lines that return the finished model (compile's), when a lever wraps it."""
    make_optimizer: str = ""
    loader_args: list[str] = field(default_factory=list)
    loader_batch_default: str = ""
    to_device: list[str] = field(default_factory=lambda: ["batch = to_device(batch)"])
    batch_lines: list[str] = field(default_factory=list)
    micro_contexts: list[Context] = field(default_factory=list)
    """Around each micro-batch's forward and backward (a forced SDPA kernel)."""
    forward_contexts: list[Context] = field(default_factory=list)
    """Around the forward and loss only (autocast)."""
    backward: str = "(loss / len(batches)).backward()"
    backward_contexts: list[str] = field(default_factory=list)
    optimizer_step: list[str] = field(default_factory=lambda: ["optimizer.step()"])
    graphed_step: str = ""

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def text(self, header: list[str]) -> str:
        blocks = [
            "\n".join(header),
            import_block(self.imports),
            "\n".join(self.constants),
            "\n\n".join(self.statements),
            *self.functions,
        ]
        # One blank line after the imports (isort's rule before plain statements), two
        # between the other top-level blocks (pycodestyle's rule around functions).
        rest = "\n\n\n".join(block for block in blocks[3:] if block)
        return f"{blocks[0]}\n\n{blocks[1]}\n\n{blocks[2]}\n\n\n{rest}\n"


def q(text: str) -> str:
    """A double-quoted Python string literal (ruff format's quote style)."""
    return json.dumps(text)


def comment(text: str, indent: str, rest: str | None = None) -> list[str]:
    """`text` as comment lines of at most LINE_LENGTH characters."""
    return textwrap.wrap(
        text, LINE_LENGTH, initial_indent=indent, subsequent_indent=rest or indent, break_on_hyphens=False
    )


def call(head: str, args: list[str], indent: int, explode: bool = False) -> list[str]:
    """`head(args)` laid out as ruff format would: one line, one indented line, or one per line.

    An argument may end in a `  # comment`; comments (and `explode`) force one per line.
    """
    pad = " " * indent
    plain = ", ".join(args)
    commented = any("  # " in arg for arg in args)
    if not commented and not explode:
        if len(f"{pad}{head}({plain})") <= LINE_LENGTH:
            return [f"{pad}{head}({plain})"]
        if len(f"{pad}    {plain}") <= LINE_LENGTH:
            return [f"{pad}{head}(", f"{pad}    {plain}", f"{pad})"]
    lines = [f"{pad}{head}("]
    for arg in args:
        code, _, note = arg.partition("  # ")
        lines.append(f"{pad}    {code},{'  # ' + note if note else ''}")
    return [*lines, f"{pad})"]


def import_block(imports: set[str]) -> str:
    """Standard-library imports, a blank line, then torch's; plain `import` before `from`, sorted."""

    def order(line: str) -> tuple[bool, str]:
        return (line.startswith("from "), line.split()[1])

    stdlib = sorted((line for line in imports if not is_torch(line)), key=order)
    torch = sorted((line for line in imports if is_torch(line)), key=order)
    return "\n\n".join("\n".join(group) for group in (stdlib, torch) if group)


def is_torch(line: str) -> bool:
    """torch and torchao: the snippet's third-party imports (isort's second group)."""
    return line.split()[1].split(".")[0] in ("torch", "torchao")
