"""The environment a result was measured in, so results are only compared with comparable ones."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Any


def environment_fingerprint(device: Any = None) -> dict[str, Any]:
    """torch/CUDA versions, device name and count, host, Python, and the git commit of the cwd (if any)."""
    import torch

    from workbench.device import device_info

    info = device_info(device)
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "device_type": info.type,
        "device_name": info.name,
        "device_count": info.count,
        "cpu_cores": info.cpu_cores,
        "host": platform.node(),
        "platform": sys.platform,
        "git_commit": git_commit(),
    }


def git_commit(path: str | None = None) -> str | None:
    """HEAD of the repository containing `path` (default: cwd), '+dirty' when modified; None outside git."""
    cwd = path or os.getcwd()
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=False
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
