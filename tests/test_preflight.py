"""scripts/gpu-check's preflight: it names the package a GPU image lacks, before any trial fails on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _preflight(extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    path = [str(extra_path)] if extra_path else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "workbench.preflight"], env=env, capture_output=True, text=True, timeout=120
    )


def test_preflight_passes_where_everything_imports() -> None:
    done = _preflight()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "preflight: ok" in done.stdout


def test_preflight_names_the_missing_package_and_fails(tmp_path: Path) -> None:
    # A module that shadows cloudpickle and fails to import, as on an image without it.
    (tmp_path / "cloudpickle.py").write_text("raise ImportError('No module named cloudpickle')\n")
    done = _preflight(tmp_path)
    assert done.returncode == 1
    assert "missing 'cloudpickle'" in done.stdout and "isolated trial" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_gpu_check_is_valid_bash() -> None:
    done = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu-check")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
