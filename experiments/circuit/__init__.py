"""The edge circuit of one operation: EAP-IG edge scores, its faithfulness curve, the smallest faithful circuit.

    python -m experiments.circuit --op + --circuit-prompts 64

Stages (each timed into results.json ``seconds``):

1. data: few-shot one-digit prompts (``circuits.tasks``), kept where the model answers them
   correctly; ``--circuit-prompts`` of them, shuffled, split into two halves: the *selection*
   half and the *held-out* half;
2. attribution: every edge of the model's graph scored by EAP-IG-inputs (``--ig-steps`` 5) on the
   selection half (``patching.edges.attribute``; metric = the answer logit at END);
3. curves: the faithfulness f = (m(C) − m(∅)) / (m(full) − m(∅)) of the top-n edges (|score|,
   pruned to input-to-logits paths, as MIB builds them) at MIB's ten sizes, on each half, with
   95% bootstrap intervals over prompts; CPR and CMD (``patching.faithfulness_curve``);
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

The same stage runs inside ``python -m experiments.addition`` (and the other operations) with
the key heads and head classes that pipeline has already found (:func:`edge_circuit_stage`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from datasets import Dataset

from circuits.analyze.attention import HeadClassConfig, attention_reads, classify_heads
from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.show.edge_figures import edge_circuit_figure, faithfulness_figure
from circuits.graph_io import save_eap_json, write_mib_submission
from circuits.graph_selection import mib_selector, nodes_in_graph, select_fraction
from circuits.loading import load_model
from circuits.nodes import Head
from circuits.pools import pool_dataset
from circuits.show.html_report import Report
from experiments.runtime.run_folder import StageTimer, complete_run, default_run_dir, prepare_run_dir, write_text_atomic
from circuits.tasks import TaskConfig, accuracy_mask, filter_correct, make_dataset
from circuits.templates import resolve_operation
from patching.edges.evaluate import ABLATIONS
from patching.edges.attribute import EDGE_ATTRIBUTION_METHODS, edge_attribution
from patching.edges.curves import MIB_FRACTIONS, FaithfulnessCurve, faithfulness_curve
from patching.path_patching import path_patch
from patching.head_ranking import key_heads as rank_key_heads

from experiments.runtime import cli
from experiments.runtime.cli import option

logger = logging.getLogger("experiments")

MIN_PROMPTS = 4  # two per half: the fewest a bootstrap interval can be drawn from
TOP_EDGES_LISTED = 20


@dataclass(frozen=True)
class CircuitConfig:
    """Every flag of ``python -m experiments.circuit``, with its default."""

    model: str = option("gemma-3-270m", "offline model name, TransformerLens model name, or a saved model directory")
    device: str = "auto"
    dtype: str | None = None
    op: str = option("+", "the operation: + - * / (or addition, subtraction, ...)")
    n_prompts: int = option(200, "prompts sampled before keeping the correctly answered ones", type=cli.positive_int)
    circuit_prompts: int = option(64, "correct prompts used, split in half: scores and size chosen on one half, "
                                      "reported on the other", type=cli.positive_int)
    n_shots: int = option(3, "solved examples before each prompt", type=cli.nonnegative_int)
    seed: int = option(0, "seed of the data, the split into halves and the bootstrap", type=int)
    method: str = option("EAP-IG-inputs", "edge attribution method (patching.edges.attribute)",
                         choices=sorted(EDGE_ATTRIBUTION_METHODS))
    ig_steps: int = option(5, "integration steps of the EAP-IG methods", type=cli.positive_int)
    ablation: str = option("counterfactual", "how edges outside the circuit are ablated (patching.evaluate_circuit)",
                           choices=ABLATIONS)
    threshold: float = option(0.8, "the faithfulness the smallest circuit must reach", type=cli.fraction)
    top_k: int = option(8, "node-level key heads from path patching to relate the circuit to (0: skip path patching)",
                        type=cli.nonnegative_int)
    pool_prompts: int = option(256, "prompts (none of them evaluated) the mean ablations average over; unused by "
                                    "counterfactual", type=cli.positive_int)
    n_bootstrap: int = option(1000, "bootstrap resamples over prompts for every interval", type=cli.positive_int)
    batch_size: int = option(32, "prompts per forward pass", type=cli.positive_int)
    memory_mb: float = option(1024.0, "activation budget of one batched forward or backward (MB)",
                              type=cli.positive_float)
    threads: int = option(0, "torch CPU threads (0: torch's default)", type=cli.nonnegative_int)
    out: str | None = option(None, "output folder (default: runs/circuit-<operation>-<timestamp>)")
    overwrite: bool = option(False, "write into an existing output folder")


parser = cli.config_parser(CircuitConfig, "circuit", __doc__)


def parse_config(argv: list[str] | None = None) -> CircuitConfig:
    """CLI flags for every field of :class:`CircuitConfig` (``--help`` lists the defaults)."""
    return cli.parse_config(parser, CircuitConfig, argv)


# ---------------------------------------------------------------------------- stages


def correct_prompts(model, cfg: CircuitConfig) -> tuple[Dataset, float]:
    """The sampled prompts the model answers correctly (top-1 first answer token), and the base accuracy."""
    task = TaskConfig(op=cfg.op, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, seed=cfg.seed)
    dataset = make_dataset(model, task)
    kept, accuracy = filter_correct(model, dataset, mask=accuracy_mask(model, dataset, cfg.batch_size))
    return kept, accuracy


def split_prompts(kept: Dataset, cfg: CircuitConfig) -> tuple[Dataset, Dataset]:
    """(selection, held-out): ``circuit_prompts`` of the kept prompts, shuffled with the seed, in two halves."""
    n = min(cfg.circuit_prompts, len(kept))
    if n < MIN_PROMPTS:
        raise InputError(f"The edge circuit needs at least {MIN_PROMPTS} correctly answered prompts (two per half), "
                         f"got {n}: raise --n-prompts / --circuit-prompts or use a stronger model.")
    shuffled = kept.shuffle(seed=cfg.seed).select(range(n))
    half = n // 2
    return shuffled.select(range(half)), shuffled.select(range(half, n))


def score_edges(model, selection: Dataset, cfg: CircuitConfig) -> Graph:
    """Every edge's attribution score on the selection half."""
    return edge_attribution(model, selection, method=cfg.method, ig_steps=cfg.ig_steps, batch_size=cfg.batch_size,
                            memory_mb=cfg.memory_mb)


