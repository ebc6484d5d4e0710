"""Check that the packages a headless GPU run needs import, before anything else starts.

A GPU image lacking one fails far from the cause (every isolated trial imports cloudpickle in
its worker), so `scripts/gpu-check` asks first and names what is missing. Standard library
only: this must run where the workbench itself would not import.

    python -m workbench.preflight
"""

from __future__ import annotations

import importlib
import sys

#: Module → why the headless engine (CLI, trials, GPU tests) cannot run without it.
REQUIRED = {
    "torch": "the engine itself",
    "numpy": "statistics and results",
    "scipy": "comparison intervals",
    "cloudpickle": "every isolated trial sends its request to the worker with it",
    "psutil": "host metrics and the trial worker's process tree",
    "pytest": "the GPU tests",
}
#: Module → what is missing without it (reported, not fatal).
OPTIONAL = {
    "pynvml": "GPU utilization and NVLink figures (pip install nvidia-ml-py)",
    "triton": "torch.compile on CUDA",
}


def missing(modules: dict[str, str]) -> dict[str, str]:
    """Modules that fail to import → the first line of the reason."""
    failed: dict[str, str] = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a broken install raises anything, not only ImportError
            text = str(exc).strip().splitlines()
            failed[name] = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    return failed


def main() -> int:
    required = missing(REQUIRED)
    for name, error in missing(OPTIONAL).items():
        print(f"preflight: optional '{name}' not importable ({error}): no {OPTIONAL[name]}")
    if required:
        for name, error in required.items():
            print(f"preflight: missing '{name}' ({error}), needed for {REQUIRED[name]}")
        print(f"preflight: install {' '.join(sorted(required))} into this Python ({sys.executable}) and run again")
        return 1
    print(f"preflight: ok ({', '.join(REQUIRED)} import)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
