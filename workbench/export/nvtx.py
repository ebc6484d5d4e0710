"""NVTX ranges for the exported `train_step`: its body in a step range, each phase in its own.

A rewrite of the generated source, not a second generator: the phases are found by the lines
that open them, so the ranges follow whatever the levers put into `train_step`.
"""

from __future__ import annotations

NVTX_RANGE = '''def nvtx_range(name: str) -> Any:
    """An NVTX range that Nsight Systems shows on its timeline; nothing off CUDA."""
    return torch.cuda.nvtx.range(name) if DEVICE.type == "cuda" else nullcontext()'''

#: `train_step` lines that open a phase: the lines from one up to the next (or the loop's end) form it.
_PHASE_STARTS = (("batch = to_device(", "data"), ("loss = loss_fn(", "forward"), ("with torch.autocast(", "forward"),
                 ("# Dividing by the micro-batch count", "backward"), ("optimizer.step()", "optimizer"),
                 ("scaler.step(optimizer)", "optimizer"))  # fmt: skip


def with_nvtx_ranges(train_step: str) -> str:
    """`train_step`'s source with its body in a `workbench::step` range and each phase in its own.

    Phase blocks are found by their first line (`_PHASE_STARTS`) and end where the next phase, a
    shallower line, or `losses.append` begins; each is re-indented under `with nvtx_range(...)`.
    """
    lines = train_step.split("\n")
    body_at = next(i for i, line in enumerate(lines) if line.strip() == "optimizer.zero_grad(set_to_none=True)")
    head, body = lines[:body_at], lines[body_at:]
    out: list[str] = []
    index = 0
    while index < len(body):
        line = body[index]
        phase = _phase_of(line)
        if phase is None:
            out.append(line)
            index += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        end = index + 1
        if phase == "backward":  # its comment lines, then the line that calls backward()
            while end < len(body) and ".backward()" not in body[end - 1]:
                end += 1
        while end < len(body) and _continues(body[end], indent, phase):
            end += 1
        out.append(f'{indent}with nvtx_range("workbench::{phase}"):')
        out += ["    " + part for part in body[index:end]]
        index = end
    step = [line for line in out if not line.lstrip().startswith("return ")]
    returns = [line for line in out if line.lstrip().startswith("return ")]
    wrapped = ['    with nvtx_range("workbench::step"):'] + ["    " + line for line in step]
    return "\n".join(head + wrapped + returns)


def _phase_of(line: str) -> str | None:
    text = line.strip()
    return next((phase for start, phase in _PHASE_STARTS if text.startswith(start)), None)


def _continues(line: str, indent: str, phase: str) -> bool:
    """Whether `line` still belongs to the phase block that opened at `indent`."""
    text = line.strip()
    if not line.startswith(indent) or text.startswith("losses.append"):
        return False
    deeper = len(line) - len(line.lstrip()) > len(indent)
    if deeper:
        return True
    return phase in ("data", "optimizer") and _phase_of(line) in (None, phase) and not text.startswith(("with ", "#"))
