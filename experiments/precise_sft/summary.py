"""Summaries of ``python -m experiments.precise_sft``: test scores with intervals, the claim, the table and the report.

Every number carries its 95% interval: test accuracy (Wilson), the gain over the base model
(paired bootstrap over prompts), drift on non-math text (bootstrap over texts), and the claim
"precise SFT >= full SFT's gain with less drift" as paired differences (precise - full).
"""

from __future__ import annotations

from pathlib import Path

from circuits.show.html_report import Report
from finetune.evaluate import accuracy_estimate, drift_estimates, paired_comparison


def score_summary(scores: dict, base_scores: dict | None) -> dict:
    """Test accuracy (Wilson), gain over base (paired bootstrap), drift (bootstrap over texts), as JSON."""
    out = {f"{family}_exact": accuracy_estimate(scores["math"], family).to_dict() for family in ("heldout", "transfer")}
    out["drift_estimates"] = {k: e.to_dict() for k, e in drift_estimates(scores["drift"]["per_text"]).items()}
    if base_scores is not None:
        for family in ("heldout", "transfer"):
            out[f"{family}_gain"] = paired_comparison(scores, base_scores, family=family)["accuracy"].to_dict()
    return out


def claim(precise: dict, full: dict) -> dict:
    """'precise SFT >= full SFT's gain with less drift' as paired differences (precise - full) and a verdict."""
    diff = paired_comparison(precise, full)
    acc, kl = diff["accuracy"], diff["kl"]
    gain = "higher" if acc.low > 0 else "lower" if acc.high < 0 else "not distinguishable"
    drift = "less" if kl.high < 0 else "more" if kl.low > 0 else "not distinguishable"
    verdict = "reproduced" if gain != "lower" and drift == "less" else "not reproduced"
    return {"gain_difference": acc.to_dict(), "kl_difference": kl.to_dict(),
            "lm_loss_increase_difference": diff["lm_loss_increase"].to_dict(),
            "gain_vs_full": gain, "drift_vs_full": drift, "verdict": verdict}


#: (a, b) pairs whose circuit preservation is compared, a − b on the same shift prompts
PRESERVATION_PAIRS = (("precise", "full"), ("precise", "lora"), ("precise_nokv", "full"), ("precise_circuit", "precise"),
                      ("precise_circuit", "full"), ("precise_circuit", "lora"), ("circuit_lora", "lora"),
                      ("circuit_lora", "precise"), ("circuit_lora", "full"))

#: (circuit-LoRA arm, run it is compared with): LoRA everywhere (same rank), precise SFT (same heads), full SFT;
#: and the arm without K/V rows against the one with them (the same adapters otherwise)
CIRCUIT_LORA_PAIRS = (("circuit_lora", "lora"), ("circuit_lora", "precise"), ("circuit_lora", "full"),
                      ("circuit_lora_nokv", "circuit_lora"), ("circuit_lora_nokv", "precise"))


def circuit_lora_comparison(runs: dict) -> dict:
    """Each pair of :data:`CIRCUIT_LORA_PAIRS` that ran, a minus b: held-out accuracy gain, KL and LM-loss
    drift as paired differences (bootstrap over prompts and texts), and the ratio of trained entries."""
    out = {}
    for arm, other in CIRCUIT_LORA_PAIRS:
        if arm in runs and other in runs:
            diff = paired_comparison(runs[arm], runs[other])
            out[f"{arm} minus {other}"] = {
                "gain_difference": diff["accuracy"].to_dict(), "kl_difference": diff["kl"].to_dict(),
                "lm_loss_increase_difference": diff["lm_loss_increase"].to_dict(),
                "trained_ratio": runs[arm]["train"]["n_trainable"] / runs[other]["train"]["n_trainable"]}
    return out


