"""Which locations of the model hold the task's causal variables? Interchange interventions and DAS.

    python -m experiments.variables [--task + | - | * | / | two_digit_addition] [--out runs/variables-<timestamp>]

1. **pairs**: prompts of the task (default one-digit addition, ``a + b``; ``two_digit_addition`` is MIB's
   "The sum of AB and CD is", which gemma-3-270m answers too rarely to pair), kept where the model
   answers them correctly; per variable of the causal model (a, b, the result and its digits; for two
   digits ones, ones_carry, tens) counterfactual pairs (base, source) split train / validation / test,
   and control pairs;
2. **full-vector sweep**: the residual stream after every layer (``--layers``) at every position of
   the queried problem, and at END together with the answer positions after it (``end+answer``, where an
   answer of several tokens is read out; ``--no-answer-span`` leaves it out), swapped from source to base;
   IIA on the validation pairs per variable, layer and position;
3. **featurizers** at the ``--das-locations`` best locations per variable: DAS (learned rotation, k
   and the number of training steps chosen on the validation pairs among ``--das-ks`` and ``--das-steps``),
   PCA (k among ``--ks``), DBM (learned mask, when named in ``--featurizers``), the random subspace of DAS's
   k (the null) and the full vector, each with its
   IIA on the test pairs; the full vector's test IIA split by the predicted answer's token count (a
   one-position intervention cannot reach a digit read out at a later position); the controls' IIA; a
   verdict per variable;
4. **circuit nodes**: the full-vector IIA of each node (``--nodes``, ``--circuit``, default every head
   and MLP) at the best position of each variable, as a share of the best IIA anywhere;
5. results.json and report.html in ``--out``.

The defaults (256 pairs a variable, about 64 of them test pairs) decide: they resolve a difference of 0.2 above a
random-subspace null, and took 8 min 47 s on gemma-3-270m on a 2-core CPU (docs/results.md, "The defaults
decide"). With fewer ``--n-pairs`` the run says before it starts that its verdicts may be inconclusive
(:func:`power_notice`; results.json ``power_notice``, the report), with the ``--n-pairs`` that would decide, so that
an "inconclusive" verdict is read as a lack of data, not a finding.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from experiments.runtime import ModelLoader, Run, cli, run_experiment
from experiments.variables.config import VariablesConfig

if TYPE_CHECKING:
    from patching.variables.interchange import Location

parser = cli.config_parser(VariablesConfig, "variables", __doc__)

PLAN = ["load model", "pairs", "full-vector sweep", "featurizers", "circuit nodes", "report"]


@dataclass
class VariablesState:
    """What the stages carry: the model, the dataset, the pairs as batches per variable and split, the positions."""

    model: Any
    dataset: Any
    splits: dict
    batches: dict  # variable -> split name -> list[PairBatch]
    positions: dict[str, int]
    layers: list[int]


#: the label of END together with the answer positions after it (a location ``through_answer``)
SPAN = "end+answer"


def _label(where: Location, positions: dict[str, int]) -> str:
    """``where``'s position by its label in ``positions`` (``end+answer`` for the span from END)."""
    label = next((name for name, p in positions.items() if p == where.position), str(where.position))
    return f"{label}+answer" if where.through_answer else label


def _key(where: Location, positions: dict[str, int]) -> dict:
    return {"hook": where.hook, "layer": where.layer, "position": where.position,
            "through_answer": where.through_answer, "position_label": _label(where, positions)}


