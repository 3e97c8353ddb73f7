"""Each notebook under notebooks/ runs top to bottom on tiny trace slices.

The notebooks read UNIKV_NB_SMALL=1 (tiny slices, a one-point sweep) and
UNIKV_NB_OUT (where their figures go). Skipped when nbclient, nbformat or
ipykernel (the `test` extra) is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _has_python3_kernel() -> bool:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        return False
    return True


def test_the_three_notebooks_exist():
    assert {p.stem for p in NOTEBOOKS} >= {"capacity_over_time", "eager_vs_lazy", "layouts_compared"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_small(path, tmp_path, monkeypatch):
    if not _has_python3_kernel():
        pytest.skip("no 'python3' Jupyter kernel (pip install ipykernel)")
    monkeypatch.setenv("UNIKV_NB_SMALL", "1")
    monkeypatch.setenv("UNIKV_NB_OUT", str(tmp_path))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=240,
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, f"{path.name} displayed no figure"
    assert list(tmp_path.rglob("*.png")), f"{path.name} wrote no figure under UNIKV_NB_OUT"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_clean_and_has_a_small_flag(path):
    """Committed without outputs, with the SMALL parameter cell."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    assert any("UNIKV_NB_SMALL" in c.source and "parameters" in c.metadata.get("tags", []) for c in code)