def curve_on(model, scores: Graph, prompts: Dataset, cfg: CircuitConfig, pool: Dataset | None) -> FaithfulnessCurve:
    """The MIB faithfulness curve of the pruned top-n circuits of ``scores`` on ``prompts``."""
    return faithfulness_curve(model, scores, prompts, ablation=cfg.ablation, means_from=pool,
                              select=mib_selector(scores.layout), n_bootstrap=cfg.n_bootstrap, seed=cfg.seed,
                              batch_size=cfg.batch_size, memory_mb=cfg.memory_mb)


def smallest_faithful(selection: FaithfulnessCurve, heldout: FaithfulnessCurve, threshold: float) -> dict | None:
    """The smallest size whose f reaches ``threshold`` on the selection half, with its f on the held-out half."""
    fraction = selection.smallest_fraction(threshold)
    if fraction is None:
        return None
    i = selection.fractions.index(fraction)
    return {"fraction": fraction, "n_edges": selection.n_edges[i], "f_selection": selection.faithfulness[i].to_dict(),
            "f_heldout": heldout.faithfulness[i].to_dict(), "threshold": threshold}


def _head_name(head: Head) -> str:
    return f"a{head.layer}.h{head.head}"


def key_head_relation(circuit: Graph, heads: list[Head]) -> dict:
    """Which key heads the edge circuit holds (with their in-circuit edges in and out) and which it misses."""
    layout = circuit.layout
    edges = circuit.in_graph & layout.real_edge_mask
    nodes = nodes_in_graph(circuit).tolist()
    rows, missing = [], []
    for head in heads:
        f = layout.head_forward(head.layer, head.head)
        into = [layout.head_backward(head.layer, head.head, x) for x in "qkv"]
        row = {"head": str(head), "node": _head_name(head), "in_circuit": bool(nodes[f]),
               "edges_out": int(edges[f].sum()), "edges_in": int(edges[:, into].sum())}
        rows.append(row)
        if not row["in_circuit"]:
            missing.append(str(head))
    names = {_head_name(h) for h in heads}
    others = [name for name, kept in zip(layout.forward_names, nodes)
              if kept and name.startswith("a") and name not in names]
    return {"key_heads": [str(h) for h in heads], "rows": rows, "missing": missing,
            "n_key_heads_in_circuit": len(heads) - len(missing), "circuit_heads_not_key": others,
            "n_circuit_heads": sum(1 for name, kept in zip(layout.forward_names, nodes) if kept and name.startswith("a"))}


