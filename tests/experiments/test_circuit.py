"""``python -m experiments.circuit`` end to end on a tiny random gemma-style model, checked against
independent recomputations (the circuit evaluated anew on the held-out prompts, edge counts read from
the EAP-IG JSON file by name)."""

import json

import pytest
import torch

from circuits.errors import InputError
from circuits.graph import Graph
from circuits.graph_io import load_eap_json
from circuits.graph_selection import select_fraction
from circuits.loading import load_model
from experiments import circuit as circuit_experiment
from patching.edges.catalogue import CATALOGUE
from patching.edges.evaluate import evaluate_circuits
from patching.edges.curves import MIB_FRACTIONS, curve_areas
from patching.edges.faithful_circuit import split_halves

FAST = ["--n-prompts", "60", "--circuit-prompts", "8", "--top-k", "2", "--n-bootstrap", "200", "--batch-size", "16"]


#: per-node IIA as python -m experiments.variables --circuit writes it (results.json circuit.rows)
IIA_ROWS = [{"variable": "a", "node": "L1H0", "position": "a_last", "share_of_best": 0.9,
             "iia": {"value": 0.84, "low": 0.75, "high": 0.9, "n": 40}}]


@pytest.fixture(scope="module")
def run(tiny_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("circuit")
    (folder / "variables").mkdir()
    (folder / "variables" / "results.json").write_text(json.dumps({"circuit": {"rows": IIA_ROWS}}))
    out = folder / "run"
    results = circuit_experiment.main(["--model", str(tiny_dir), "--out", str(out), *FAST,
                                       "--variables", str(folder / "variables")])
    return out, results


def test_results_curves_and_the_held_out_choice(run):
    out, results = run
    saved = json.loads((out / "results.json").read_text())
    assert saved["status"] == "complete"
    stage = saved["edge_circuit"]
    assert stage["n_selection"] + stage["n_heldout"] == min(8, saved["n_kept"]) and stage["n_selection"] >= 2
    for key in ("curve_selection", "curve_heldout"):
        curve = stage[key]
        assert curve["fractions"] == list(MIB_FRACTIONS) and len(curve["faithfulness"]) == 10
        assert curve["faithfulness"][-1]["value"] == pytest.approx(1.0, abs=1e-5)  # the full graph is the model
        assert all(p["low"] <= p["value"] + 1e-9 and p["value"] <= p["high"] + 1e-9 for p in curve["faithfulness"])
    held = stage["curve_heldout"]
    cpr, cmd = curve_areas(held["fractions"], [p["value"] for p in held["faithfulness"]])
    assert stage["cpr"]["value"] == pytest.approx(cpr) and stage["cmd"]["value"] == pytest.approx(cmd)
    # the size is the first that reaches the threshold on the selection prompts; its f is read on the other half
    selection = [p["value"] for p in stage["curve_selection"]["faithfulness"]]
    first = next(i for i, f in enumerate(selection) if f >= 0.8)
    smallest = stage["smallest"]
    assert smallest["fraction"] == MIB_FRACTIONS[first]
    assert smallest["f_heldout"] == held["faithfulness"][first]
    assert smallest["n_edges"] == held["n_edges"][first]


def test_circuit_file_is_the_chosen_circuit_and_reproduces_its_held_out_faithfulness(run, tiny_dir):
    out, results = run
    stage = results["edge_circuit"]
    circuit = load_eap_json(out / stage["files"]["circuit"])
    scores = load_eap_json(out / stage["files"]["scores"])
    assert torch.equal(circuit.scores.nan_to_num(), scores.scores.nan_to_num())
    chosen = select_fraction(Graph(scores.layout, scores.scores), stage["smallest"]["fraction"])
    assert torch.equal(circuit.in_graph, chosen.in_graph) and int(circuit.in_graph.sum()) == stage["smallest"]["n_edges"]
    assert (out / stage["files"]["mib_submission"] / "importances.json").exists()
    # evaluate the file's circuit anew on the held-out half: f must be the reported one
    model = load_model(str(tiny_dir), device="cpu")
    cfg = circuit_experiment.parse_config(["--model", str(tiny_dir), *FAST])
    kept, _ = circuit_experiment.correct_prompts(model, cfg)
    _, heldout = split_halves(kept, cfg.circuit_prompts, cfg.seed)
    full = circuit.layout.real_edge_mask
    c, f, e = (r.mean for r in evaluate_circuits(model, [circuit, full, torch.zeros_like(full)], heldout))
    assert (c - e) / (f - e) == pytest.approx(stage["smallest"]["f_heldout"]["value"], rel=1e-4, abs=1e-5)


def test_key_head_rows_count_the_circuit_edges_by_name(run):
    out, results = run
    stage = results["edge_circuit"]
    edges = json.loads((out / stage["files"]["circuit"]).read_text())["edges"]
    kept = [name for name, info in edges.items() if info["in_graph"]]
    relation = stage["key_heads"]
    assert len(relation["rows"]) == 2
    for row in relation["rows"]:
        node = row["node"]
        assert row["edges_out"] == sum(name.startswith(node + "->") for name in kept)
        assert row["edges_in"] == sum(name.split("->")[1].split("<")[0] == node for name in kept)
        assert row["in_circuit"] == (row["head"] not in relation["missing"])
    by_size = relation["by_size"]
    assert [r["fraction"] for r in by_size] == list(MIB_FRACTIONS)
    assert [r["n_edges"] for r in by_size] == stage["curve_heldout"]["n_edges"]  # the circuits the curve evaluated
    at_chosen = next(r for r in by_size if r["fraction"] == stage["smallest"]["fraction"])
    assert sorted(at_chosen["key_heads"]) == sorted(r["head"] for r in relation["rows"] if r["in_circuit"])


def test_figures_and_report(run):
    out, _ = run
    assert {p.stem for p in (out / "figures").iterdir()} == {"edge_curve", "edge_circuit"}
    html = (out / "report.html").read_text()
    assert "Edge circuit (top-n)" in html and "Key heads (path patching) in the edge circuit" in html


def test_the_explorer_hover_shows_path_patching_the_head_class_and_the_variables_iia(run):
    """Each node's hover carries what the run measured of it: path patching, attention reads, --variables' IIA."""
    out, results = run
    html = (out / "report.html").read_text()
    assert "path-patching effect: " in html and "attention-read class: " in html
    assert "IIA a: 0.84 [0.75, 0.9]" in html
    assert results["settings"]["variables"].endswith("variables")


def test_a_variables_folder_that_is_not_a_variables_run_is_refused_before_the_model_loads(tmp_path):
    with pytest.raises(InputError, match=r"missing.*does not exist; expected the results.json of a python -m "
                                         r"experiments.variables run"):
        circuit_experiment.parse_config(["--variables", str(tmp_path / "missing")])
    (tmp_path / "results.json").write_text(json.dumps({"edge_circuit": {}}))
    with pytest.raises(InputError, match=r"results.json holds no per-node IIA rows"):
        circuit_experiment.parse_config(["--variables", str(tmp_path)])
    (tmp_path / "results.json").write_text(json.dumps({"circuit": {"rows": IIA_ROWS}}))
    with pytest.raises(InputError, match=r"adds IIA to the explorer of one circuit; --methods compares methods"):
        circuit_experiment.parse_config(["--variables", str(tmp_path), "--methods", "EAP", "--stability-sets", "0"])


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit):
        circuit_experiment.parse_config(["--help"])
    text = capsys.readouterr().out
    for name in circuit_experiment.CircuitConfig.__dataclass_fields__:
        assert "--" + name.replace("_", "-") in text


