"""Every notebook under docs/ runs top to bottom on the CPU (nbclient), and is committed without outputs."""
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
NOTEBOOKS = sorted(DOCS.rglob("*.ipynb"))


def test_there_are_notebooks():
    assert {p.stem for p in NOTEBOOKS} >= {"tour", "kernels", "mi350"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name}: strip the outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path):
    """A cell that raises (a failed check against torch included) fails the test, naming the cell."""
    nb = nbformat.read(path, as_version=4)
    # the kernel inherits this process's environment: conftest's private FLYARRAY_CACHE_DIR included
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp_path}})
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert outputs and not [o for o in outputs if o.output_type == "error"]