def key_heads_by_size(scores: Graph, heads: list[Head], fractions=MIB_FRACTIONS) -> list[dict]:
    """At each curve size: the heads of the pruned top-n circuit, and which key heads are among them."""
    names = {_head_name(h): str(h) for h in heads}
    rows = []
    for fraction in fractions:
        circuit = select_fraction(scores, fraction)
        nodes = [n for n, kept in zip(scores.layout.forward_names, nodes_in_graph(circuit).tolist()) if kept]
        circuit_heads = [n for n in nodes if n.startswith("a")]
        rows.append({"fraction": fraction, "n_edges": int(circuit.in_graph.sum()), "n_heads": len(circuit_heads),
                     "key_heads": [names[n] for n in circuit_heads if n in names]})
    return rows


def path_patching_key_heads(model, prompts: Dataset, cfg: CircuitConfig) -> list[Head]:
    """The top ``cfg.top_k`` heads by path-patching effect on the answer logit (none when top_k is 0)."""
    if cfg.top_k == 0:
        return []
    heads, _ = rank_key_heads(path_patch(model, prompts, batch_size=cfg.batch_size), top_k=cfg.top_k)
    return heads


def head_roles(model, prompts: Dataset, cfg: CircuitConfig) -> dict[Head, str]:
    """Every head's attention-read class (operand / operator / other) on ``prompts``."""
    reads = attention_reads(model, prompts, batch_size=cfg.batch_size)
    return {c.head: c.label for c in classify_heads(reads, HeadClassConfig())}


def mib_model_name(model: str) -> str:
    """The model's name as a MIB submission folder can carry it (no '_', no path)."""
    return Path(model).name.replace("_", "-")


def write_circuit_files(out: Path, scores: Graph, circuit: Graph | None, op: str, model: str) -> dict[str, str]:
    """The circuit as EAP-IG Graph JSON (every edge's score, the circuit's edges in_graph) and a MIB submission."""
    folder = out / "edge_circuit"
    files = {"scores": save_eap_json(scores, folder / "scores.json")}
    if circuit is not None:
        files["circuit"] = save_eap_json(circuit, folder / "circuit.json")
    files["mib_submission"] = write_mib_submission(scores, folder / "mib", f"arithmetic-{resolve_operation(op).name}",
                                                   mib_model_name(model))
    return {k: str(Path(v).relative_to(out)) for k, v in files.items()}


def _score_summary(scores: Graph) -> dict:
    layout = scores.layout
    real = scores.scores[layout.real_edge_mask]
    order = torch.argsort(scores.scores.nan_to_num().abs().flatten(), descending=True, stable=True)[:TOP_EDGES_LISTED]
    top = [divmod(int(i), layout.n_backward) for i in order]
    return {"max_abs": float(real.abs().max()), "sum": float(real.sum()), "n_positive": int((real > 0).sum()),
            "n_negative": int((real < 0).sum()), "reference_metric": scores.meta.get("reference_metric"),
            "top_edges": [{"edge": layout.edge_name(f, b), "score": float(scores.scores[f, b])} for f, b in top]}


