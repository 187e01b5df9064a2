"""The comparison of circuit methods in ``python -m experiments.circuit --methods ...``: its stage, figure and table."""

from __future__ import annotations

import plotly.graph_objects as go
from datasets import Dataset

from circuits.show.edge_figures import faithfulness_figure
from circuits.show.html_report import Report
from patching.edges.circuit_methods import compare_methods
from patching.edges.faithful_circuit import CircuitSearch

ROW_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2)


def compare_stage(model, kept: Dataset, methods, search: CircuitSearch, learn, *, warm_start, bootstrap_resamples: int,
                  stage=None) -> tuple[dict, dict[str, go.Figure]]:
    """``(results["comparison"], figures)``: every method's row, its held-out and selection curves, and one figure."""
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
    return results, {"comparison_curves": figure}


def _fmt(estimate) -> str:
    if estimate is None:
        return "—"
    return f"{estimate['value']:.3f} [{estimate['low']:.3f}, {estimate['high']:.3f}]"


def comparison_summary(comparison: dict) -> str:
    """One line: the method with the largest held-out CPR, and the smallest size any method makes faithful."""
    rows = comparison["rows"]
    best = max(rows, key=lambda r: r["cpr"]["value"])
    sized = [r for r in rows if r["smallest_fraction"] is not None]
    smallest = min(sized, key=lambda r: r["smallest_fraction"]) if sized else None
    size = (f"smallest circuit with f >= {comparison['threshold']:g}: {smallest['method']} at "
            f"{100 * smallest['smallest_fraction']:g}% of the edges (held-out f = {_fmt(smallest['smallest_f_heldout'])})"
            if smallest else f"no method reaches f >= {comparison['threshold']:g}")
    return (f"{len(rows)} circuit methods on {comparison['n_heldout']} held-out prompts: best held-out CPR "
            f"{best['method']} {_fmt(best['cpr'])}; {size}")


def add_comparison_section(report: Report, comparison: dict, figures: dict) -> Report:
    """The comparison's figure and table."""
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
    return report
