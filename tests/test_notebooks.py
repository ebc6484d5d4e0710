"""Every notebook in notebooks/ runs headless, top to bottom, in a fresh kernel (nbclient).

The kernel inherits this session's environment, so the shared inductor cache
(TORCHINDUCTOR_CACHE_DIR, set in conftest) makes the quickstart's compile step cheap
after the suite's first compile of the same graph. WORKBENCH_NOTEBOOK_QUICK=1 makes the notebooks
shrink their protocol budgets (each notebook's first code cell reads it), so the suite runs every
cell while a person opening a notebook still sees the defaults.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "notebooks"
NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_headless(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKBENCH_NOTEBOOK_QUICK", "1")  # the kernel inherits it
    notebook = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in notebook.cells if c.cell_type == "code"), (
        "commit notebooks without outputs"
    )
    work = tmp_path / path.name
    shutil.copy(path, work)
    client = nbclient.NotebookClient(
        notebook,
        timeout=900,  # per cell: a cold inductor compile on 2 cores takes about a minute
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    try:
        client.execute()
    finally:  # the executed copy, outputs and all, for a person to read when this fails
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, ARTIFACTS / path.name)
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors


def test_quick_setting_is_read_in_the_first_cell_only() -> None:
    """A notebook reads the quick setting in its first code cell and every quick value sits there, next
    to the default a person gets (the value after `else`), so later cells read the same either way."""
    readers = 0
    for path in NOTEBOOKS:
        cells = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        if not any("QUICK" in source for source in cells):
            continue
        readers += 1
        assert 'os.environ.get("WORKBENCH_NOTEBOOK_QUICK") == "1"' in cells[0], path.name
        assert "if QUICK else" in cells[0] and not any("QUICK" in source for source in cells[1:]), path.name
    assert readers >= 3  # the notebooks that run calibrated comparisons or a search


def test_quickstart_walks_every_lever() -> None:
    """The guided order the product promises: baseline → AMP → channels_last → compile → checkpointing."""
    source = "\n".join(c.source for c in nbformat.read(NOTEBOOKS[0], as_version=4).cells)
    order = [
        "wb.run_baseline(TrainConfig())",
        'TrainConfig(amp="bf16")',
        'TrainConfig(amp="bf16", channels_last=True)',
        'TrainConfig(amp="bf16", channels_last=True, compile="default")',
        'activation_checkpointing="full"',
        "wb.comparison",
        "wb.export",
    ]
    positions = [source.index(marker) for marker in order]
    assert positions == sorted(positions)
    assert NOTEBOOKS[0].name == "01_quickstart.ipynb"


def test_quickstart_names_the_newer_levers_with_their_costs() -> None:
    """The "More levers" section names every 2025–26 lever field, each with its requirement."""
    cells = nbformat.read(NOTEBOOKS[0], as_version=4).cells
    (section,) = [c.source for c in cells if c.cell_type == "markdown" and c.source.startswith("## More levers")]
    for lever in (
        "activation_memory_budget=",
        "compiled_autograd=",
        'attention_backend="flex"',
        "float8=",
        "activation_offload=",
    ):
        assert lever in section, lever
    assert section.count("needs `compile`") >= 3 and "compute capability 8.9+" in section