def build_pairs(run: Run[VariablesConfig, VariablesState]) -> None:
    """Stage "pairs": prompts, which the model answers, the pairs of every variable and their batches."""
    from patching.variables.causal_models import PairSettings, causal_model, correct_rows, query_positions, task_config, variable_pairs
    from circuits.stats import proportion
    from circuits.tasks import make_dataset
    from patching.variables.interchange import pair_batches

    cfg, model = run.cfg, run.state.model
    causal = causal_model(cfg.task)
    variables = list(cfg.variables) or list(causal.tested)
    for variable in variables:
        causal.check_variable(variable)
    dataset = make_dataset(model, task_config(causal, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, seed=cfg.seed))
    settings = PairSettings(n_pairs=cfg.n_pairs, n_controls=cfg.n_controls, split=tuple(cfg.split), scoring=cfg.scoring,
                            seed=cfg.seed)
    with run.step("scoring the prompts"):
        correct = correct_rows(model, dataset, cfg.scoring, cfg.batch_size)
    splits = variable_pairs(model, causal, dataset, variables, settings, correct=correct)
    batches = {v: {name: pair_batches(model, dataset, getattr(s, name), scoring=cfg.scoring, batch_size=cfg.batch_size)
                   if getattr(s, name) else [] for name in ("train", "validation", "test", "controls")}
               for v, s in splits.items()}
    first = next(iter(splits.values())).test[0]
    positions = query_positions(dataset[first.base], model)
    layers = list(cfg.layers) if cfg.layers is not None else list(range(model.cfg.n_layers))
    run.state.dataset, run.state.splits, run.state.batches = dataset, splits, batches
    run.state.positions, run.state.layers = positions, layers
    run.results |= {
        "task": causal.name, "task_description": causal.description, "variables": variables,
        "accuracy": proportion([float(c) for c in correct]).to_dict(), "n_correct": sum(correct),
        "example_prompt": dataset[first.base]["prompt"],
        "pairs": {v: s.sizes() for v, s in splits.items()},
        "example_pairs": {v: {"base": dataset[s.test[0].base]["prompt"].splitlines()[-1],
                              "source": dataset[s.test[0].source]["prompt"].splitlines()[-1],
                              "expected": s.test[0].answer} for v, s in splits.items()},
        "positions": positions, "layers": layers,
    }
    print(f"{sum(correct)} of {len(correct)} prompts answered correctly; pairs per variable: "
          + ", ".join(f"{v} {s.sizes()}" for v, s in splits.items()))


def full_vector_sweep(run: Run[VariablesConfig, VariablesState]) -> dict[str, list[tuple[float, Location]]]:
    """Stage "full-vector sweep": validation IIA at every (layer, position) per variable; the locations, best first."""
    from patching.variables.interchange import iia_sweep, location, rank_locations, within_best_interval

    state = run.state
    # (label, position, through the answer?) of every column: the problem's tokens, then END with the answer positions
    columns = [(label, p, False) for label, p in state.positions.items()]
    if not run.cfg.no_answer_span:
        columns.append((SPAN, state.positions["end"], True))
    grid = [[location("resid_post", layer, p, through_answer=span) for _, p, span in columns] for layer in state.layers]
    locations = [where for row in grid for where in row]
    sweep, ranked = {}, {}
    for variable, batches in state.batches.items():
        with run.step(f"{variable}: {len(locations)} locations"):
            estimates = iia_sweep(state.model, batches["validation"], locations, prune=not run.cfg.full_sweep,
                                  desc=variable, progress=True)
        sweep[variable] = {
            "hook": "resid_post", "pairs": "validation", "layers": state.layers,
            "positions": [label for label, _, _ in columns],
            "iia": [[estimates[where].to_dict() for where in row] for row in grid]}
        # the earliest of the locations within the best one's interval first (patching.variables.rank_locations)
        ranked[variable] = rank_locations(estimates)
        best_value, best = ranked[variable][0]
        tied = within_best_interval(estimates)
        sweep[variable]["within_best_interval"] = [_key(w, state.positions) for w in tied]
        print(f"{variable}: full-vector validation IIA {best_value:.2f} at layer {best.layer}, position "
              f"{_label(best, state.positions)}, the earliest of {len(tied)} locations within the best one's interval")
    run.results["sweep"] = sweep
    return ranked


