"""The edge circuit of one operation: the learned top-n circuit, its faithfulness curve, the smallest faithful one.

    python -m experiments.circuit --op + --circuit-prompts 64

Stages (each timed into results.json ``seconds``):

1. data: few-shot one-digit prompts (``circuits.tasks``), kept where the model answers them
   correctly; ``--circuit-prompts`` of them, shuffled, split into two halves: the *selection*
   half and the *held-out* half;
2. scores: every edge of the model's graph scored on the selection half by ``--method``
   (``patching.edges.faithful_circuit.score_selection``): by default the learned straight-through top-n
   (``patching.edges.learn.DEFAULT_CIRCUIT``, the ``--learn-*`` flags), warm-started from ``--warm-start``
   (EAP-IG-inputs, ``--ig-steps`` 5) on the same prompts; ``--method EAP-IG-inputs`` (or another
   attribution method) scores by attribution alone (metric = the answer logit at END);
3. curves: the faithfulness f = (m(C) − m(∅)) / (m(full) − m(∅)) of the top-n edges (|score|,
   pruned to input-to-logits paths, as MIB builds them) at MIB's ten sizes, on each half, with
   95% bootstrap intervals over prompts; CPR and CMD (``patching.edges.faithfulness_curve``);
4. smallest faithful circuit: the smallest size whose f reaches ``--threshold`` (0.8) is chosen
   on the selection half and its f is reported on the held-out half, so the number is not
   inflated by the choice (no winner's curse); the held-out curve, CPR and CMD are the
   headline numbers (the scores never saw those prompts);
5. key heads: the node-level key heads from path patching (``--top-k``; 0 skips) on the
   selection half; which of them the edge circuit holds, with their in-circuit edge counts,
   which it misses, and which circuit heads are not key heads;
6. outputs: the circuit as hannamw/EAP-IG's Graph JSON and a MIB circuit-track submission
   (``edge_circuit/``), the layered circuit figure (heads coloured by their attention-read
   class, ``circuits.analyze.attention``) and the curve figure, results.json (key ``edge_circuit``,
   docs/results_json.md) and report.html.

``--task`` names the task instead of ``--op``: an operation (addition, subtraction, multiplication, division), or
``ioi`` / ``greater-than`` (``circuits.classic_tasks``), or the path of a prompt-pair file (CSV or JSON lines,
``circuits.pair_tasks``). A pair task keeps the rows the model solves (its metric > 0; ``patching.sweeps.task_metrics``),
scores and curves by its own metric (logit difference, probability difference, KL; results.json ``task`` and
``edge_circuit.metric``), and skips stage 5 (path patching and head classes read the arithmetic prompts' operands).
Learned methods train on the task's metric too (their ``metric`` objective; ``--learn-objective kl`` instead).

``--methods A B ...`` replaces stages 2-6 by a comparison: every method (EAP-IG, exact patching,
learned masks, ensembles, bootstrapped scores, the ILP, position-aware edges) scores the same
selection half and is curved on the same held-out half; results.json key ``comparison``, one
figure with every held-out curve and its band, the table of CPR, CMD, f at 1-20% of the edges, the
smallest faithful size and the time of each method (``patching.edges.compare.compare_methods``).
Then each method's circuit stability (``--stability-sets`` 2; 0 skips): the method run again on that many
disjoint prompt sets of ``--circuit-prompts // 2`` each (and each ``--stability-seeds`` seed, if learned), its
circuits' pairwise edge Jaccard at 2, 5 and 10% of the edges, the Spearman correlation of its scores, and the
stable core's faithfulness on prompts no run trained on; results.json key ``stability``
(``patching.edges.stability.circuit_stability``).

``--templates A B ...`` (opt-in, after either path): the ``--method`` circuit found on each prompt family (template
styles ``equation``, ``statement``, ``question``, ``word_problem``; transfer formats ``multi_digit``, ``decimal``,
``zero_shot``), each from its own correctly answered prompts, and evaluated on every family's held-out half: f at
``--templates-size`` of the edges with 95% bootstrap intervals, and the edge Jaccard of the families' circuits;
results.json key ``templates``, a heatmap and a table in the report (``patching.edges.families.family_circuits``).

The search is :func:`patching.edges.faithful_circuit.find_faithful_circuit` with its settings in one
record (:class:`patching.edges.faithful_circuit.CircuitSearch`, built from these flags); the same stage
runs inside ``python -m experiments.addition`` (and the other operations) with the key heads and head
classes that pipeline has already found (:func:`experiments.runtime.edge_circuit.edge_circuit_stage`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

# only light imports here: the parser answers --help and flag errors before torch or TransformerLens load
from experiments.circuit.config import CircuitConfig
from experiments.runtime import ModelLoader, Run, cli, run_experiment
from circuits.atomic_files import write_text_atomic

if TYPE_CHECKING:
    from datasets import Dataset

    from circuits import Head

logger = logging.getLogger("experiments")

parser = cli.config_parser(CircuitConfig, "circuit", __doc__)


def parse_config(argv: list[str] | None = None) -> CircuitConfig:
    """CLI flags for every field of :class:`CircuitConfig` (``--help`` lists the defaults)."""
    return cli.parse_config(parser, CircuitConfig, argv)


# ---------------------------------------------------------------------------- stages


def task_prompts(model, cfg: CircuitConfig):
    """The rows of ``--task`` the model solves (``patching.sweeps.task_metrics.keep_solved``), their share, the task's
    results.json record and the metric that scores them (ioi, greater-than or a pair file)."""
    from patching.sweeps.task_metrics import solved_rows

    rows, metric, share, record = solved_rows(model, cfg.task, n_prompts=cfg.n_prompts, seed=cfg.seed,
                                              batch_size=cfg.batch_size)
    return rows, share, record, metric


def task_search(cfg: CircuitConfig, metric=None):
    """The search's settings (``cfg.search()``), scoring by ``metric`` when the task names one."""
    search = cfg.search()
    if metric is None:
        return search
    return dataclasses.replace(search, sweep=dataclasses.replace(search.sweep, metric=metric))


