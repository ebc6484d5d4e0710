"""Ranks → parent messages through one append-only file per rank in a private directory.

Why files and not a socket: every rank writes its own file (no interleaving, no accept loop,
no authentication to get right), the parent tails them with a cheap poll, and whatever a rank
wrote before it died is still there to read. The cost: ranks and parent must share a
filesystem, which holds for the one-node trials the parent launches; multi-node runs started
by `torchrun` on each node report on rank 0's stdout instead.

A message is a pickled tuple, framed by a 4-byte little-endian length. Pickle is safe here:
the directory is created 0700 by the parent, for its own children.
"""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path
from typing import Any

_HEADER = struct.Struct("<I")


def rank_file(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.msgs"


class RankWriter:
    """The rank side: `send(message)` appends one frame and flushes it to the OS at once."""

    def __init__(self, directory: str | Path, rank: int) -> None:
        self.rank = rank
        self._fd = os.open(rank_file(directory, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def send(self, message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        os.write(self._fd, _HEADER.pack(len(data)) + data)  # one write: a reader never sees half a header

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class RankReader:
    """The parent side: `read()` returns the complete frames written since the last call."""

    def __init__(self, directory: str | Path, rank: int) -> None:
        self.path = rank_file(directory, rank)
        self._buffer = b""
        self._offset = 0

    def read(self) -> list[tuple[Any, ...]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        self._buffer += chunk
        messages = []
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if len(self._buffer) < _HEADER.size + size:
                break  # the rest of this frame is still being written
            payload = self._buffer[_HEADER.size : _HEADER.size + size]
            self._buffer = self._buffer[_HEADER.size + size :]
            messages.append(pickle.loads(payload))
        return messages
