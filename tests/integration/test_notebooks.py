"""The notebooks run from top to bottom (their cells assert what they show), and are committed without
outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = ["quickstart", "exactness"]


def test_notebooks_are_committed_clean():
    import nbformat

    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == sorted(NAMES)
    for name in NAMES:
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        nbformat.validate(nb)
        assert nb.metadata["kernelspec"]["name"] == "python3"
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{name}: outputs committed"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    # the working folder of the kernel is tmp_path: the notebooks write their run folders under ./outputs/
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    # raises CellExecutionError, with the cell and its traceback, when a cell (or its asserts) fails
    client.execute()
    images = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})
    ]
    assert len(images) == 1  # the loss curve (quickstart) or the two-panel comparison (exactness)
