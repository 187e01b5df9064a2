"""``python -m experiments.circuit --templates ...`` end to end on a tiny saved model: every family's circuit on every
family, beside the edge circuit, checked against the library run anew; flags refused at parse time."""

from __future__ import annotations

import json

import pytest

from circuits.errors import InputError
from experiments import circuit as circuit_experiment

FAST = ["--n-prompts", "60", "--circuit-prompts", "8", "--top-k", "0", "--n-bootstrap", "50", "--batch-size", "16",
        "--method", "EAP"]


def test_each_familys_circuit_on_every_family_beside_the_edge_circuit(tiny_dir, tmp_path):
    out = tmp_path / "run"
    families = ["equation", "question", "zero_shot"]
    results = circuit_experiment.main(["--model", str(tiny_dir), "--out", str(out), *FAST, "--templates", *families,
                                       "--templates-size", "0.1"])
    saved = json.loads((out / "results.json").read_text())
    assert "edge_circuit" in saved  # the run's own stages are unchanged
    entry = saved["templates"]
    assert entry == json.loads(json.dumps(results["templates"])) and entry["method"] == "EAP"
    kept = entry["families"]
    assert set(kept) | set(entry["skipped_families"]) == set(families) and len(kept) >= 2
    assert entry["fraction"] == 0.1 and set(entry["base_accuracy"]) == set(families)
    for a in kept:
        assert entry["jaccard"][a][a] == 1.0
        for b in kept:
            f = entry["f"][a][b]
            assert f["low"] <= f["value"] <= f["high"] and f["n"] == entry["n_heldout"][b] <= 4
    assert (out / "figures" / "templates.json").exists()
    assert "Circuits across prompt families" in (out / "report.html").read_text()


def test_templates_flags_are_checked_at_parse_time(capsys):
    with pytest.raises(InputError, match="--templates equation: name at least two different prompt families"):
        circuit_experiment.parse_config(["--templates", "equation"])
    with pytest.raises(InputError, match="name at least two different prompt families"):
        circuit_experiment.parse_config(["--templates", "equation", "equation"])
    with pytest.raises(SystemExit) as exit:
        circuit_experiment.parse_config(["--templates", "equation", "limerick"])
    assert exit.value.code == 2 and "--templates: invalid choice: 'limerick'" in capsys.readouterr().err
    with pytest.raises(InputError, match="--templates-size 0 selects no edge"):
        circuit_experiment.parse_config(["--templates", "equation", "question", "--templates-size", "0"])


def test_the_families_flag_offers_every_family_of_the_library():
    from experiments.circuit.config import PROMPT_FAMILIES
    from patching.edges.families import FAMILIES

    assert PROMPT_FAMILIES == FAMILIES
