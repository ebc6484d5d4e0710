"""Errors raised by the user's own code, told as theirs: their frame and message first.

A trial that fails in the user's model carries the whole traceback (in its JSON and the
run history), most of it PyTorch's and ours. A person wants the line of *their* file that
raised and the message; the rest is one `--verbose` away. The traceback often arrives as
text (from a worker process), so frames are read from the text as well as from exceptions.
"""

from __future__ import annotations

import functools
import re
import sysconfig
import traceback
from dataclasses import dataclass
from pathlib import Path

_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_HINT = "(run with --verbose for the full traceback)"


@dataclass(frozen=True)
class UserFrame:
    filename: str
    lineno: int
    function: str
    code: str

    def describe(self) -> str:
        where = f"{self.filename}:{self.lineno} in {self.function}"
        return f"{where}: {self.code}" if self.code else where


def is_library_file(filename: str) -> bool:
    """Ours, PyTorch's, the standard library's, an installed package's, or frozen/generated code."""
    if filename.startswith("<"):
        return True
    path = str(Path(filename).resolve())
    return any(path.startswith(root + "/") for root in _library_roots()) or "/site-packages/" in path


def user_frame(exc: BaseException) -> UserFrame | None:
    """The innermost frame of `exc`'s traceback that is the user's code (None if there is none)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not is_library_file(f.filename)]
    if not frames:
        return None
    last = frames[-1]
    return UserFrame(last.filename, last.lineno or 0, last.name, (last.line or "").strip())


def user_frame_in_text(text: str) -> UserFrame | None:
    """The same, read from a formatted traceback (the way a worker process reports it)."""
    lines = text.splitlines()
    found: UserFrame | None = None
    for index, line in enumerate(lines):
        match = _FRAME.match(line)
        if match and not is_library_file(match["file"]):
            code = lines[index + 1].strip() if index + 1 < len(lines) and not _FRAME.match(lines[index + 1]) else ""
            found = UserFrame(match["file"], int(match["line"]), match["func"], code)
    return found


def brief_error(message: str, verbose: bool = False) -> str:
    """A failed trial's message for a person: 'Type: message', then where in their code; the
    whole text when `verbose` or when there is no traceback to shorten."""
    text = message.strip()
    if verbose or "Traceback (most recent call last)" not in text:
        return text
    headline = text.split("\n\n", 1)[0].strip()
    frame = user_frame_in_text(text)
    where = f"\n  in your code: {frame.describe()}" if frame else ""
    return f"{headline}{where}\n{_HINT}"


@functools.cache
def _library_roots() -> list[str]:
    import importlib.util

    roots = [str(Path(__file__).resolve().parent)]  # this package
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.append(str(Path(path).resolve()))
    torch_spec = importlib.util.find_spec("torch")  # found, not imported: the CLI may not need torch
    if torch_spec is not None and torch_spec.origin:
        roots.append(str(Path(torch_spec.origin).resolve().parent))
    return roots