def featurizer_stage(run: Run[VariablesConfig, VariablesState], ranked: dict) -> None:
    """Stage "featurizers": at the best locations per variable, every featurizer's test IIA, the controls, a verdict.

    The featurizers are the records of :data:`patching.variables.catalogue.FEATURIZERS`: the baseline (the full
    vector) at every location, then those of ``--featurizers`` in the catalogue's order, each null after the
    others, at the k its featurizer chose (the smallest of ``--ks`` where that one was not fitted).
    """
    from patching.variables import catalogue
    from patching.variables.featurizers import DASSettings, fit_and_select, verdict
    from patching.variables.interchange import iia_by_answer_length, interchange_accuracy

    cfg, state = run.cfg, run.state
    settings = DASSettings(ks=tuple(cfg.ks), das_ks=tuple(cfg.das_ks), steps=max(cfg.das_steps),
                           select_steps=tuple(cfg.das_steps),
                           batch_size=cfg.das_batch, lr=cfg.das_lr, seed=cfg.seed, progress=True)
    chosen = sorted((record for record in catalogue.FEATURIZERS.values() if record.name in cfg.featurizers),
                    key=lambda record: record.null_of is not None)  # stable: a null after the one whose k it takes
    baseline = catalogue.BASELINE
    headline = _headline()
    out = {}
    locations = run.progress(sum(len(ranked[v][:cfg.das_locations]) for v in state.batches), "DAS locations")
    for variable, batches in state.batches.items():
        rows = []
        for _, where in ranked[variable][:cfg.das_locations]:
            with run.step(f"{variable} at {where}"):
                split = (batches["train"], batches["validation"], batches["test"])
                fitted = {baseline: fit_and_select(state.model, baseline, where, *split, settings)}
                for record in chosen:
                    k = None
                    if record.null_of is not None:
                        k = int(fitted[record.null_of].k) if record.null_of in fitted else min(cfg.ks)
                    fitted[record.name] = fit_and_select(state.model, record.name, where, *split, settings, k=k)
                controls = interchange_accuracy(state.model, batches["controls"], where)[0].to_dict() \
                    if batches["controls"] else None
                # the full vector's test IIA per token count of the predicted answer (a later token is read out
                # after the intervened position: see patching.variables.interchange.iia_by_answer_length)
                by_length = iia_by_answer_length(state.model, batches["test"], where, hits=fitted[baseline].test_hits)
            locations.advance()
            row = {"location": _key(where, state.positions), **{kind: f.to_dict() for kind, f in fitted.items()},
                   "controls_full": controls,
                   "full_by_answer_tokens": {str(n): e.to_dict() for n, e in by_length.items()}}
            for tested, null in catalogue.null_pairs():
                if tested.name in fitted and null.name in fitted:
                    row["verdict"] = verdict(fitted[tested.name].test, fitted[null.name].test, fitted[baseline].test,
                                             test_share=cfg.split[2])
            rows.append(row)
            print(f"{variable} at {where}: " + ", ".join(f"{k} {f.test.value:.2f}" for k, f in fitted.items())
                  + (f" -> {row['verdict']}" if "verdict" in row else ""))
            if len(by_length) > 1:
                print(f"  full vector by answer tokens: " + ", ".join(
                    f"{n} token{'s' if n > 1 else ''} {e.value:.2f} [{e.low:.2f}, {e.high:.2f}] (n {e.n})"
                    for n, e in by_length.items()))
        out[variable] = {"locations": rows, "best": _best_on_validation(rows, ranked[variable], headline)}
    run.results["featurizers"] = out


def _best_on_validation(rows: list[dict], ranked: list, headline: str) -> dict:
    """The row of the location chosen on validation pairs by the headline featurizer (the test pairs only report):
    the earliest within the best one's interval. Without a headline fit (the full vector alone), the sweep's choice,
    made the same way on the same validation pairs."""
    from circuits.stats import Estimate
    from patching.variables.interchange import within_best_interval

    scored = [row.get(headline, {}).get("validation") for row in rows]
    if any(score is None for score in scored):
        return rows[0]
    validation = {where: Estimate(**score) for (_, where), score in zip(ranked, scored)}
    return rows[list(validation).index(within_best_interval(validation)[0])]


def _headline() -> str:
    """The featurizer a variable's best location is chosen by: the first one a null tests (DAS), else the baseline."""
    from patching.variables import catalogue

    return next((tested.name for tested, _ in catalogue.null_pairs()), catalogue.BASELINE)


