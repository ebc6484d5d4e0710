"""stdout for `workbench ... | head`: the reader may leave before the command is done."""

from __future__ import annotations

from typing import Any


class ReaderMayLeave:
    """When the reader leaves, the rest of the output is dropped and the command still exits with
    its own code (a failed trial stays exit 1, not 0)."""

    def __init__(self, stream: Any) -> None:
        self._stream, self._gone = stream, False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._leave()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._leave()

    def _leave(self) -> None:
        import os

        self._gone = True
        # Python flushes stdout once more at exit: point the descriptor at /dev/null so that
        # flush cannot fail again (the way the `signal` module's documentation advises).
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # not a real file (a test's capture): nothing to protect
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
