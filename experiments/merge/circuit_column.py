"""The merge experiment's circuit column: does a merge keep each expert's circuit, and does keeping it go with
keeping the task?

For each arithmetic task (``add_word``: addition, ``mul``: multiplication; ``en_fr`` has no counterfactual twins
and no circuit), the expert's EAP-IG edge circuit is found on prompts it answers correctly, and every merge of
all three experts is looked at with :func:`patching.edges.circuit_shift` (expert -> merged model):

* **preservation**: the expert's circuits inside the merged model (its own full and empty runs), as CPR of
  that curve, and the overlap of the merged model's own circuit with the expert's (Jaccard at 5% of the
  edges, Spearman of all edge scores);
* **does preservation predict accuracy?** Spearman's ρ across merge methods between preservation (CPR) and the
  merged model's test accuracy on the task, with a 95% bootstrap interval that resamples both the methods and
  the prompts (the circuit prompts for CPR, the test prompts for accuracy);
* **a contrast that is not normalised**: the same ρ for the merged model's own metric on the circuit prompts
  (its full run, no edge ablated: the answer's logit by default). CPR is a ratio to each model's own full-minus-
  empty difference, so a merge can keep the circuit's share of a weakened answer; the full-run metric shows
  whether the answer itself weakened, and whether that goes with accuracy;
* **which methods keep circuits**: every method's preservation beside its accuracy, so circuit-aware and
  closed-form merges can be set beside task arithmetic, TIES and the spectral methods at similar accuracy.
"""

from __future__ import annotations

import copy
from typing import Callable, NamedTuple

import numpy as np
from scipy.stats import spearmanr

from patching.edges.curves import curve_areas, paired_table_difference, table_faithfulness

TASK_OPS = {"add_word": "+", "mul": "*"}  # tasks with an arithmetic circuit, and its operation


def _preservation_cpr(curve: dict, rows: np.ndarray) -> float:
    """CPR of a transferred curve's per-prompt table restricted to ``rows`` (a prompt resample)."""
    return curve_areas(curve["fractions"], table_faithfulness(np.asarray(curve["table"])[rows]))[0]


def _full_metric(curve: dict, rows: np.ndarray) -> float:
    """The merged model's own metric (full run, no edge ablated) averaged over ``rows`` of the circuit prompts."""
    return float(np.asarray(curve["table"])[rows, -2].mean())


class Predictor(NamedTuple):
    """A per-merge statistic of the circuit prompts whose rank correlation with accuracy is reported."""

    key: str  # the task's results key for the correlation
    row_key: str  # the per-merge estimate in ``rows[name]``
    label: str  # how messages and tables name it
    statistic: Callable  # (transferred curve dict, prompt resample) -> float, for the bootstrap


PREDICTORS = (Predictor("preservation_predicts_accuracy", "preserved_cpr", "preserved CPR", _preservation_cpr),
              Predictor("full_metric_predicts_accuracy", "full_metric", "the full-run metric", _full_metric))


