"""Every experiment declares its plan: the stages a run goes through, numbered on the terminal as each starts.

A plan is a function of the settings (``plan(cfg)`` next to the stages), so a flag that adds or drops a stage
adds or drops it from the count; a run on a tiny model prints ``[1/N] load model ...`` first and never a stage
that its plan leaves out; a stage that loops over known work prints how far it has come and an ETA."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from experiments.runtime import cli


def _defaults(module: str, config: str):
    """The settings of ``python -m <module>`` with no flags."""
    return lambda: getattr(importlib.import_module(module), config)()


def _parsed(module: str, *argv: str):
    return lambda: importlib.import_module(module).parse_config(list(argv))


#: every experiment (and the flags that change its stages) -> its settings
EXPERIMENTS = {
    "addition": lambda: importlib.import_module("experiments.arithmetic").parse_config("+", []),
    "af1": _defaults("experiments.af1", "AF1ExperimentConfig"),
    "af1 --isolate": lambda: importlib.import_module("experiments.af1").AF1ExperimentConfig(isolate=("7,6",)),
    "transfer": _defaults("experiments.transfer", "TransferConfig"),
    "precise_sft": _defaults("experiments.precise_sft.config", "SFTComparisonConfig"),
    "merge": _defaults("experiments.merge.config", "MergeConfig"),
    "numbers": _defaults("experiments.numbers.config", "NumbersConfig"),
    "variables": _defaults("experiments.variables.config", "VariablesConfig"),
    "circuit": _parsed("experiments.circuit"),
    "circuit --methods": _parsed("experiments.circuit", "--methods", "EAP", "ensemble", "--stability-sets", "2"),
    "learned_circuit": _parsed("experiments.learned_circuit"),
    "bench_learn": _defaults("experiments.bench_learn", "BenchLearnConfig"),
    "bench_circuits": _defaults("experiments.bench_circuits.config", "BenchCircuitsConfig"),
    "bench_patching": _defaults("experiments.bench_patching", "BenchPatchingConfig"),
    "bench_finetune": _defaults("experiments.bench_finetune", "BenchFinetuneConfig"),
    "cost_model measure": _parsed("experiments.cost_model", "measure"),
    "cost_model fit": _parsed("experiments.cost_model", "fit"),
    "measure_edges": _defaults("experiments.measure_edges", "MeasureEdgesConfig"),
    "edge_sweeps": _defaults("experiments.edge_sweeps", "EdgeSweepsConfig"),
    "loop": _defaults("experiments.loop", "LoopConfig"),
}


def _plan_of(name: str) -> list[str]:
    module = {"addition": "arithmetic"}.get(name.split()[0], name.split()[0])
    return importlib.import_module(f"experiments.{module}").plan(EXPERIMENTS[name]())


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_experiment_plans_its_stages(name):
    plan = _plan_of(name)
    assert plan and all(isinstance(stage, str) and stage for stage in plan)
    assert len(set(plan)) == len(plan), "a stage named twice would be numbered by its first place only"


def test_every_module_that_runs_stages_passes_its_plan():
    # the mergekit recipe (merge --config) runs no stage: one merge, timed into results.json itself
    root = Path(__file__).resolve().parents[2] / "experiments"
    runs = [path for path in root.rglob("*.py") if "run_experiment(" in path.read_text()
            and path.parent.name != "runtime" and path.name != "yaml_recipe.py"]
    assert len(runs) >= 17 and [p.name for p in runs if "plan=plan(cfg)" not in p.read_text()] == []


def test_flags_that_add_or_drop_stages_change_the_plan():
    from experiments import af1, circuit, cost_model

    methods = circuit.plan(EXPERIMENTS["circuit --methods"]())
    # one stage per method, and the stability of each method that has a circuit of its own (not the ensemble)
    assert methods[2:] == ["circuit method EAP", "circuit method ensemble", "stability of circuit method EAP"]
    assert "faithfulness curves" in circuit.plan(EXPERIMENTS["circuit"]())
    assert list(af1._variant_runners(None, None, None, None, None)) == list(af1.ISOLATION_VARIANTS)
    assert set(cost_model.MEASURE_ORDER) == set(cost_model.SWEEPS)
    assert cost_model.plan(cost_model.parse_config(["measure", "--only", "knockout", "forward"]))[2:] == \
        ["forward", "knockout"]


def test_a_tiny_run_numbers_its_stages_from_the_first(tiny_dir, tmp_path, capsys):
    from experiments import measure_edges

    results = measure_edges.main(["--model", str(tiny_dir), "--n-prompts", "2", "--n-shots", "1", "--stride", "50",
                                  "--n-bootstrap", "20", "--threads", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    plan = measure_edges.plan(measure_edges.MeasureEdgesConfig())
    assert err.startswith("[1/4] load model ...") and "[4/4] baseline curve ..." in err
    assert re.search(r"^ {6}load model: \d+ s$", err, re.MULTILINE)  # its time, under its name
    assert set(results["seconds"]) <= set(plan)


def test_a_comparison_of_circuit_methods_says_how_far_it_has_come(tiny_dir, tmp_path, capsys):
    from experiments import circuit

    circuit.main(["--model", str(tiny_dir), "--out", str(tmp_path / "run"), "--n-prompts", "60",
                  "--circuit-prompts", "8", "--top-k", "0", "--n-bootstrap", "20", "--batch-size", "16",
                  "--methods", "EAP", "EAP-IG-inputs", "--stability-sets", "2"])
    err = capsys.readouterr().err
    for number, stage in enumerate(["load model", "data", "circuit method EAP", "circuit method EAP-IG-inputs",
                                    "stability of circuit method EAP", "stability of circuit method EAP-IG-inputs"]):
        assert f"[{number + 1}/6] {stage} ..." in err
    assert "  circuit methods: 2/2, elapsed " in err
    # each method's run on the first set is the comparison's own, so only the second set's runs are left to do
    assert "  stability runs: 2/2, elapsed " in err