def circuit_stage(run: Run[VariablesConfig, VariablesState], ranked: dict) -> None:
    """Stage "circuit nodes": each node's full-vector test IIA at each variable's best position, as a share of the best."""
    from circuits.graph_io import load_eap_json
    from circuits import parse_node
    from circuits.nodes import all_nodes
    from patching.variables.catalogue import BASELINE
    from experiments.variables.config import circuit_file
    from patching.variables.interchange import circuit_nodes, node_table

    cfg, state = run.cfg, run.state
    if cfg.circuit:
        nodes, source = circuit_nodes(load_eap_json(circuit_file(cfg.circuit), model=state.model)), cfg.circuit
    elif cfg.nodes:
        nodes, source = [parse_node(n) for n in cfg.nodes], "--nodes"
    else:
        nodes, source = all_nodes(state.model), "every head and MLP"
    rows = []
    for variable, batches in state.batches.items():
        best_value, best = ranked[variable][0]
        test_best = run.results["featurizers"][variable]["best"][BASELINE]["test"]["value"]
        label = _label(best, state.positions)
        with run.step(f"{variable}: {len(nodes)} nodes at {label}"):
            rows += node_table(state.model, {variable: batches["test"]}, nodes, {label: best.position},
                               {variable: test_best}, through_answer=best.through_answer,
                               prune=not cfg.full_sweep, progress=True)
    run.results["circuit"] = {"nodes_from": source, "n_nodes": len(nodes), "rows": rows}


#: the random-subspace null's test IIA the up-front power notice assumes (0.00-0.05 for every variable measured on
#: gemma-3-270m, docs/results.md "Causal variables")
TYPICAL_NULL = 0.03
#: what the decisive setting cost where it was measured (docs/results.md, "The defaults decide")
DECISIVE_RUN_TIME = "8 min 47 s for --n-pairs 256 with the other defaults on gemma-3-270m, two threads of a 2-core CPU"


def power_notice(cfg: VariablesConfig) -> str | None:
    """Before any work: a note when ``--n-pairs`` leaves too few test pairs a variable to resolve
    :data:`patching.variables.featurizers.DECISIVE_DIFFERENCE` above a null near :data:`TYPICAL_NULL` (so a
    verdict may be "inconclusive"), with the ``--n-pairs`` that would and what that took; None when it resolves it."""
    import math

    from circuits.stats import items_to_resolve, resolvable_difference
    from patching.variables.featurizers import DECISIVE_DIFFERENCE

    n_test = max(int(cfg.n_pairs * cfg.split[2]), 1)
    power = resolvable_difference(n_test, TYPICAL_NULL)
    if power <= DECISIVE_DIFFERENCE:
        return None
    needed = items_to_resolve(DECISIVE_DIFFERENCE, TYPICAL_NULL)
    resolves = "nothing" if math.isinf(power) else f"only differences of {power:.2f}"
    return (f"--n-pairs {cfg.n_pairs} leaves about {n_test} test pairs a variable, which resolve {resolves} above a "
            f"random-subspace null near {TYPICAL_NULL}: a variable that DAS carries less strongly than that is "
            f"reported 'inconclusive', not 'not held'. Verdicts that resolve {DECISIVE_DIFFERENCE} need about "
            f"{needed} test pairs: --n-pairs {math.ceil(needed / cfg.split[2])} ({DECISIVE_RUN_TIME}).")


def run(cfg: VariablesConfig, *, loader: ModelLoader | None = None) -> dict:
    """Run every stage; return the results dict that is also written to results.json."""
    notice = power_notice(cfg)
    if notice:
        print(f"note: {notice}", flush=True)
    return run_experiment("variables", cfg, _stages, loader=loader, plan=plan(cfg),
                          results={"model": cfg.model, "settings": dataclasses.asdict(cfg), "power_notice": notice})


def plan(cfg: VariablesConfig) -> list[str]:
    """The stages every run goes through, in order (their names as in results.json ``seconds``)."""
    return list(PLAN)


@cli.no_grad
def _stages(run: Run[VariablesConfig, VariablesState]) -> None:
    from experiments.variables.report import write_report

    model = run.load_model()
    run.state = VariablesState(model, None, {}, {}, {}, [])
    with run.stage("pairs"):
        build_pairs(run)
    with run.stage("full-vector sweep"):
        ranked = full_vector_sweep(run)
    with run.stage("featurizers"):
        featurizer_stage(run, ranked)
    with run.stage("circuit nodes"):
        circuit_stage(run, ranked)
    with run.stage("report"):
        run.results |= {"seconds": run.timer.seconds, "wall_seconds": run.wall_seconds}
        run.save()
        write_report(json.loads((run.out / "results.json").read_text()), run.out)
    print(f"report: {run.out / 'report.html'}")


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Parse ``argv`` (default: ``sys.argv``) and run."""
    return run(cli.parse_config(parser, VariablesConfig, argv), loader=loader)