def edge_circuit_stage(model, kept: Dataset, heads: list[Head], roles: dict[Head, str], cfg: CircuitConfig,
                       out: Path, timer: StageTimer | None = None) -> tuple[dict, dict]:
    """Stages 2-4 and 6 on ``kept`` (correctly answered prompts): ``(results["edge_circuit"], figures)``.

    ``heads`` are the node-level key heads to relate the circuit to, ``roles`` each head's
    attention-read class (for the figure's colours). Files go to ``out/edge_circuit``.
    """
    timer = timer or StageTimer()
    selection, heldout = split_prompts(kept, cfg)
    pool = None
    if cfg.ablation.endswith("mean"):  # means from prompts that are none of the evaluated ones
        pool = pool_dataset(model, kept, cfg.pool_prompts, seed=cfg.seed + 1)
    with timer.stage("edge attribution"), cli.progress(f"{cfg.method} over every edge, {len(selection)} prompts"):
        scores = score_edges(model, selection, cfg)
    with timer.stage("faithfulness curves"), cli.progress(f"faithfulness at {len(MIB_FRACTIONS)} sizes, "
                                                          f"{len(selection)} + {len(heldout)} prompts"):
        curve_selection = curve_on(model, scores, selection, cfg, pool)
        curve_heldout = curve_on(model, scores, heldout, cfg, pool)
    smallest = smallest_faithful(curve_selection, curve_heldout, cfg.threshold)
    circuit = select_fraction(scores, smallest["fraction"]) if smallest else None
    results = {
        "method": cfg.method, "ig_steps": cfg.ig_steps, "ablation": cfg.ablation, "metric": "logit",
        "threshold": cfg.threshold, "n_selection": len(selection), "n_heldout": len(heldout),
        "n_total_edges": scores.layout.n_edges, "scores": _score_summary(scores),
        "curve_heldout": curve_heldout.to_dict(), "curve_selection": curve_selection.to_dict(),
        "cpr": curve_heldout.cpr.to_dict(), "cmd": curve_heldout.cmd.to_dict(), "smallest": smallest,
        "files": write_circuit_files(out, scores, circuit, cfg.op, cfg.model),
    }
    figures = {"edge_curve": faithfulness_figure(
        [("held-out prompts", curve_heldout), ("selection prompts", curve_selection)], threshold=cfg.threshold,
        title=f"Faithfulness of the top {cfg.method} edges ({cfg.ablation} ablation)")}
    if circuit is not None:
        results["key_heads"] = key_head_relation(circuit, heads)
        results["key_heads"]["by_size"] = key_heads_by_size(scores, heads)
        results["n_circuit_nodes"] = int(nodes_in_graph(circuit).sum())
        figures["edge_circuit"] = edge_circuit_figure(circuit, roles, highlight=heads, title=(
            f"Smallest circuit with f >= {cfg.threshold:g}: {smallest['n_edges']} edges "
            f"({100 * smallest['fraction']:g}% of {scores.layout.n_edges})"))
    return results, figures


def add_report_section(report: Report, stage: dict, figures: dict) -> Report:
    """The edge-circuit section of a report: curve, circuit, curve table, key heads."""
    held, sel = stage["curve_heldout"], stage["curve_selection"]
    report.add_heading("Edge circuit (EAP-IG)")
    report.add_figure(figures["edge_curve"], caption=(
        f"Faithfulness f = (m(C) - m(empty)) / (m(full) - m(empty)) of the top-|score| {stage['method']} edges "
        f"(pruned to input-to-logits paths) at MIB's ten sizes, {stage['ablation']} ablation, metric = answer logit; "
        f"scores from the {stage['n_selection']} selection prompts; bands: 95% bootstrap over prompts "
        f"({held['n_prompts']} held-out, {sel['n_prompts']} selection). Held-out CPR {_fmt(stage['cpr'])}, "
        f"CMD {_fmt(stage['cmd'])}."))
    rows = [{"% of edges": 100 * x, "edges": n, "f held-out": _fmt(fh), "f selection": _fmt(fs)}
            for x, n, fh, fs in zip(held["fractions"], held["n_edges"], held["faithfulness"], sel["faithfulness"])]
    report.add_table(rows, caption=f"m(full) = {_fmt(held['full_metric'])}, m(empty) = {_fmt(held['empty_metric'])} "
                                   f"on the held-out prompts.")
    smallest = stage["smallest"]
    if smallest is None:
        report.add_notice(f"No size reaches f >= {stage['threshold']:g} on the selection prompts.")
        return report
    report.add_figure(figures["edge_circuit"], caption=(
        f"The smallest circuit with f >= {smallest['threshold']:g} on the selection prompts "
        f"({smallest['n_edges']} edges, {100 * smallest['fraction']:g}%); on the held-out prompts f = "
        f"{_fmt(smallest['f_heldout'])}. Heads coloured by their attention-read class, key heads of path patching ringed in black; edge width grows with |score|."))
    relation = stage["key_heads"]
    if relation["key_heads"]:
        report.add_table(relation["rows"], heading="Key heads (path patching) in the edge circuit", caption=(
            f"{relation['n_key_heads_in_circuit']} of {len(relation['key_heads'])} key heads are in the circuit; "
            f"missing: {', '.join(relation['missing']) or 'none'}; circuit heads that are not key heads: "
            f"{', '.join(relation['circuit_heads_not_key']) or 'none'}."))
        report.add_table([{"% of edges": 100 * r["fraction"], "edges": r["n_edges"], "heads": r["n_heads"],
                           "key heads among them": ", ".join(r["key_heads"]) or "none"} for r in relation["by_size"]],
                         caption="The key heads among the nodes of the pruned top-n circuit at each curve size.")
    return report