def correct_prompts(model, cfg: CircuitConfig) -> tuple[Dataset, float]:
    """The sampled prompts the model answers correctly (top-1 first answer token), and the base accuracy."""
    from circuits.answer_scoring import first_token_hits
    from circuits.tasks import filter_correct, make_dataset

    task = cfg.task_config()
    dataset = make_dataset(model, task)
    kept, accuracy = filter_correct(model, dataset, mask=first_token_hits(model, dataset, cfg.batch_size))
    return kept, accuracy


def path_patching_key_heads(model, prompts: Dataset, cfg: CircuitConfig) -> tuple[list[Head], dict | None]:
    """The top ``cfg.top_k`` heads by path-patching effect on the answer logit, and every node's effect
    (``NodeScores.to_dict()``, for the explorer's hover); none and None when top_k is 0."""
    from patching import SweepOptions, key_heads, path_patch

    if cfg.top_k == 0:
        return [], None
    scores = path_patch(model, prompts, options=SweepOptions(batch_size=cfg.batch_size))
    heads, _ = key_heads(scores, top_k=cfg.top_k)
    return heads, scores.to_dict()


def head_roles(model, prompts: Dataset, cfg: CircuitConfig) -> dict[Head, str]:
    """Every head's attention-read class (operand / operator / other) on ``prompts``."""
    from circuits.analyze.attention import HeadClassConfig, attention_reads, classify_heads

    reads = attention_reads(model, prompts, batch_size=cfg.batch_size)
    return {c.head: c.label for c in classify_heads(reads, HeadClassConfig())}


# ---------------------------------------------------------------------------- main


def run(cfg: CircuitConfig, *, loader: ModelLoader | None = None) -> dict:
    """Run the stages; return the results dict that is also written to results.json."""
    name = f"circuit-{cfg.task_name}"
    return run_experiment(name, cfg, _stages, loader=loader, plan=plan(cfg),
                          results={"experiment": name, "settings": dataclasses.asdict(cfg), "model": cfg.model})


def plan(cfg: CircuitConfig) -> list[str]:
    """The stages a run with these settings goes through, in order (their names as in results.json ``seconds``):
    with ``--methods``, one per method and one per method whose stability is measured; without, the search's."""
    if cfg.methods:
        from experiments.circuit.compare import measured_methods

        middle = [f"circuit method {name}" for name in cfg.methods]
        if cfg.stability_sets:
            middle += [f"stability of circuit method {name}" for name in measured_methods(cfg.methods)]
    else:
        heads = ["key heads and head classes"] if cfg.arithmetic else []
        middle = [*heads, f"edge scores ({cfg.method})", "faithfulness curves"]
    return ["load model", "data", *middle, *(["prompt families"] if cfg.templates else [])]