def preservation_comparisons(runs: dict, *, n_bootstrap: int = 1000, seed: int = 0) -> dict:
    """Does one tuning method keep the base circuit more than another? For each pair of
    :data:`PRESERVATION_PAIRS` whose runs both hold a circuit shift with per-prompt tables: the base circuit's
    CPR and CMD inside the first tuned model minus inside the second, paired bootstrap over the shift prompts
    (each side's faithfulness is measured against its own tuned model's full and empty runs), with the
    Jaccard indices at the compared size beside them (no interval: one score per model)."""
    from patching.edges.curves import paired_table_difference

    shifts = {name: r["circuit_shift"] for name, r in runs.items()
              if "transferred_table" in r.get("circuit_shift", {})}
    out = {}
    for a, b in PRESERVATION_PAIRS:
        if a in shifts and b in shifts:
            diff = paired_table_difference(shifts[a]["transferred_fractions"], shifts[a]["transferred_table"],
                                           shifts[b]["transferred_table"], n_bootstrap=n_bootstrap, seed=seed)
            out[f"{a} minus {b}"] = {"cpr_difference": diff["cpr"], "cmd_difference": diff["cmd"],
                                     "jaccard": {a: shifts[a]["jaccard_at_size"]["value"],
                                                 b: shifts[b]["jaccard_at_size"]["value"]},
                                     "n_prompts": shifts[a]["n_prompts"]}
    return out


def _fmt(e: dict, pct: bool = True, signed: bool = False) -> str:
    f = (lambda x: f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}") if pct else (lambda x: f"{x:.4f}")
    return f"{f(e['value'])} [{f(e['low'])}, {f(e['high'])}]"


def print_table(results: dict) -> None:
    """One line per run: test accuracy (Wilson), gain over base (paired bootstrap), KL (bootstrap), trained entries."""
    rows = [("base", results["base"])] + list(results["runs"].items())
    width = max(16, *(len(name) for name, _ in rows))
    print(f"\n{'run':{width}s} {'lr':>7s} {'held-out exact %':>22s} {'gain (points)':>22s} {'transfer %':>20s} "
          f"{'KL on text':>26s} {'trained':>11s}")
    for name, r in rows:
        s = r["summary"]
        gain = _fmt(s["heldout_gain"], signed=True) if "heldout_gain" in s else "-"
        trained = f"{r['train']['n_trainable']:,}" if "train" in r else "-"
        lr = f"{r['lr']:.0e}" if "lr" in r else "-"
        print(f"{name:{width}s} {lr:>7s} {_fmt(s['heldout_exact']):>22s} {gain:>22s} {_fmt(s['transfer_exact']):>20s} "
              f"{_fmt(s['drift_estimates']['kl'], pct=False):>26s} {trained:>11s}")
    for arm, c in results.get("claims", {}).items():
        print(f"claim ({arm} vs full): gain difference {_fmt(c['gain_difference'], signed=True)} points, "
              f"KL difference {_fmt(c['kl_difference'], pct=False)}: {c['verdict']}")
    for pair, d in results.get("circuit_lora_comparison", {}).items():
        print(f"{pair}: gain difference {_fmt(d['gain_difference'], signed=True)} points, KL difference "
              f"{_fmt(d['kl_difference'], pct=False)}, {d['trained_ratio']:.3g}x the trained entries")
    shifted = _shifted_runs(results)
    if shifted:
        first = shifted[0][1]
        print(f"\nthe base circuit ({first['n_prompts']} addition prompts) inside each tuned model "
              f"(in the base: CPR {_fmt(first['reference_cpr'], pct=False)}):")
        for name, sh in shifted:
            print(f"  {name:16s} CPR {_fmt(sh['transferred_cpr'], pct=False)}  CMD {_fmt(sh['transferred_cmd'], pct=False)}"
                  f"  Jaccard at {100 * sh['size']:g}% {sh['jaccard_at_size']['value']:.2f}  Spearman "
                  f"{sh['spearman']['value']:.2f}")
    for pair, d in results.get("circuit_preservation", {}).items():
        print(f"  {pair}: CPR {_fmt(d['cpr_difference'], pct=False)}, CMD {_fmt(d['cmd_difference'], pct=False)}")
    print(f"\nwall time {results['wall_seconds'] / 60:.1f} min over {len(results['wall_seconds_by_command'])} command(s)")


