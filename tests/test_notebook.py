"""``examples/quickstart.ipynb`` runs from its first cell to its last in a real kernel:
spec, run, result, plots, export, predict through the Python API."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


def text_of(cell) -> str:
    """What a code cell printed or showed as text."""
    out = []
    for o in cell.get("outputs", []):
        out.append(o.get("text", "") if o["output_type"] == "stream" else o.get("data", {}).get("text/plain", ""))
    return "".join(out)


@pytest.mark.ray  # the notebook's kernel starts an embedded Ray
@pytest.mark.timeout(900)
def test_the_quickstart_notebook_trains_exports_and_predicts(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    (params,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    params.source = f"ROWS = 40_000\nWORK = {str(tmp_path)!r}"
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    printed = "\n".join(text_of(c) for c in nb.cells if c.cell_type == "code")
    assert ": succeeded, auc 0." in printed and " 0 lost" in printed, printed[-3000:]
    assert any(o.get("data", {}).get("image/png") for c in nb.cells for o in c.get("outputs", [])), "no plot"
    assert "scored 5,000 rows" in printed
    assert (tmp_path / "model" / "model.json").is_file() and len((tmp_path / "scores.csv").read_text().splitlines()) == 5001
