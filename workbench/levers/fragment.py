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


@dataclass
class Snippet:
    """The pieces of a snippet, collected by the section builders, assembled by `text()`."""

    imports: set[str] = field(default_factory=set)
    constants: list[str] = field(default_factory=list)
    statements: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)

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