def write_report(out: Path, results: dict, model_name: str, settings: dict) -> None:
    """report.html: gain against drift per run and the validation accuracy per learning rate."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("test accuracy gain vs drift (95% CI)",
                                                        "validation accuracy per learning rate"))
    for name, r in results["runs"].items():
        s = r["summary"]
        gain, kl = s["heldout_gain"], s["drift_estimates"]["kl"]
        fig.add_trace(go.Scatter(
            x=[kl["value"]], y=[100 * gain["value"]], mode="markers+text", text=[name], textposition="top center",
            name=name, showlegend=False,
            error_y=dict(type="data", symmetric=False, array=[100 * (gain["high"] - gain["value"])],
                         arrayminus=[100 * (gain["value"] - gain["low"])]),
            error_x=dict(type="data", symmetric=False, array=[kl["high"] - kl["value"]],
                         arrayminus=[kl["value"] - kl["low"]])), row=1, col=1)
    for method, search in results["lr_search"].items():
        lrs = [v["lr"] for v in search["by_lr"].values()]
        vals = [v["validation_exact"] for v in search["by_lr"].values()]
        fig.add_trace(go.Scatter(x=lrs, y=[100 * v["value"] for v in vals], mode="lines+markers", name=method,
                                 error_y=dict(type="data", symmetric=False,
                                              array=[100 * (v["high"] - v["value"]) for v in vals],
                                              arrayminus=[100 * (v["value"] - v["low"]) for v in vals])), row=1, col=2)
    fig.update_xaxes(title_text="KL(base || tuned) per token, non-math text", row=1, col=1)
    fig.update_yaxes(title_text="held-out exact accuracy gain (points)", row=1, col=1)
    fig.update_xaxes(title_text="learning rate", type="log", row=1, col=2)
    fig.update_yaxes(title_text="validation exact accuracy (%)", row=1, col=2)
    fig.update_layout(title=f"Precise vs full SFT vs LoRA on {model_name}", height=450, width=1000)
    report = Report(f"Precise SFT vs full SFT vs LoRA: {model_name}")
    report.add_figure(fig)
    if results.get("circuit_lora_comparison"):
        report.add_table([{"comparison": pair, "gain difference (points)": _fmt(d["gain_difference"], signed=True),
                           "KL difference": _fmt(d["kl_difference"], pct=False),
                           "trained entries (ratio)": f"{d['trained_ratio']:.3g}"}
                          for pair, d in results["circuit_lora_comparison"].items()],
                         heading="Circuit LoRA: adapters on the key heads only",
                         caption="Paired differences with 95% bootstrap intervals (over test prompts for the gain, "
                                 "over texts for the KL); each run at its validation-chosen lr.")
    preservation = preservation_figure(results)
    if preservation is not None:
        report.add_figure(preservation, caption=(
            f"The base model's addition circuit (EAP-IG, {_shifted_runs(results)[0][1]['n_prompts']} prompts) at MIB's sizes, evaluated inside "
            "each tuned model against that model's own full and empty runs: CPR (higher: more faithful) and CMD "
            "(lower: closer to the full model), with 95% bootstrap intervals over prompts; the dashed line is the "
            "base circuit in the base model. Paired differences between methods: results.json, "
            "circuit_preservation."))
    report.add_settings(settings)
    report.save(out / "report.html")


def preservation_figure(results: dict):
    """CPR and CMD of the base circuit inside each tuned model, with intervals (None without circuit shifts)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    shifted = _shifted_runs(results)
    if not shifted:
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=("CPR of the base circuit in the tuned model",
                                                        "CMD of the base circuit in the tuned model"))
    names = [name for name, _ in shifted]
    for col, key in ((1, "transferred_cpr"), (2, "transferred_cmd")):
        values = [sh[key] for _, sh in shifted]
        fig.add_trace(go.Bar(x=names, y=[v["value"] for v in values], showlegend=False,
                             error_y=dict(type="data", symmetric=False, array=[v["high"] - v["value"] for v in values],
                                          arrayminus=[v["value"] - v["low"] for v in values])), row=1, col=col)
    reference = shifted[0][1]["reference_cpr"]["value"]
    fig.add_hline(y=reference, line_dash="dash", row=1, col=1, annotation_text="in the base model")
    fig.update_layout(height=400, width=1000, title="Does tuning keep the base model's circuit?")
    return fig


def _shifted_runs(results: dict) -> list[tuple[str, dict]]:
    """``(method, circuit_shift)`` of every run that measured one (``--shift-prompts``), in run order."""
    return [(name, r["circuit_shift"]) for name, r in results["runs"].items()
            if "transferred_cpr" in r.get("circuit_shift", {})]