def _fmt(estimate: dict) -> str:
    return f"{estimate['value']:.3f} [{estimate['low']:.3f}, {estimate['high']:.3f}]"


def summary(stage: dict) -> str:
    """One line: CPR, CMD and the smallest faithful circuit."""
    smallest = stage["smallest"]
    size = (f"smallest circuit with f >= {stage['threshold']:g}: {smallest['n_edges']} of {stage['n_total_edges']} "
            f"edges ({100 * smallest['fraction']:g}%), held-out f = {_fmt(smallest['f_heldout'])}"
            if smallest else f"no size reaches f >= {stage['threshold']:g}")
    return f"edge circuit: held-out CPR {_fmt(stage['cpr'])}, CMD {_fmt(stage['cmd'])}; {size}"


# ---------------------------------------------------------------------------- main


def run(cfg: CircuitConfig) -> dict:
    """Run the stages; return the results dict that is also written to results.json."""
    start = time.perf_counter()
    cli.set_threads(cfg.threads)
    name = resolve_operation(cfg.op).name
    out = prepare_run_dir(cfg.out or default_run_dir(f"circuit-{name}"), overwrite=cfg.overwrite)
    results: dict = {"experiment": f"circuit-{name}", "settings": dataclasses.asdict(cfg), "model": cfg.model}
    timer = StageTimer(run_dir=out, results=results)
    with timer.stage("load model"), cli.progress(f"loading {cfg.model}"):
        model = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)
    with timer.stage("data"), cli.progress(f"{cfg.n_prompts} {name} prompts, keeping the correct ones"):
        kept, accuracy = correct_prompts(model, cfg)
        selection, _ = split_prompts(kept, cfg)
    results |= {"n_prompts": cfg.n_prompts, "n_kept": len(kept), "base_accuracy": accuracy}
    with timer.stage("key heads and head classes"), cli.progress("path patching and attention reads"):
        heads = path_patching_key_heads(model, selection, cfg)
        roles = head_roles(model, selection, cfg)
    results["edge_circuit"], figures = edge_circuit_stage(model, kept, heads, roles, cfg, out, timer)
    for key, fig in figures.items():
        write_text_atomic(out / "figures" / f"{key}.json", fig.to_json())
    results["seconds"] = timer.seconds
    results["wall_seconds"] = round(time.perf_counter() - start, 1)
    report = Report(f"The {name} edge circuit of {cfg.model}", summary(results["edge_circuit"]))
    add_report_section(report, results["edge_circuit"], figures)
    report.add_table(timer.seconds | {"total": results["wall_seconds"]}, heading="Wall time per stage",
                     columns=("stage", "seconds"))
    report.add_settings(dataclasses.asdict(cfg))
    report.save(out / "report.html")
    complete_run(out, results)
    print(summary(results["edge_circuit"]))
    print(f"report: {out / 'report.html'}")
    return results


def main(argv: list[str] | None = None) -> dict:
    """Parse ``argv`` (default: ``sys.argv``), run, return the results; errors propagate (see :func:`cli_main`)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    return run(parse_config(argv))