def circuit_column(run, merged_names: list[str], rebuild, n_prompts: int, *, n_bootstrap: int = 500) -> dict:
    """Every merged model of ``merged_names`` (rebuilt by ``rebuild(name) -> state dict``) against each expert's circuit.

    ``run`` is the experiment's run (``experiments.merge.MergeRun``: base model and experts in ``run.state``, results).
    """
    import torch

    from circuits.answer_scoring import first_token_hits
    from circuits.seeds import derived_seed
    from circuits.tasks import TaskConfig, filter_correct, make_dataset
    from patching import ShiftSettings, SweepOptions, circuit_shift

    settings = ShiftSettings(n_bootstrap=n_bootstrap, seed=run.cfg.seed,
                             sweep=SweepOptions(batch_size=run.cfg.eval_batch_size, memory_mb=1024.0))
    out: dict = {"tasks": {}, "n_prompts": n_prompts, "size": settings.size}
    prompts_of = {}  # the prompts each expert answers, chosen with the expert's weights in run.state.work
    for task, op in TASK_OPS.items():
        if task not in run.state.experts:
            continue
        run.state.work.load_state_dict(run.state.experts[task])
        data = make_dataset(run.state.work, TaskConfig(op=op, n_prompts=4 * n_prompts, n_shots=2,
                                                         seed=derived_seed(run.cfg.seed, "expert prompts")))
        mask = first_token_hits(run.state.work, data, run.cfg.eval_batch_size)
        if sum(mask) < 4:
            out["tasks"][task] = {"skipped": f"the {task} expert answers {sum(mask)} of {len(data)} circuit prompts"}
            continue
        kept, _ = filter_correct(run.state.work, data, mask=mask)
        prompts_of[task] = kept.select(range(min(n_prompts, len(kept))))
    for task, prompts in prompts_of.items():
        expert = copy.deepcopy(run.state.base)  # one expert model at a time: each is a full copy of the weights
        expert.load_state_dict(run.state.experts[task])
        rows, reference = {}, None
        for name in merged_names:
            run.state.work.load_state_dict(rebuild(name))
            shift = circuit_shift(expert, run.state.work, prompts, settings, reference_scores=reference, path_patching=False)
            reference = shift.reference_scores
            full = shift.to_dict()
            full["transferred_curve"]["table"] = shift.transferred_curve.table.tolist()
            size = f"{100 * settings.size:g}%"
            # the same prompts in the expert and in the merge: paired, CPR in the merge minus CPR in the expert
            change = paired_table_difference(settings.fractions, shift.transferred_curve.table,
                                             shift.reference_curve.table, n_bootstrap=n_bootstrap, seed=run.cfg.seed)
            rows[name] = {"preserved_cpr": full["transferred_curve"]["cpr"], "own_cpr": full["changed_curve"]["cpr"],
                          "cpr_change": change["cpr"], "kept": _kept(change["cpr"]),
                          "jaccard": full["jaccard"][size], "spearman": full["spearman"],
                          "full_metric": full["transferred_curve"]["full_metric"],
                          "accuracy": run.results["models"][name]["test"]["tasks"][task]["exact_ci"],
                          "_curve": full["transferred_curve"]}
            print(f"circuit of {task} in {name}: preserved CPR {rows[name]['preserved_cpr']['value']:.3f}, Jaccard "
                  f"{rows[name]['jaccard']['value']:.2f}, accuracy {rows[name]['accuracy']['value']:.3f}", flush=True)
        out["tasks"][task] = {"n_prompts": len(prompts), "expert_cpr": full["reference_curve"]["cpr"],
                              "methods": {k: {kk: vv for kk, vv in v.items() if kk != "_curve"} for k, v in rows.items()},
                              # per method and prompt: the expert's circuit at each size in the merge, then its full
                              # and empty runs (paired comparisons of preservation between methods)
                              "fractions": list(settings.fractions),
                              "preserved_tables": {k: v["_curve"]["table"] for k, v in rows.items()},
                              **{p.key: _rank_correlation(run, task, rows, n_bootstrap, p) for p in PREDICTORS},
                              "submodule_vs_baselines": _submodule_vs_baselines(run, task, rows, settings.fractions,
                                                                                n_bootstrap)}
        del expert
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return out


#: the weight-space baselines the submodule merges are set beside (those present in a run)
BASELINES = ("task_arithmetic", "weight_average", "ties", "tsv_m", "iso_c", "iso_cts", "ram", "ramplus_tl", "wudi")


def _kept(cpr_change: dict) -> str:
    """'kept' when the merge's CPR is not below the expert's (the paired interval reaches 0 or above), else 'lost'."""
    return "kept" if cpr_change["high"] >= 0 else "lost"


def _submodule_vs_baselines(run, task: str, rows: dict, fractions, n_bootstrap: int) -> dict:
    """Closed-form and circuit-aware merges minus each baseline: preserved CPR (paired over the circuit prompts)
    beside test accuracy (paired over the test prompts), so that preservation is compared at known accuracy."""
    from circuits.stats import paired_difference

    submodule = [n for n in rows if run.state.recipes[n][0] == "closed form"]  # circuit-aware is a closed form too
    out = {}
    for a in submodule:
        for b in (b for b in BASELINES if b in rows):
            cpr = paired_table_difference(fractions, rows[a]["_curve"]["table"], rows[b]["_curve"]["table"],
                                          n_bootstrap=n_bootstrap, seed=run.cfg.seed)["cpr"]
            hits = [run.results["models"][n]["test"]["tasks"][task]["exact_hits"] for n in (a, b)]
            out[f"{a} minus {b}"] = {"preserved_cpr_difference": cpr,
                                     "accuracy_difference": paired_difference(*hits, seed=run.cfg.seed).to_dict()}
    return out


def _rank_correlation(run, task: str, rows: dict, n_bootstrap: int, predictor: Predictor = PREDICTORS[0]) -> dict:
    """Spearman ρ across methods of a per-merge statistic of the circuit prompts (``rows[name][predictor.row_key]``,
    and ``predictor.statistic`` on a resample) and test accuracy, bootstrapped over methods and prompts."""
    names = list(rows)
    if len(names) < 3:
        return {"skipped": f"{len(names)} merged models: a rank correlation needs at least 3"}
    x_values = np.array([rows[n][predictor.row_key]["value"] for n in names])
    hits = [np.asarray(run.results["models"][n]["test"]["tasks"][task]["exact_hits"], dtype=float) for n in names]
    acc = np.array([h.mean() for h in hits])
    constant = [what for what, v in ((predictor.label, x_values), ("accuracy", acc)) if np.ptp(v) == 0]
    if constant:  # Spearman's rho is undefined, not 0: say why instead of passing scipy's NaN on
        return {"spearman": float("nan"), "undefined": f"{' and '.join(constant)} equal across the "
                f"{len(names)} merged models", "n_methods": len(names)}
    value = float(spearmanr(x_values, acc)[0])
    g = np.random.default_rng(run.cfg.seed)
    n_circuit = len(rows[names[0]]["_curve"]["table"])
    n_test = len(hits[0])
    draws = []
    for _ in range(n_bootstrap):
        methods = g.integers(len(names), size=len(names))
        circuit_rows, test_rows = g.integers(n_circuit, size=n_circuit), g.integers(n_test, size=n_test)
        x = [predictor.statistic(rows[names[m]]["_curve"], circuit_rows) for m in methods]
        y = [hits[m][test_rows].mean() for m in methods]
        if np.ptp(x) > 0 and np.ptp(y) > 0:
            draws.append(spearmanr(x, y)[0])
    low, high = (np.percentile(draws, [2.5, 97.5]) if draws else (float("nan"), float("nan")))
    return {"spearman": value, "low": float(low), "high": float(high), "n_methods": len(names),
            "n_resamples": len(draws), "interval": "95% percentile bootstrap over methods and prompts"}