def _stages(run: Run) -> None:
    from circuits.show.html_report import Report
    from experiments.circuit.compare import (
        add_comparison_section, compare_stage, comparison_summary, stability_run_count, stability_shortfall,
        stability_stage,
    )
    from experiments.runtime.edge_circuit import add_report_section, edge_circuit_stage, summary
    from experiments.runtime.node_info import iia_info, merge_node_info, path_patching_info, read_variables_rows
    from patching.edges.faithful_circuit import split_halves

    cfg, results = run.cfg, run.results
    name = cfg.task_name
    model = run.load_model()
    with run.stage("data", f"{cfg.n_prompts} {name} prompts, keeping the correct ones"):
        if cfg.arithmetic:
            (kept, accuracy), metric = correct_prompts(model, cfg), None
        else:
            kept, accuracy, results["task"], metric = task_prompts(model, cfg)
        selection, _ = split_halves(kept, cfg.circuit_prompts, cfg.seed)
    search = task_search(cfg, metric)
    results |= {"n_prompts": cfg.n_prompts, "n_kept": len(kept), "base_accuracy": accuracy}
    if cfg.methods:
        warm_start = None if cfg.warm_start == "none" else cfg.warm_start
        shortfall = stability_shortfall(len(kept), cfg.stability_sets, cfg.circuit_prompts) if cfg.stability_sets \
            else None
        if shortfall:  # said before the comparison runs, not after it
            logger.warning(shortfall)
            results["stability_skipped"] = shortfall
        results["comparison"], figures, found = compare_stage(model, kept, cfg.methods, search, cfg.learn(),
                                                       warm_start=warm_start,
                                                       bootstrap_resamples=cfg.bootstrap_resamples, stage=run.stage,
                                                       progress=run.progress(len(cfg.methods), "circuit methods"))
        if cfg.stability_sets and not shortfall:
            results["stability"] = stability_stage(model, kept, cfg.methods, search, cfg.learn(),
                                                   n_sets=cfg.stability_sets, seeds=cfg.stability_seeds,
                                                   warm_start=warm_start, bootstrap_resamples=cfg.bootstrap_resamples,
                                                   found=found, stage=run.stage, progress=run.progress(
                                                       stability_run_count(cfg.methods, cfg.stability_sets,
                                                                           cfg.stability_seeds), "stability runs"))
        figures |= _templates(run, model)
        for key, fig in figures.items():
            write_text_atomic(run.out / "figures" / f"{key}.json", fig.to_json())
        results["wall_seconds"] = run.wall_seconds
        stability = results.get("stability")
        report = Report(f"Circuit methods compared: {name} on {cfg.model}",
                        comparison_summary(results["comparison"], stability))
        add_comparison_section(report, results["comparison"], figures, stability)
        _add_templates(report, results, figures)
        report.add_table(run.timer.seconds | {"total": results["wall_seconds"]}, heading="Wall time per stage",
                         columns=("stage", "seconds"))
        report.add_settings(dataclasses.asdict(cfg))
        report.save(run.out / "report.html")
        print(comparison_summary(results["comparison"], stability))
        print(f"report: {run.out / 'report.html'}")
        return
    heads, roles, patched = [], {}, None
    if cfg.arithmetic:  # operand / operator heads and path patching read the arithmetic prompts' parts
        with run.stage("key heads and head classes", "path patching and attention reads"):
            heads, patched = path_patching_key_heads(model, selection, cfg)
            roles = head_roles(model, selection, cfg)
    iia = iia_info(read_variables_rows(cfg.variables)) if cfg.variables else {}
    results["edge_circuit"], figures = edge_circuit_stage(model, kept, heads, roles, search, out=run.out,
                                                          op=cfg.op if cfg.arithmetic else cfg.task_name,
                                                          model_name=cfg.model, stage=run.stage,
                                                          node_info=merge_node_info(path_patching_info(patched), iia))
    figures |= _templates(run, model)
    for key, fig in figures.items():
        write_text_atomic(run.out / "figures" / f"{key}.json", fig.to_json())
    results["wall_seconds"] = run.wall_seconds
    report = Report(f"The {name} edge circuit of {cfg.model}", summary(results["edge_circuit"]))
    add_report_section(report, results["edge_circuit"], figures)
    _add_templates(report, results, figures)
    report.add_table(run.timer.seconds | {"total": results["wall_seconds"]}, heading="Wall time per stage",
                     columns=("stage", "seconds"))
    report.add_settings(dataclasses.asdict(cfg))
    report.save(run.out / "report.html")
    print(summary(results["edge_circuit"]))
    print(f"report: {run.out / 'report.html'}")


def _templates(run: Run, model) -> dict:
    """With ``--templates``: results key ``templates`` (experiments.circuit.families) and its figure."""
    if not run.cfg.templates:
        return {}
    from experiments.circuit.families import templates_stage, templates_summary

    with run.stage("prompt families", f"the {run.cfg.method} circuit of {', '.join(run.cfg.templates)} on each other"):
        run.results["templates"], figure = templates_stage(model, run.cfg)
    print(templates_summary(run.results["templates"]))
    return {} if figure is None else {"templates": figure}


def _add_templates(report, results: dict, figures: dict) -> None:
    if "templates" in results:
        from experiments.circuit.families import add_templates_section

        add_templates_section(report, results["templates"], figures.get("templates"))


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Parse ``argv`` (default: ``sys.argv``), run, return the results; errors propagate (see :func:`cli_main`)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    return run(parse_config(argv), loader=loader)
