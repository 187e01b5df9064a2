"""experiments.runtime.node_info and the explorers of the edge-circuit stage: the hover fields each run's results
give (path patching, IIA per variable), a consensus circuit's edge shares, and the compare mode of the two
stability sets, on a tiny gemma-style model."""

import dataclasses
import json

import pytest
import torch

from circuits.errors import InputError
from circuits.loading import load_model
from circuits.nodes import MLP, Head
from experiments import circuit as circuit_experiment
from experiments.runtime.edge_circuit import add_report_section, edge_circuit_stage
from experiments.runtime.node_info import iia_info, merge_node_info, path_patching_info, read_variables_rows
from circuits.show.html_report import Report
from patching.edges.catalogue import ConsensusSettings
from patching.edges.faithful_circuit import CircuitSearch
from patching.edges.learn import DEFAULT_CIRCUIT
from patching.sweeps.results import NodeScores


def _rows():
    iia = lambda v: {"value": v, "low": v - 0.1, "high": v + 0.05, "n": 40}
    return [{"variable": "a", "node": "L0H1", "position": "a_last", "iia": iia(0.84), "share_of_best": 0.9},
            {"variable": "b", "node": "L0H1", "position": "b_last", "iia": iia(0.2), "share_of_best": 0.3},
            {"variable": "a", "node": "MLP 1", "position": "a_last", "iia": iia(0.5), "share_of_best": 0.6}]


def test_path_patching_info_reads_every_scored_node_with_its_interval_and_percent():
    heads = torch.tensor([[-1.5, float("nan")], [0.25, 0.0]])
    scores = NodeScores(heads, torch.tensor([2.0, float("nan")]), "logit_diff", baseline=10.0, n_prompts=3,
                        prompt_effects={Head(0, 0): torch.tensor([-1.0, -2.0, -1.5]),
                                        MLP(0): torch.tensor([2.0, 2.0, 2.0])})
    info = path_patching_info(scores.to_dict())
    assert set(info) == {"L0H0", "L1H0", "L1H1", "MLP 0"}  # NaN (unscored) nodes are left out
    assert info["L0H0"]["path-patching effect"].startswith("-1.5 [") and "(-15.0% of the logit)" in \
        info["L0H0"]["path-patching effect"]
    assert info["L1H0"] == {"path-patching effect": "0.25 (2.5% of the logit)"}  # no per-prompt effects: no interval
    assert path_patching_info(None) == {}


def test_iia_rows_become_one_field_per_variable_and_merge_after_the_key_head_rank():
    info = iia_info(_rows())
    assert info == {"L0H1": {"IIA a": "0.84 [0.74, 0.89]", "IIA b": "0.2 [0.1, 0.25]"}, "MLP 1": {"IIA a": "0.5 [0.4, 0.55]"}}
    two_positions = iia_info(_rows() + [dict(_rows()[0], position="answer")])
    assert set(two_positions["L0H1"]) == {"IIA a at a_last", "IIA a at answer", "IIA b"}
    merged = merge_node_info({Head(0, 1): {"key-head rank (path patching)": 1}}, info, None)
    assert list(merged["L0H1"]) == ["key-head rank (path patching)", "IIA a", "IIA b"]


def test_a_variables_run_folder_is_read_and_checked(tmp_path):
    folder = tmp_path / "variables"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"circuit": {"rows": _rows()}}))
    assert read_variables_rows(folder) == _rows() == read_variables_rows(folder / "results.json")
    with pytest.raises(InputError, match=r"nothing.*does not exist; expected the results.json of a python -m "
                                         r"experiments.variables run"):
        read_variables_rows(tmp_path / "nothing")
    (folder / "results.json").write_text(json.dumps({"featurizers": {}}))
    with pytest.raises(InputError, match=r"results.json holds no per-node IIA rows \(circuit.rows\)"):
        read_variables_rows(folder)
    (folder / "results.json").write_text(json.dumps({"circuit": {"rows": [{"variable": "a", "node": 3}]}}))
    with pytest.raises(InputError, match=r"circuit.rows\[0\] is not a row of experiments.variables"):
        read_variables_rows(folder)


def test_a_consensus_circuit_shows_its_shares_and_stability_compares_the_two_sets(tiny_dir, tmp_path):
    model = load_model(str(tiny_dir), device="cpu")
    cfg = circuit_experiment.parse_config(["--model", str(tiny_dir), "--n-prompts", "60"])
    kept, _ = circuit_experiment.correct_prompts(model, cfg)
    learn = dataclasses.replace(DEFAULT_CIRCUIT, steps=2, batch_size=2, samples=2, fractions=(0.05, 0.2))
    search = CircuitSearch(method="consensus", circuit_prompts=8, learning=learn, warm_start="EAP", ig_steps=1,
                           n_bootstrap=50, method_settings=(ConsensusSettings(runs=2),))
    head = Head(1, 0)
    stage, figures = edge_circuit_stage(model, kept, [head], {head: "operand"}, search, out=tmp_path, op="+",
                                        model_name="tiny", stability_sets=2,
                                        node_info={"L1H0": {"path-patching effect": "-1.5"}, **iia_info(_rows())})
    page = figures["edge_circuit"].payload
    hover = page["nodes"]["hover"][page["nodes"]["name"].index("a1.h0")]
    assert "attention-read class: operand" in hover and "key-head rank (path patching): 1" in hover
    assert "path-patching effect: -1.5" in hover
    assert "IIA a: 0.84 [0.74, 0.89]" in page["nodes"]["hover"][page["nodes"]["name"].index("a0.h1")]
    shares = page["edges"]["share"]  # each drawn edge's share of the two runs keeping it
    assert shares and set(shares) <= {0.0, 0.5, 1.0} and 1.0 in shares
    compared = figures["edge_stability"].payload
    assert compared["labels"] == ["set 0", "set 1"] and [s["fraction"] for s in compared["sizes"]] == [0.02, 0.05, 0.1]
    jaccard = {j["fraction"]: j["mean"] for j in stage["stability"]["jaccard"]}
    assert any(s["compare"]["both"]["count"] for s in compared["sizes"])
    for size in compared["sizes"]:  # compare mode counts the edges the stability's Jaccard counted
        c = size["compare"]
        both, union = c["both"]["count"], c["both"]["count"] + c["only_a"]["count"] + c["only_b"]["count"]
        if union:  # the smallest size of a tiny graph may prune to no edge
            assert both / union == pytest.approx(jaccard[size["fraction"]])
    html = add_report_section(Report("t"), stage, figures).to_html()
    assert "The circuits of two disjoint prompt sets" in html and html.count('class="circuit-explorer"') == 2