def _num(e: dict) -> str:
    return f"{e['value']:.3f} ({e['low']:.3f} to {e['high']:.3f})"


def markdown(column: dict) -> str:
    """docs/results.md tables of a run's circuit column: per task, every merge's preservation beside its accuracy,
    the rank correlation, and the submodule merges against the baselines."""
    lines = []
    for task, t in column["tasks"].items():
        if "skipped" in t:
            lines += ["", f"{task}: skipped ({t['skipped']})"]
            continue
        lines += ["", f"**{task}**: the expert's circuit ({t['n_prompts']} prompts, {100 * column['size']:g}% for "
                  f"Jaccard) has CPR {_num(t['expert_cpr'])} in the expert.", "",
                  "| merge | CPR in the merge | minus the expert's (paired) | kept | CPR of its own circuit | "
                  "Jaccard | Spearman | full-run metric | test accuracy |", "|---|---|---|---|---|---|---|---|---|"]
        for name, row in t["methods"].items():
            change = _num(row["cpr_change"]) if "cpr_change" in row else "–"
            metric = _num(row["full_metric"]) if "full_metric" in row else "–"
            lines.append(f"| {name} | {_num(row['preserved_cpr'])} | {change} | {row.get('kept', '–')} | "
                         f"{_num(row['own_cpr'])} | {row['jaccard']['value']:.2f} | {row['spearman']['value']:.2f} | "
                         f"{metric} | {_num(row['accuracy'])} |")
        for predictor in PREDICTORS:
            rank = t.get(predictor.key)
            if rank is None:  # a run older than this predictor
                continue
            if "low" in rank:
                lines += ["", f"Spearman ρ of {predictor.label} and accuracy over {rank['n_methods']} merges: "
                              f"{rank['spearman']:.2f} ({rank['low']:.2f} to {rank['high']:.2f}; {rank['interval']}, "
                              f"{rank['n_resamples']} resamples)."]
            else:
                lines += ["", f"Spearman ρ of {predictor.label} and accuracy: {rank.get('undefined') or rank.get('skipped')}."]
        versus = t.get("submodule_vs_baselines", {})
        if versus:
            lines += ["", "| submodule merge minus baseline | preserved CPR (paired over circuit prompts) | "
                      "test accuracy (paired over test prompts) |", "|---|---|---|"]
            for pair, d in versus.items():
                lines.append(f"| {pair} | {_num(d['preserved_cpr_difference'])} | {_num(d['accuracy_difference'])} |")
    return "\n".join(lines)


def figure(column: dict):
    """Per task: each merge's preserved CPR (x) against its test accuracy (y), both with 95% intervals; the
    dotted line is the expert's own CPR. None when no task was looked at."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    tasks = [(k, t) for k, t in column["tasks"].items() if "skipped" not in t]
    if not tasks:
        return None
    fig = make_subplots(rows=1, cols=len(tasks), subplot_titles=[
        f"{k}: ρ = {t['preservation_predicts_accuracy'].get('spearman', float('nan')):.2f}" for k, t in tasks])
    for col, (task, t) in enumerate(tasks, start=1):
        names = list(t["methods"])
        x = [t["methods"][n]["preserved_cpr"] for n in names]
        y = [t["methods"][n]["accuracy"] for n in names]
        fig.add_trace(go.Scatter(
            x=[e["value"] for e in x], y=[e["value"] for e in y], mode="markers+text", text=names,
            textposition="top center", textfont=dict(size=9), showlegend=False, name=task,
            error_x=dict(type="data", symmetric=False, array=[e["high"] - e["value"] for e in x],
                         arrayminus=[e["value"] - e["low"] for e in x]),
            error_y=dict(type="data", symmetric=False, array=[e["high"] - e["value"] for e in y],
                         arrayminus=[e["value"] - e["low"] for e in y])), row=1, col=col)
        fig.add_vline(x=t["expert_cpr"]["value"], line_dash="dot", row=1, col=col)
        fig.update_xaxes(title_text="CPR of the expert's circuit in the merge", row=1, col=col)
        fig.update_yaxes(title_text=f"{task} test accuracy (exact)", row=1, col=col)
    fig.update_layout(height=480, width=520 * len(tasks), title="Does keeping the expert's circuit go with keeping its task?")
    return fig
