"""docs/notebooks/explore_addition.ipynb executes top to bottom on gemma-3-270m (integration tier).

Cross-cutting (the notebook test): the notebook walks load -> data -> path patching -> knockout ->
attention -> probes -> report through circuits, patching and experiments."""

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "notebooks" / "explore_addition.ipynb"


def test_notebook_is_valid_and_has_no_stored_outputs():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs for c in code), "commit the notebook without outputs"
    source = "\n".join(c.source for c in code)
    for step in ("load_model", "make_dataset", "path_patch", "knockout_curve", "attention_reads", "probe_mlps", "run_report"):
        assert step in source


@pytest.mark.integration
def test_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("EXPLORE_N_PROMPTS", "6")
    monkeypatch.setenv("EXPLORE_OUT", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parents[2])}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    plots = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {}) or
             "plotly" in str(o.get("data", {}).get("text/html", ""))]
    assert len(plots) >= 5, "figures should display inline"
    assert any("CircuitsVis" in str(o.get("data", {}).get("text/html", "")) for o in outputs)
    assert (tmp_path / "report.html").stat().st_size > 100_000