def test_the_config_reads_the_catalogue_and_its_defaults_are_the_librarys():
    """The method flags come from patching.edges.catalogue (torch-free), a method's own settings included."""
    import dataclasses

    from experiments.circuit import config
    from patching.edges.catalogue import ACDCSettings, ConsensusSettings
    from patching.edges.faithful_circuit import CircuitSearch
    from patching.edges.learn import DEFAULT_CIRCUIT

    search, defaults = config.CircuitConfig().search(), CircuitSearch()
    assert search.method_settings == (ACDCSettings(), ConsensusSettings())
    assert search.settings_for(CATALOGUE["ACDC"]) == defaults.settings_for(CATALOGUE["ACDC"]) == ACDCSettings()
    parsed = circuit_experiment.parse_config(["--acdc-threshold", "0.5", "--acdc-objective", "metric",
                                              "--consensus-runs", "3"]).search()
    assert parsed.settings_for(CATALOGUE["ACDC"]) == ACDCSettings(threshold=0.5, objective="metric")
    assert parsed.settings_for(CATALOGUE["consensus"]).runs == 3
    assert dataclasses.asdict(config.CircuitConfig().learn()) == dataclasses.asdict(DEFAULT_CIRCUIT)
    assert search.learning == DEFAULT_CIRCUIT and search.method == defaults.method == "top-n"


