"""The comparison of circuit methods in ``python -m experiments.circuit --methods ...``: its stage, figure and table,
and each method's circuit stability over disjoint prompt sets (``--stability-sets``)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Optional, Sequence

import plotly.graph_objects as go
from datasets import Dataset

from circuits.show.edge_figures import faithfulness_figure
from circuits.show.html_report import Report
from experiments.runtime.timing import Progress
from patching.edges import CircuitSearch
from patching.edges.catalogue import CATALOGUE
from patching.edges.compare import MethodResult, compare_methods
from patching.edges.stability import circuit_stability, stability_prompts_needed, stability_runs, why_not_measurable

ROW_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2)


def compare_stage(model, kept: Dataset, methods, search: CircuitSearch, learn, *, warm_start, bootstrap_resamples: int,
                  stage=None, progress: Optional[Progress] = None) -> tuple[dict, dict[str, go.Figure], list[MethodResult]]:
    """``(results["comparison"], figures, found)``: every method's row, its held-out and selection curves, one
    figure, and each method's result (which :func:`stability_stage` reuses as its first run). ``progress``: one
    unit per method, advanced as each method's stage ends."""
    if progress is not None:
        stage = progress.counting(stage or (lambda name: nullcontext()))
    found = compare_methods(model, kept, methods, search, learn=learn, warm_start=warm_start,
                            bootstrap_resamples=bootstrap_resamples, stage=stage)
    first = found[0].found
    results = {"methods": list(methods), "threshold": search.threshold, "ablation": search.ablation,
               "n_selection": len(first.selection), "n_heldout": len(first.heldout),
               "n_total_edges": first.scores.layout.n_edges, "warm_start": warm_start,
               "rows": [r.row(ROW_FRACTIONS) for r in found],
               "curves": {r.name: {"heldout": r.found.curve_heldout.to_dict(),
                                   "selection": r.found.curve_selection.to_dict()} for r in found}}
    figure = faithfulness_figure([(r.name, r.found.curve_heldout) for r in found], threshold=search.threshold,
                                 title=f"Held-out faithfulness of each circuit method ({len(first.heldout)} prompts, "
                                       f"{search.ablation} ablation)")
    return results, {"comparison_curves": figure}, found


def stability_stage(model, kept: Dataset, methods, search: CircuitSearch, learn, *, n_sets: int, seeds, warm_start,
                    bootstrap_resamples: int, found: Sequence[MethodResult] = (), stage=None,
                    progress: Optional[Progress] = None) -> dict:
    """``results["stability"]``: each method's :class:`patching.edges.stability.StabilityResult` as a dict, or
    ``{"method", "skipped": why}`` for a method with no circuit of its own (one stage per method measured).
    ``found``: :func:`compare_stage`'s results; each method's stands for its run on the first set. ``progress``:
    one unit per run (:func:`stability_run_count`), the runs ``found`` stands for taken off as they come."""
    reuse = {result.name: result for result in found}
    counted = None if progress is None else (lambda scored: progress.advance() if scored else progress.skip())
    out = {}
    for name in methods:
        refusal = why_not_measurable(CATALOGUE[name])
        if refusal:
            out[name] = {"method": name, "skipped": refusal}
            continue
        out[name] = circuit_stability(model, kept, name, search, n_sets=n_sets, seeds=seeds or None, learn=learn,
                                      warm_start=warm_start, bootstrap_resamples=bootstrap_resamples,
                                      reuse=reuse.get(name), stage=stage, progress=counted).to_dict()
    return out


def measured_methods(methods) -> list[str]:
    """The methods of ``methods`` whose stability :func:`stability_stage` measures (those with a circuit of their own)."""
    return [name for name in methods if stability_runs(name, 1)]


def stability_run_count(methods, n_sets: int, seeds) -> int:
    """How many runs :func:`stability_stage` makes over every measured method (the reused ones included)."""
    return sum(stability_runs(name, n_sets, seeds or None) for name in methods)


def stability_shortfall(n_kept: int, n_sets: int, circuit_prompts: int) -> str | None:
    """Why the stability of ``n_sets`` sets cannot be measured on ``n_kept`` correct prompts (None: it can)."""
    needed = stability_prompts_needed(n_sets, circuit_prompts)
    if n_kept >= needed:
        return None
    return (f"--stability-sets {n_sets} needs {needed} correct prompts ({n_sets} sets and a held-out set of "
            f"--circuit-prompts // 2 = {circuit_prompts // 2} each) but the model answered {n_kept} correctly: "
            "stability skipped; raise --n-prompts, or lower --stability-sets or --circuit-prompts.")


def _fmt(estimate) -> str:
    if estimate is None:
        return "—"
    return f"{estimate['value']:.3f} [{estimate['low']:.3f}, {estimate['high']:.3f}]"


