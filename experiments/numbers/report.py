"""Figures, summary tables and report.html for ``experiments.numbers`` (plain functions of results.json)."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from circuits.show.html_report import Report

PERIODS = (2, 5, 10, 100)


def _power_ratio(spectrum: dict, period: float) -> float:
    """Power at the frequency nearest ``period`` over the null threshold (> 1: above the null)."""
    n = spectrum["n_numbers"]
    k = min(max(round(n / period), 1), len(spectrum["power"]))
    threshold = spectrum["null_threshold"]
    return spectrum["power"][k - 1] / threshold if threshold > 0 else 0.0  # constant h: no power at all


def _layers_components(section: dict) -> tuple[list[int], list[str]]:
    layers = sorted({int(k.split(".")[0][1:]) for k in section})
    components = list(dict.fromkeys(k.split(".", 1)[1] for k in section))
    return layers, components


def period_table(section: dict) -> list[dict]:
    """Per component and period: the layers where that period stands above the null."""
    layers, components = _layers_components(section)
    rows = []
    for component in components:
        row = {"component": component}
        for period in PERIODS:
            hits = [layer for layer in layers if _power_ratio(section[f"L{layer}.{component}"]["spectrum"], period) > 1]
            row[f"T={period}"] = ", ".join(map(str, hits)) or "none"
        others = sorted({p for layer in layers for p in section[f"L{layer}.{component}"]["spectrum"]["significant_periods"]
                         if min(abs(p - q) for q in PERIODS) > 0.5})
        row["other periods above the null"] = ", ".join(f"{p:g}" for p in others[:12]) or "none"
        rows.append(row)
    return rows


def period_heatmap(section: dict, title: str) -> go.Figure:
    layers, components = _layers_components(section)
    columns = [f"{c} T={p}" for c in components for p in PERIODS]
    z = [[_power_ratio(section[f"L{layer}.{c}"]["spectrum"], p) for c in components for p in PERIODS] for layer in layers]
    fig = go.Figure(go.Heatmap(z=z, x=columns, y=layers, colorscale="RdBu_r", zmid=1,
                               colorbar_title="power / null"))
    fig.update_layout(title=title, yaxis_title="layer", height=520)
    return fig


def spectra_figure(results: dict, component: str = "resid_post") -> go.Figure:
    section = results["numbers"]
    layers, _ = _layers_components(section)
    picks = sorted({layers[0], layers[len(layers) // 2], layers[-1]})
    fig = go.Figure()
    for layer in picks:
        s = section[f"L{layer}.{component}"]["spectrum"]
        fig.add_trace(go.Scatter(x=s["periods"], y=s["power"], mode="lines", name=f"L{layer} {component}"))
    threshold = section[f"L{picks[0]}.{component}"]["spectrum"]["null_threshold"]
    fig.add_hline(y=threshold, line_dash="dash", annotation_text=f"null (L{picks[0]})")
    fig.update_layout(title="Spectrum over n of h(n) at the number's last token", xaxis_type="log",
                      xaxis_title="period T", yaxis_title="fraction of power")
    return fig


def helix_figure(results: dict, component: str = "resid_post") -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("numbers alone (last token)", "sums (END)"))
    for col, name in enumerate(("numbers", "sums"), start=1):
        section = results[name]
        layers, _ = _layers_components(section)
        for metric, label in (("r2_test", "helix"), ("pca_r2_test", "PCA, same rank")):
            fig.add_trace(go.Scatter(x=layers, y=[section[f"L{l}.{component}"]["helix"][metric] for l in layers],
                                     mode="lines+markers", name=f"{label} ({name})"), row=1, col=col)
    fig.update_layout(title=f"Variance explained on held-out numbers, {component}", yaxis_range=[0, 1])
    return fig


def probe_figure(results: dict, component: str = "resid_post") -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("n mod T (numbers alone)", "(a+b) mod T (END)"))
    for col, name in enumerate(("numbers", "sums"), start=1):
        section = results[name]
        layers, _ = _layers_components(section)
        for t in results["moduli"]:
            for key, dash in (("kappa", None), ("shuffled_kappa", "dot")):
                values = [section[f"L{l}.{component}"]["probes"][str(t)][key] for l in layers]
                fig.add_trace(go.Scatter(
                    x=layers, y=[v["value"] for v in values], mode="lines", line_dash=dash,
                    name=f"T={t}{' shuffled' if dash else ''} ({name})",
                    error_y={"type": "data", "symmetric": False,
                             "array": [v["high"] - v["value"] for v in values],
                             "arrayminus": [v["value"] - v["low"] for v in values]}), row=1, col=col)
    fig.update_layout(title=f"Cohen's κ of mod-T probes on held-out numbers, {component}")
    return fig


def patching_figure(results: dict) -> go.Figure:
    rows = results["subspace_patching"]["rows"]
    fig = go.Figure()
    for arm in ("whole", "helix", "pca", "random"):
        fig.add_trace(go.Scatter(
            x=[r["layer"] for r in rows], y=[r[arm]["value"] for r in rows], mode="lines+markers", name=arm,
            error_y={"type": "data", "symmetric": False, "array": [r[arm]["high"] - r[arm]["value"] for r in rows],
                     "arrayminus": [r[arm]["value"] - r[arm]["low"] for r in rows]}))
    fig.update_layout(title="Patching resid_post at END from another sum: fraction of the logit difference moved",
                      xaxis_title="layer", yaxis_title="fraction moved")
    return fig


def neuron_figure(results: dict) -> go.Figure:
    heur = results["heuristic_neurons"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("census of the top neurons", "knockout accuracy"))
    fig.add_trace(go.Bar(x=list(heur["census"]), y=[c["fraction"] for c in heur["census"].values()],
                         name="fraction"), row=1, col=1)
    for arm in ("ablated", "random"):
        rows = heur["knockout"]
        fig.add_trace(go.Bar(
            x=[r["type"] for r in rows], y=[r[arm]["accuracy"]["value"] for r in rows], name=f"knock out {arm}",
            error_y={"type": "data", "symmetric": False,
                     "array": [r[arm]["accuracy"]["high"] - r[arm]["accuracy"]["value"] for r in rows],
                     "arrayminus": [r[arm]["accuracy"]["value"] - r[arm]["accuracy"]["low"] for r in rows]}),
            row=1, col=2)
    fig.add_hline(y=heur["base_accuracy"]["value"], line_dash="dash", row=1, col=2)
    fig.update_layout(title="Heuristic neurons at END, one-digit a + b", barmode="group")
    return fig


def grid_figure(grids, labels) -> go.Figure:
    n = len(grids)
    cols = min(n, 4) or 1
    rows = max(1, -(-n // cols))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"{l.type}: {l.pattern} ({l.correlation:.2f})"
                                                              for l in labels])
    for i, g in enumerate(grids):
        fig.add_trace(go.Heatmap(z=g.tolist(), showscale=False), row=i // cols + 1, col=i % cols + 1)
    fig.update_layout(title="Top neurons' activation over (a rows, b columns)", height=260 * rows)
    return fig


def _fmt(e: dict) -> str:
    return f"{e['value']:.3f} [{e['low']:.3f}, {e['high']:.3f}] (n={e['n']})"


def write_report(results: dict, out: Path, *, grids, grid_labels) -> None:
    figures = {
        "periods_numbers": period_heatmap(results["numbers"], "Numbers alone: power / null threshold"),
        "periods_sums": period_heatmap(results["sums"], "Sums at END: power / null threshold"),
        "spectra": spectra_figure(results), "helix": helix_figure(results), "probes": probe_figure(results),
        "patching": patching_figure(results), "neurons": neuron_figure(results),
        "grids": grid_figure(grids, grid_labels),
    }
    page = Report("Figures: number representations", results["model"])
    for name, fig in figures.items():
        page.add_figure(fig, heading=name)
    page.save(out / "figures.html")

    report = Report("How the model represents numbers", f"{results['model']}: Fourier features, helix, "
                    f"mod-T probes, heuristic neurons (Zhou et al. 2024; Kantamneni & Tegmark 2025; Nikankin et al. 2025)")
    sp = results["sum_prompts"]
    report.add_text(
        f"Numbers alone: 0..{results['settings']['n_numbers'] - 1} in the context "
        f"{results['settings']['template']!r}, read at the number's last token. Sums: {sp['n']} prompts like "
        f"{sp['example']!r} (a, b in 0..{sp['operand_max']}, every sum {sp['per_result']} times where possible), "
        f"read at END; first-token accuracy {_fmt(sp['accuracy'])}. Spectrum null: shuffled n, "
        f"{results['settings']['n_shuffles']} shuffles, max over frequencies, α = {results['settings']['alpha']}.",
        heading="Data")
    report.add_table(period_table(results["numbers"]), heading="Periods above the null: numbers alone (layers)")
    report.add_table(period_table(results["sums"]), heading="Periods above the null: sums at END (layers)")
    report.add_table([{"matrix": k, "numbers": f"{v['numbers'][0]}..{v['numbers'][1]}",
                       "periods above the null": ", ".join(f"{p:g}" for p in v["spectrum"]["significant_periods"]) or "none"}
                      for k, v in results["token_vectors"].items()], heading="Token embedding / unembedding")
    report.add_figure(figures["periods_numbers"])
    report.add_figure(figures["periods_sums"])
    report.add_figure(figures["spectra"])
    report.add_figure(figures["helix"], heading="Helix vs PCA")
    report.add_figure(figures["probes"], heading="mod-T probes")
    report.add_table([{"component": r["component"], "removed band": r["removed_band"], "frequencies": r["n_frequencies"],
                       "periods": f"{r['periods'][0]}..{r['periods'][1]}", "accuracy": _fmt(r["accuracy"]),
                       "change": _fmt(r["change"])} for r in results["frequency_filter"]["rows"]],
                     heading="Frequency filter (every layer of the component, over the sum)")
    report.add_table([{"layer": r["layer"], "rank": r["rank"], **{a: _fmt(r[a]) for a in ("whole", "helix", "pca", "random")}}
                      for r in results["subspace_patching"]["rows"]], heading="Subspace patching at END")
    report.add_figure(figures["patching"])
    heur = results["heuristic_neurons"]
    report.add_table([{"type": k, **v} for k, v in heur["census"].items()],
                     heading=f"Heuristic census: top {heur['top_k']} neurons by attribution")
    report.add_table([{"type": r["type"], "neurons": r["n_neurons"], "accuracy": _fmt(r["ablated"]["accuracy"]),
                       "change": _fmt(r["ablated"]["change"]), "random: accuracy": _fmt(r["random"]["accuracy"])}
                      for r in heur["knockout"]], heading="Knockout (mean ablation at END)",
                     caption=f"Base accuracy {_fmt(heur['base_accuracy'])}.")
    report.add_figure(figures["neurons"])
    report.add_figure(figures["grids"])
    report.add_table(results["seconds"] | {"wall": results["wall_seconds"]}, heading="Wall time (s)")
    report.add_settings(results["settings"])
    report.save(out / "report.html")