def test_a_new_catalogue_record_brings_its_flags_without_other_edits():
    """One record with a settings dataclass is all a method needs for its command-line flags."""
    from dataclasses import dataclass, field

    from experiments.runtime import cli
    from patching.edges.catalogue import CircuitMethod

    @dataclass(frozen=True)
    class WidgetSettings:
        depth: int = field(default=3, metadata={"help": "how deep"})
        mode: str = field(default="a", metadata={"help": "which mode", "choices": ("a", "b")})

    record = CircuitMethod("widget", "attribution", "some.module:score", settings=WidgetSettings)
    catalogue = {**CATALOGUE, "widget": record}
    flags = cli.method_settings_flags(catalogue, "Flags")
    parsed = flags(widget_depth=5, widget_mode="b")
    assert cli.method_settings_records(parsed, catalogue)[-1] == WidgetSettings(depth=5, mode="b")
    assert {"widget_depth", "widget_mode", "acdc_threshold"} <= set(flags.__dataclass_fields__)
    with pytest.raises(InputError, match="choose from a, b"):
        cli.check_choices(flags(widget_mode="c"))


@pytest.mark.parametrize("argv, message", [
    (["--method", "bogus"], "--method: invalid choice"),
    (["--threshold", "1.5"], "--threshold: must be in [0, 1]"),
    (["--circuit-prompts", "0"], "--circuit-prompts: must be an integer >= 1"),
    (["--ablation", "resample"], "--ablation: invalid choice"),
    (["--methods", "EAP", "bogus"], "--methods: invalid choice"),
])
def test_bad_flags_fail_before_the_model_loads(argv, message, capsys):
    with pytest.raises(SystemExit) as exit:
        circuit_experiment.parse_config(argv)
    assert exit.value.code == 2 and message in capsys.readouterr().err


def test_the_methods_flag_offers_every_catalogued_circuit_method():
    assert circuit_experiment.parse_config(["--methods", *CATALOGUE, "--stability-sets", "0"]).methods == \
        tuple(CATALOGUE)
    assert circuit_experiment.parse_config(["--methods", "exact", "ilp"]).methods == ("exact", "ilp")


def test_stability_sets_that_cannot_be_measured_are_refused_at_parse_time(capsys):
    from circuits.errors import InputError
    from patching.edges.stability import stability_prompts_needed

    with pytest.raises(SystemExit) as exit:
        circuit_experiment.parse_config(["--methods", "EAP", "--stability-sets", "-1"])
    assert exit.value.code == 2 and "--stability-sets: must be an integer >= 0" in capsys.readouterr().err
    with pytest.raises(InputError, match="--stability-sets 1: stability compares the circuits of at least 2"):
        circuit_experiment.parse_config(["--methods", "EAP", "--stability-sets", "1"])
    with pytest.raises(InputError, match=r"--stability-sets 3 needs 32 correct prompts .* more than --n-prompts 31"):
        circuit_experiment.parse_config(["--methods", "EAP", "--stability-sets", "3", "--circuit-prompts", "16",
                                         "--n-prompts", "31"])
    fits = circuit_experiment.parse_config(["--methods", "EAP", "--stability-sets", "3", "--circuit-prompts", "16",
                                            "--n-prompts", "32", "--stability-seeds", "1", "2"])
    assert fits.stability_prompts_needed() == stability_prompts_needed(3, 16) == 32 and fits.stability_seeds == (1, 2)
    assert circuit_experiment.parse_config(["--methods", "EAP", "--stability-sets", "0", "--n-prompts", "1"])
    assert circuit_experiment.parse_config(["--stability-sets", "9", "--n-prompts", "1"])  # no --methods: unused


def test_repeated_stability_seeds_are_refused_before_work(tmp_path):
    """--stability-seeds 1 1 paired a run with itself and averaged a Jaccard of 1 into the stability."""
    from experiments import circuit as circuit_experiment
    from patching.edges.stability import circuit_stability

    with pytest.raises(InputError, match="--stability-seeds 1 1 repeats a seed"):
        circuit_experiment.main(["--methods", "top-n", "--stability-seeds", "1", "1", "--out", str(tmp_path / "r")])
    with pytest.raises(InputError, match=r"seeds \[1, 1\] repeat a seed"):
        circuit_stability(None, None, "top-n", seeds=[1, 1])
