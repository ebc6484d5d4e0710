"""`import workbench as wb`: the one public namespace, cheap to import, every name real and documented."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import workbench as wb


def test_importing_workbench_loads_no_torch() -> None:
    # The JupyterLab server extension and the GPU machine's preflight import the package without torch.
    code = "import sys, workbench; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_every_public_name_is_the_object_it_names_and_documented() -> None:
    assert sorted(wb.__all__) == sorted(wb._PUBLIC)
    for name in wb.__all__:
        module_name, _, attribute = wb._PUBLIC[name].partition(":")
        module = importlib.import_module(module_name)
        expected = getattr(module, attribute) if attribute else module
        assert getattr(wb, name) is expected, name
        assert (getattr(wb, name).__doc__ or "").strip(), f"wb.{name} has no docstring"


def test_tune_and_export_are_callable_although_they_are_also_subpackages() -> None:
    import workbench.export
    import workbench.tune

    assert wb.tune is workbench.tune and wb.export is workbench.export
    config = wb.TrainConfig(amp="bf16")
    assert wb.export(config, "json") == workbench.export.export_config(config, "json")
    with pytest.raises(wb.ConfigError, match="too small"):
        wb.tune("bev-perception", budget_s=-1)


def test_an_unknown_name_says_which_names_exist() -> None:
    with pytest.raises(AttributeError, match=r"public names: .*run_trial"):
        wb.run_trails  # noqa: B018


def test_run_diagnose_and_export_through_the_namespace() -> None:
    config = wb.TrainConfig(channels_last=True)
    result = wb.run_trial("bev-perception", config, steps=2, warmup=1, isolation="inline")
    assert result.ok and len(result.step_ms) == 2
    assert wb.diagnose(result).findings is not None
    assert "channels_last" in wb.export(config, "snippet")
