"""`python -m workbench.distributed.agent`: torchrun, plus a record of how each failed rank ended.

torchrun (`torch.distributed.run`, run here with its own parser and `run`) is the ranks' parent,
so only it learns each failed rank's exit code or signal; it prints them in its summary, whose
wording is not an interface. Its `ChildFailedError` carries them as data: this module writes
them as JSON to the path in `FAILURE_RECORD_ENV` before torchrun exits as it always does. The
record is {rank: {exitcode (negative: a signal), pid, timestamp, message}}, where `message` is
a rank's error file (its traceback) when torchrun had one.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.run import parse_args, run

from workbench.distributed.command import FAILURE_RECORD_ENV

_NO_TRACEBACK = "To enable traceback"
"""How torchrun's generated message for a rank without an error file begins: no traceback then."""


def failure_record(failures: dict[int, Any]) -> dict[str, dict[str, Any]]:
    """torchrun's `ProcessFailure`s by global rank, as plain data."""
    out = {}
    for rank, failure in failures.items():
        message = _text(failure.message)
        has_file = os.path.isfile(str(failure.error_file))
        out[str(rank)] = {
            "exitcode": int(failure.exitcode),
            "pid": int(failure.pid),
            "timestamp": float(failure.timestamp),
            "message": message if has_file and not message.startswith(_NO_TRACEBACK) else "",
        }
    return out


def _text(message: Any) -> str:
    """An error file's message: a string, or {'message', 'extraInfo': {'py_callstack', ...}}."""
    if isinstance(message, dict):
        info = message.get("extraInfo") or {}
        return str(info.get("py_callstack") or message.get("message") or "")
    return str(message or "")


def write_record(path: str, failures: dict[int, Any]) -> None:
    """Write atomically: the launcher reads the file as soon as this process has exited."""
    partial = f"{path}.partial"
    with open(partial, "w") as fh:
        json.dump(failure_record(failures), fh)
    os.replace(partial, path)


@record
def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(list(argv) if argv is not None else sys.argv[1:])
    try:
        run(args)
    except ChildFailedError as exc:
        path = os.environ.get(FAILURE_RECORD_ENV)
        if path:
            write_record(path, exc.failures)
        raise


if __name__ == "__main__":
    main()
