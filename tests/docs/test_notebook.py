"""docs/notebooks/explore_addition.ipynb and docs/notebooks/edge_circuit.ipynb execute top to bottom on
gemma-3-270m (integration tier), and are committed valid and without outputs (unit tier).

Cross-cutting (the notebook test): the first notebook walks load -> data -> path patching -> knockout ->
attention -> probes -> report through circuits, patching and experiments; the second the edge half, load ->
data -> learned circuit -> explorer -> stability -> IIA of its nodes -> precise SFT of its heads -> explorer again."""

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "notebooks" / "explore_addition.ipynb"
EDGE_NOTEBOOK = NOTEBOOK.with_name("edge_circuit.ipynb")
#: the edge notebook's small settings for the test (about 2 minutes on a 2-core CPU)
EDGE_SETTINGS = {"EDGE_N_PROMPTS": "32", "EDGE_CIRCUIT_PROMPTS": "8", "EDGE_METHOD": "EAP", "EDGE_N_PAIRS": "32",
                 "EDGE_TUNE_STEPS": "2"}


def test_notebook_is_valid_and_has_no_stored_outputs():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs for c in code), "commit the notebook without outputs"
    source = "\n".join(c.source for c in code)
    for step in ("load_model", "make_dataset", "path_patch", "knockout_curve", "attention_reads", "probe_mlps", "run_report"):
        assert step in source


def executed_outputs(notebook: Path, env: dict, monkeypatch) -> list:
    """The outputs of ``notebook`` run top to bottom offline (nbclient, from the repository root) with ``env``
    set; none of them an error."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    for name, value in (env | {"HF_HUB_OFFLINE": "1"}).items():
        monkeypatch.setenv(name, value)
    nb = nbformat.read(notebook, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(notebook.parents[2])}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    return outputs


@pytest.mark.integration
def test_notebook_executes(tmp_path, monkeypatch):
    outputs = executed_outputs(NOTEBOOK, {"EXPLORE_N_PROMPTS": "6", "EXPLORE_OUT": str(tmp_path)}, monkeypatch)
    plots = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {}) or
             "plotly" in str(o.get("data", {}).get("text/html", ""))]
    assert len(plots) >= 5, "figures should display inline"
    assert any("CircuitsVis" in str(o.get("data", {}).get("text/html", "")) for o in outputs)
    assert (tmp_path / "report.html").stat().st_size > 100_000


def test_edge_notebook_is_valid_and_has_no_stored_outputs():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(EDGE_NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code), \
        "commit the notebook without outputs"
    source = "\n".join(c.source for c in code)
    for step in ("load_model", "make_dataset", "find_faithful_circuit", "circuit_explorer", "stability_of_found",
                 "compare=stability.scores[1]", "node_table", "iia_info", 'method="precise"', "compare=tuned_scores"):
        assert step in source, step
    for name in EDGE_SETTINGS:  # every setting the test lowers is read from the environment
        assert f'os.environ.get("{name}"' in source, name


@pytest.mark.integration
def test_edge_notebook_executes(monkeypatch):
    outputs = executed_outputs(EDGE_NOTEBOOK, EDGE_SETTINGS, monkeypatch)
    pages = [o for o in outputs if "circuit-explorer" in str(o.get("data", {}).get("text/html", ""))]
    assert len(pages) == 4, "the circuit, the two sets compared, the IIA hover and before/after tuning"
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "IIA of a at END" in text and "Jaccard" in text and "steps on" in text
    assert "IIA a: " in str(pages[2]["data"]["text/html"])  # the hover carries what the heads carry