def _spread_text(spread: dict) -> str:
    """One pair of sets: its value alone (a range of one value says nothing); several: the mean and the spread over
    the pairs (min, max), not a confidence interval."""
    if spread["mean"] is None:
        return "undefined"
    if spread.get("n_pairs", 2) - spread.get("n_undefined", 0) == 1:
        return f"{spread['mean']:.2f}"
    return f"{spread['mean']:.2f} (pairs {spread['min']:.2f}-{spread['max']:.2f})"


def stability_rows(stability: dict) -> list[dict]:
    """The stability table: per method, edge and node Jaccard at each size (mean and the range over pairs), score
    Spearman, the core."""
    rows = []
    for name, entry in stability.items():
        if "skipped" in entry:
            rows.append({"method": name, "skipped": entry["skipped"]})
            continue
        row = {"method": name, "runs": len(entry["runs"])}
        row |= {f"Jaccard at {100 * j['fraction']:g}%": _spread_text(j) for j in entry["jaccard"]}
        row |= {f"node Jaccard at {100 * j['fraction']:g}%": _spread_text(j) for j in entry.get("node_jaccard", [])}
        row["score Spearman"] = _spread_text(entry["spearman"])
        row |= {f"core at {100 * c['fraction']:g}%": f"{c['n_edges']} edges, f = {_fmt(c['f'])}" for c in entry["core"]}
        rows.append(row)
    return rows


def comparison_summary(comparison: dict, stability: dict | None = None) -> str:
    """One line: the method with the largest held-out CPR, the smallest size any method makes faithful, and (with
    ``stability``) each method's mean circuit Jaccard over disjoint prompt sets at 5% of the edges."""
    rows = comparison["rows"]
    best = max(rows, key=lambda r: r["cpr"]["value"])
    sized = [r for r in rows if r["smallest_fraction"] is not None]
    smallest = min(sized, key=lambda r: r["smallest_fraction"]) if sized else None
    size = (f"smallest circuit with f >= {comparison['threshold']:g}: {smallest['method']} at "
            f"{100 * smallest['smallest_fraction']:g}% of the edges (held-out f = {_fmt(smallest['smallest_f_heldout'])})"
            if smallest else f"no method reaches f >= {comparison['threshold']:g}")
    line = (f"{len(rows)} circuit methods on {comparison['n_heldout']} held-out prompts: best held-out CPR "
            f"{best['method']} {_fmt(best['cpr'])}; {size}")
    at = {name: next((j for j in entry.get("jaccard", []) if j["fraction"] == 0.05), None)
          for name, entry in (stability or {}).items()}
    measured = [f"{name} {_spread_text(j)}" for name, j in at.items() if j is not None]
    return line + (f"; circuit Jaccard at 5% over disjoint prompt sets: {', '.join(measured)}" if measured else "")


def add_comparison_section(report: Report, comparison: dict, figures: dict, stability: dict | None = None) -> Report:
    """The comparison's figure and table, and (with ``stability``, results.json's key) the stability table."""
    report.add_heading("Circuit methods side by side")
    report.add_figure(figures["comparison_curves"], caption=(
        f"Faithfulness f = (m(C) − m(∅)) / (m(full) − m(∅)) on {comparison['n_heldout']} held-out prompts of the "
        f"circuits each method selects at MIB's sizes (scores, masks and hyperparameters from the "
        f"{comparison['n_selection']} selection prompts only); bands: 95% bootstrap over prompts."))
    rows = []
    first = comparison["rows"][0]["method"]
    for r in comparison["rows"]:
        row = {"method": r["method"], "CPR": _fmt(r["cpr"]), "CMD": _fmt(r["cmd"]),
               f"CPR − {first} (paired)": _fmt(r.get(f"minus_{first}", {}).get("cpr"))}
        row |= {f"f at {100 * x:g}%": _fmt(r.get(f"f@{100 * x:g}%")) for x in ROW_FRACTIONS}
        row |= {f"smallest f >= {comparison['threshold']:g}": "none" if r["smallest_fraction"] is None
                else f"{100 * r['smallest_fraction']:g}% (held-out {_fmt(r['smallest_f_heldout'])})",
                "wall s": r["seconds"], "CPU s": r["cpu_seconds"]}
        rows.append(row)
    report.add_table(rows, caption=(f"Held-out CPR (higher is better), CMD (lower is better) and f at fixed sizes, with "
                                    f"95% bootstrap intervals (n = {comparison['n_heldout']}); the smallest size is "
                                    f"chosen on the selection prompts and its f read on the held-out ones."))
    measured = [e for e in (stability or {}).values() if "skipped" not in e]
    if stability:
        heldout = f"{measured[0]['n_heldout']} held-out prompts" if measured else "held-out prompts"
        report.add_table(stability_rows(stability), heading="Stability of each method's circuit", caption=(
            "Each method run on disjoint prompt sets (and, if learned or resampled, with each seed): the edge Jaccard "
            "|A ∩ B| / |A ∪ B| of every pair of runs' circuits at each size (mean [min, max] over pairs), the "
            "Spearman correlation of their edge scores, and the stable core (edges kept by a majority of the "
            f"runs) with its faithfulness on {heldout} no run trained on (95% bootstrap interval)."))
    return report
