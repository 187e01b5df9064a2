"""The edge-circuit stage that ``experiments.circuit`` and the arithmetic pipeline share: the search, its files,
figures, report section and summary line (here, in the runtime, so that neither experiment imports the other).

:func:`edge_circuit_stage` runs :func:`patching.edges.faithful_circuit.find_faithful_circuit` on the correctly
answered prompts, relates the circuit to the node-level key heads, writes the circuit as hannamw/EAP-IG
Graph JSON and a MIB circuit-track submission (``<out>/edge_circuit/``), and draws the curve and circuit
figures; :func:`add_report_section` and :func:`summary` present what it found.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Optional

from datasets import Dataset

from circuits import Graph, Head
from circuits.errors import InputError
from circuits.graph_io import save_eap_json, write_mib_submission
from circuits.graph_selection import mib_selector, nodes_in_graph, select_fraction
from circuits.show.edge_figures import faithfulness_figure
from circuits.show.explorer import Explorer, circuit_explorer
from circuits.show.html_report import Report
from circuits.templates import resolve_operation
from patching.edges import CircuitSearch, find_faithful_circuit
from patching.edges.consensus import Consensus
from patching.edges.faithful_circuit import FaithfulCircuit, key_head_relation, key_heads_by_size
from patching.edges.stability import StabilityResult, stability_of_found, stability_prompts_needed
from experiments.runtime.node_info import merge_node_info


def edge_circuit_stage(model, kept: Dataset, heads: list[Head], roles: dict[Head, str], search: CircuitSearch, *,
                       out: Path, op: str, model_name: str, stage=None, stability_sets: int = 0,
                       node_info: Optional[Mapping] = None) -> tuple[dict, dict]:
    """The search on ``kept`` (correctly answered prompts): ``(results["edge_circuit"], figures)``.

    ``heads`` are the node-level key heads to relate the circuit to, ``roles`` each head's
    attention-read class (for the figure's colours), ``stage`` the run's stage opener (``Run.stage``).
    ``stability_sets`` (>= 2): the same method on that many disjoint prompt sets, the first the circuit's own
    selection half (:func:`patching.edges.stability.stability_of_found`); fewer correct prompts than that needs
    is said in ``results["stability_skipped"]``. Files go to ``out/edge_circuit``. ``node_info``: what the
    explorer shows on hovering a node beside its key-head rank (:mod:`experiments.runtime.node_info`: path-patching
    effect, IIA per variable); a consensus circuit's edges show their share of runs keeping them, and a measured
    stability adds ``figures["edge_stability"]``, the explorer of the first two sets' circuits compared.
    """
    from contextlib import nullcontext

    stage = stage or (lambda name: nullcontext())
    found = find_faithful_circuit(model, kept, search, stage=stage)
    results = found.to_dict() | {"files": write_circuit_files(out, found.scores, found.circuit, op, model_name,
                                                              d_model=model.cfg.d_model)}
    figures = {"edge_curve": faithfulness_figure(
        [("held-out prompts", found.curve_heldout), ("selection prompts", found.curve_selection)],
        threshold=search.threshold, title=f"Faithfulness of the {search.method} circuits ({search.ablation} ablation)")}
    if found.circuit is not None:
        results["key_heads"] = key_head_relation(found.circuit, heads)
        results["key_heads"]["by_size"] = key_heads_by_size(found.scores, heads)
        results["n_circuit_nodes"] = int(nodes_in_graph(found.circuit).sum())
    # the explorer is also the static figure of the circuit drawn before (figures/edge_circuit.json, paper export)
    figures["edge_circuit"] = found_explorer(found, heads, roles, node_info)
    if stability_sets >= 2:
        needed = stability_prompts_needed(stability_sets, search.circuit_prompts)
        if len(kept) < needed:
            results["stability_skipped"] = (
                f"Stability needs {needed} correctly answered prompts ({stability_sets} training sets and a held-out "
                f"set of {search.circuit_prompts // 2}); the run has {len(kept)}: sample more prompts (--n-prompts) or "
                "lower --circuit-prompts.")
        else:
            with stage(f"stability ({search.method} on {stability_sets} sets)"):
                stability = stability_of_found(model, kept, found.scores, search, n_sets=stability_sets,
                                               select=found.select)
            results["stability"] = stability.to_dict()
            figures["edge_stability"] = stability_explorer(stability, roles, heads)
    return results, figures


def found_explorer(found: FaithfulCircuit, heads: list[Head], roles: dict[Head, str],
                   node_info: Optional[Mapping] = None) -> Explorer:
    """The explorer of a found circuit: its curve's sizes, its own selector, the key heads ringed and ranked in the
    hover beside ``node_info``, and for a consensus circuit each edge's share of runs keeping it at the start size."""
    search = found.search
    shown = found.circuit
    if shown is None:  # no size is faithful: the goal's size is drawn, so the first screen still shows a circuit
        shown = select_fraction(found.scores, SHOWN_FRACTION)
    fraction = found.smallest["fraction"] if found.circuit is not None else SHOWN_FRACTION
    size, layout = int(shown.in_graph.sum()), found.scores.layout
    what = (f"Smallest circuit with f >= {search.threshold:g}" if found.circuit is not None
            else f"No size reaches f >= {search.threshold:g}; the circuit at {100 * SHOWN_FRACTION:g}%")
    ranks = {head: {"key-head rank (path patching)": rank} for rank, head in enumerate(heads, 1)}
    consensus = getattr(found.select, "__self__", None)  # the consensus method selects with its Consensus' select
    share = consensus.shares(int(fraction * layout.n_edges)) if isinstance(consensus, Consensus) else None
    return circuit_explorer(
        found.scores, curve=found.curve_heldout, start=fraction, select=found.select, head_roles=roles,
        highlight=heads, signs=found.warm_scores, title=f"The {search.method} circuit at each size",
        node_info=merge_node_info(ranks, node_info), edge_share=share,
        figure_title=f"{what} ({search.method}): {size} edges ({100 * size / layout.n_edges:.1f}% of {layout.n_edges})")


def stability_explorer(stability: StabilityResult, roles: dict[Head, str], heads: list[Head]) -> Explorer:
    """Compare mode of the first two prompt sets' circuits at the stability sizes (each set's own circuit, as the
    Jaccard counted it); an edge's hover shows its share of the sets keeping it at 5% of the edges."""
    layout = stability.scores[0].layout
    remembered = {(id(stability.scores[run].scores), int(x * layout.n_edges)): stability.circuits[run][i].in_graph
                  for run in (0, 1) for i, x in enumerate(stability.fractions)}
    fallback = mib_selector(layout)

    def select(scores, n: int):
        mask = remembered.get((id(scores), n))
        return fallback(scores, n) if mask is None else mask

    start = min(range(len(stability.fractions)), key=lambda i: abs(stability.fractions[i] - SHOWN_FRACTION))
    return circuit_explorer(
        stability.scores[0], compare=stability.scores[1], labels=("set 0", "set 1"), sizes=stability.fractions,
        start=stability.fractions[start], select=select,
        edge_share=stability.cores[start], head_roles=roles, highlight=heads,
        title=f"The {stability.method} circuits of two disjoint prompt sets")


#: the circuit size drawn when no size is faithful (the goal's size)
SHOWN_FRACTION = 0.05


def mib_model_name(model: str) -> str:
    """The model's name as a MIB submission folder can carry it (no '_', no path)."""
    return Path(model).name.replace("_", "-")


def mib_task_name(op: str) -> str:
    """``arithmetic-<operation>`` for an operation, else the task's own name (``ioi``, a pair file's stem)."""
    try:
        return f"arithmetic-{resolve_operation(op).name}"
    except InputError:
        return op.replace("_", "-")


def write_circuit_files(out: Path, scores: Graph, circuit: Graph | None, op: str, model: str, *,
                        d_model: Optional[int] = None) -> dict[str, str]:
    """The circuit as EAP-IG Graph JSON (every edge's score, the circuit's edges in_graph) and a MIB submission;
    ``d_model``: the model's, for graphs that do not carry it (the consensus method's)."""
    folder = out / "edge_circuit"  # inside the run folder, which is this run's own: its files may be rewritten
    files = {"scores": save_eap_json(scores, folder / "scores.json", d_model, overwrite=True)}
    if circuit is not None:
        files["circuit"] = save_eap_json(circuit, folder / "circuit.json", d_model, overwrite=True)
    files["mib_submission"] = write_mib_submission(scores, folder / "mib", mib_task_name(op), mib_model_name(model),
                                                   d_model=d_model, overwrite=True)
    return {k: str(Path(v).relative_to(out)) for k, v in files.items()}


def add_report_section(report: Report, stage: dict, figures: dict) -> Report:
    """The edge-circuit section of a report: curve, circuit, curve table, key heads."""
    held, sel = stage["curve_heldout"], stage["curve_selection"]
    report.add_heading(f"Edge circuit ({stage['method']})")
    if "edge_circuit" in figures:
        smallest = stage["smallest"]
        explorer = isinstance(figures["edge_circuit"], Explorer)
        add = report.add_explorer if explorer else report.add_figure
        add(figures["edge_circuit"], caption=(
            (f"The smallest circuit with f >= {smallest['threshold']:g} on the selection prompts "
             f"({smallest['n_edges']} edges, {100 * smallest['fraction']:g}%); on the held-out prompts f = "
             f"{_fmt(smallest['f_heldout'])}. " if smallest else
             f"No size reaches f >= {stage['threshold']:g} on the selection prompts; drawn: the circuit at "
             f"{100 * SHOWN_FRACTION:g}% of the edges. ")
            + "Nodes: heads (L10H0, coloured by their attention-read class, key heads of path patching ringed in "
              "black), MLPs (MLP 14), the input and the logits; an edge carries its sender's output into its "
              "receiver's input, its width grows with |score|, its colour is its sign."
            + (" The size control redraws the circuit at each size of the curve below, with its held-out f; hover a "
               "node for its attention-read class, key-head rank and what the run measured of it (path-patching "
               "effect, IIA per variable), an edge for its score (and a consensus circuit's share of runs keeping "
               "it), click a node for its paths to the logits, and the camera button saves the view as SVG."
               if explorer else "")))
    if "stability" in stage:
        report.add_table(stability_rows(stage["stability"]), heading="Is it the same circuit on other prompts?",
                         caption=stability_caption(stage["stability"]))
        if isinstance(figures.get("edge_stability"), Explorer):
            report.add_explorer(figures["edge_stability"], heading="The circuits of two disjoint prompt sets", caption=(
                "Compare mode of the circuits the method found on the first two prompt sets, at each stability size: "
                "edges both keep, only set 0 keeps (the circuit's own selection half) and only set 1 keeps; hover an "
                "edge for its two scores and the share of the sets keeping it at 5% of the edges."))
    elif "stability_skipped" in stage:
        report.add_notice(stage["stability_skipped"])
    report.add_figure(figures["edge_curve"], caption=(
        f"Faithfulness f = (m(C) - m(empty)) / (m(full) - m(empty)) of the {stage['method']} circuits "
        f"(pruned to input-to-logits paths) at MIB's ten sizes, {stage['ablation']} ablation, "
        f"metric = {stage.get('metric', 'logit')}; "
        f"scores from the {stage['n_selection']} selection prompts; bands: 95% bootstrap over prompts "
        f"({held['n_prompts']} held-out, {sel['n_prompts']} selection). Held-out CPR {_fmt(stage['cpr'])}, "
        f"CMD {_fmt(stage['cmd'])}."))
    rows = [{"% of edges": 100 * x, "edges": n, "f held-out": _fmt(fh), "f selection": _fmt(fs)}
            for x, n, fh, fs in zip(held["fractions"], held["n_edges"], held["faithfulness"], sel["faithfulness"])]
    report.add_table(rows, caption=f"m(full) = {_fmt(held['full_metric'])}, m(empty) = {_fmt(held['empty_metric'])} "
                                   f"on the held-out prompts.")
    if stage["smallest"] is None:
        report.add_notice(f"No size reaches f >= {stage['threshold']:g} on the selection prompts.")
        return report
    relation = stage["key_heads"]
    if relation["key_heads"]:
        rows = [{k: v for k, v in r.items() if k != "node"} for r in relation["rows"]]  # one naming of heads: L10H0
        report.add_table(rows, heading="Key heads (path patching) in the edge circuit", caption=(
            f"{relation['n_key_heads_in_circuit']} of {len(relation['key_heads'])} key heads are in the circuit; "
            f"missing: {', '.join(relation['missing']) or 'none'}; circuit heads that are not key heads: "
            f"{', '.join(relation['circuit_heads_not_key']) or 'none'}."))
        report.add_table([{"% of edges": 100 * r["fraction"], "edges": r["n_edges"], "heads": r["n_heads"],
                           "key heads among them": ", ".join(r["key_heads"]) or "none"} for r in relation["by_size"]],
                         caption="The key heads among the nodes of the pruned top-n circuit at each curve size.")
    return report


def stability_rows(stability: dict) -> list[dict]:
    """One row per size: the edge Jaccard of the sets' circuits, and the stable core's size and held-out f."""
    return [{"% of edges": 100 * j["fraction"], "edges": j["n_edges"], "Jaccard": two_decimals(j["mean"]),
             "core edges": c["n_edges"], "core f held-out": _fmt(c["f"])}
            for j, c in zip(stability["jaccard"], stability["core"])]


def stability_caption(stability: dict) -> str:
    return (f"The same method on {stability['n_sets']} disjoint sets of {stability['n_per_set']} prompts (the first is "
            f"the circuit's own selection half): the edge Jaccard |A ∩ B| / |A ∪ B| of the sets' circuits at each size "
            f"(1: the same edges), and the stable core (edges every set keeps) with its faithfulness on "
            f"{stability['n_heldout']} prompts no set trained on (95% bootstrap). Score Spearman "
            f"{two_decimals(stability['spearman']['mean'])}.")


def two_decimals(value) -> str:
    """``0.44``; a number results.json holds as null (or a NaN) reads ``n/a``."""
    return f"{value:.2f}" if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


def _fmt(estimate: dict) -> str:
    """``value [low, high]``; a number results.json holds as null (no interval on too few prompts) reads ``n/a``."""
    num = lambda v: f"{v:.3f}" if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"
    return f"{num(estimate.get('value'))} [{num(estimate.get('low'))}, {num(estimate.get('high'))}]"


def summary(stage: dict) -> str:
    """One line: CPR, CMD and the smallest faithful circuit."""
    smallest = stage["smallest"]
    size = (f"smallest circuit with f >= {stage['threshold']:g}: {smallest['n_edges']} of {stage['n_total_edges']} "
            f"edges ({100 * smallest['fraction']:g}%), held-out f = {_fmt(smallest['f_heldout'])}"
            if smallest else f"no size reaches f >= {stage['threshold']:g}")
    line = f"edge circuit ({stage['method']}): held-out CPR {_fmt(stage['cpr'])}, CMD {_fmt(stage['cmd'])}; {size}"
    if "stability" in stage:
        five = [j for j in stage["stability"]["jaccard"] if abs(j["fraction"] - 0.05) < 1e-9]
        if five:
            line += f"; Jaccard at 5% between prompt sets {two_decimals(five[0]['mean'])}"
    return line
