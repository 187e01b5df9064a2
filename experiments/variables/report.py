"""Figures, tables and report.html for ``experiments.variables`` (plain functions of results.json).

The featurizers' labels, and which of them choose k or their steps or are a null, come from their records in
:data:`patching.variables.catalogue.FEATURIZERS`, read when a report is written.
"""

from __future__ import annotations

import math
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from circuits.show.html_report import Report
from patching.variables import catalogue


def _interval(estimate: dict | None) -> str:
    if not estimate:
        return ""
    return f"{estimate['value']:.2f} [{estimate['low']:.2f}, {estimate['high']:.2f}] (n={estimate['n']})"


def iia_heatmaps(results: dict, kind: str) -> go.Figure:
    """One heatmap per variable, layer x position: the full vector's validation IIA, or ``kind``'s test IIA where fitted."""
    variables = results["variables"]
    fig = make_subplots(rows=1, cols=len(variables), subplot_titles=variables, shared_yaxes=True)
    for col, variable in enumerate(variables, 1):
        sweep = results["sweep"][variable]
        layers, positions = sweep["layers"], sweep["positions"]
        if kind == catalogue.BASELINE:
            z = [[cell["value"] for cell in row] for row in sweep["iia"]]
        else:
            z = [[math.nan] * len(positions) for _ in layers]
            for row in results["featurizers"][variable]["locations"]:
                where = row["location"]
                if kind in row and where["layer"] in layers:
                    z[layers.index(where["layer"])][positions.index(where["position_label"])] = row[kind]["test"]["value"]
        fig.add_trace(go.Heatmap(z=z, x=positions, y=layers, zmin=0, zmax=1, colorscale="Viridis",
                                 showscale=col == len(variables), colorbar_title="IIA",
                                 hovertemplate="layer %{y}, %{x}: IIA %{z:.2f}<extra></extra>"), 1, col)
    fig.update_yaxes(title_text="layer (resid_post)", row=1, col=1)
    label = catalogue.featurizer(kind).label
    what = f"{label}, validation pairs" if kind == catalogue.BASELINE else f"{label}, test pairs, fitted locations only"
    fig.update_layout(title=f"Interchange intervention accuracy per variable ({what})", height=460)
    return fig


def featurizer_rows(results: dict) -> list[dict]:
    """Per variable and fitted location: every featurizer's test IIA with its interval, k, the controls, the verdict."""
    rows = []
    for variable, section in results["featurizers"].items():
        for row in section["locations"]:
            where = row["location"]
            entry = {"variable": variable, "layer": where["layer"], "position": where["position_label"]}
            for kind, record in catalogue.FEATURIZERS.items():
                if kind in row:
                    steps = row[kind].get("steps") if "steps" in record.chooses else None
                    entry[f"{record.label} (k)"] = (f"{_interval(row[kind]['test'])}, k={row[kind]['k']:g}"
                                                    + (f", {steps} steps" if steps else ""))
            by_length = row.get("full_by_answer_tokens") or {}
            if len(by_length) > 1:  # a later answer token is read out after the intervened position
                entry["full vector by answer tokens"] = "; ".join(
                    f"{n}: {_interval(e)} (n {e['n']})" for n, e in by_length.items())
            entry["controls (full vector)"] = _interval(row.get("controls_full")) or "none"
            entry["verdict"] = row.get("verdict", "")
            rows.append(entry)
    return rows


def featurizer_caption() -> str:
    """The featurizer table's caption: which featurizers choose k, whose k each null has, what the controls are."""
    choosers = [record.label for record in catalogue.FEATURIZERS.values() if "k" in record.chooses]
    said = [f"{_listed(choosers)} choose k on the validation pairs"] if choosers else []
    said += [f"the {null.label} has {tested.label}'s k" for tested, null in catalogue.null_pairs()]
    first = "; ".join(said)
    return (f"{first[:1].upper()}{first[1:]}. " if said else "") + \
        "Controls keep the variable, so the expected answer is the base's own."


def _listed(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def circuit_rows(results: dict) -> list[dict]:
    """The circuit table, nodes with the largest share of the best IIA first."""
    rows = sorted(results["circuit"]["rows"], key=lambda r: (r["variable"], -(r["iia"]["value"] or 0)))
    return [{"variable": r["variable"], "node": r["node"], "position": r["position"], "IIA": _interval(r["iia"]),
             "share of the best": "" if r["share_of_best"] is None or math.isnan(r["share_of_best"])
             else f"{r['share_of_best']:.0%}"} for r in rows if (r["iia"]["value"] or 0) > 0][:60]


def write_report(results: dict, out: Path) -> None:
    """report.html: the verdicts first, then the heatmaps, the featurizers, the circuit nodes, pairs and settings."""
    report = Report(f"Causal variables of {results['task']}: {results['model']}", results.get("task_description"))
    verdicts = [f"{v}: {s['best'].get('verdict', 'no DAS / null fitted')} (layer {s['best']['location']['layer']}, "
                f"{s['best']['location']['position_label']})" for v, s in results["featurizers"].items()]
    report.add_text("\n".join(verdicts), heading="What this run found")
    if results.get("power_notice"):
        report.add_notice(results["power_notice"], heading="The power of this run")
    report.add_text(f"{results['n_correct']} prompts answered correctly (accuracy {_interval(results['accuracy'])}); "
                    f"example: {results['example_prompt']!r}. IIA is the share of pairs whose intervened answer "
                    f"is the causal model's counterfactual answer (scoring: {results['settings']['scoring']}).")
    report.add_figure(iia_heatmaps(results, catalogue.BASELINE), heading="Full-vector interchange, residual stream")
    for tested, _ in catalogue.null_pairs():
        if any(tested.name in row for s in results["featurizers"].values() for row in s["locations"]):
            report.add_figure(iia_heatmaps(results, tested.name),
                              heading=f"{tested.label} at the best full-vector locations")
    report.add_table(featurizer_rows(results), heading="Featurizers at the best locations (test pairs)",
                     caption=featurizer_caption())
    report.add_table(circuit_rows(results), heading="Circuit nodes",
                     caption=f"Nodes from {results['circuit']['nodes_from']} ({results['circuit']['n_nodes']}), full "
                             "vector at each variable's best position; nodes with IIA 0 are left out.")
    report.add_table([{"variable": v, **sizes, **results["example_pairs"][v]} for v, sizes in results["pairs"].items()],
                     heading="Pairs")
    report.add_table(results["seconds"], heading="Wall time per stage (s)")
    report.add_settings(results["settings"])
    report.save(out / "report.html")
