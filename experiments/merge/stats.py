"""The merge experiment's statistics: whether each expert clears its validation bar, paired bootstrap
intervals of the closed form against the data-free baselines, and the verdict sentence.

Every comparison is paired: the same test prompts (pooled over the tasks) are resampled for both arms
(:func:`circuits.stats.paired_difference`), so the interval reflects the prompts both models saw rather
than two independent samples. Closed-form merges fitted on several sample seeds are compared both per
seed and through the per-prompt mean over seeds (a prompt solved by 2 of 3 seeds counts 2/3).
"""

from __future__ import annotations

from circuits.stats import paired_difference


def expert_bar(models: dict, tasks, target_gain: float) -> dict:
    """Per task: does its expert beat the base by ``target_gain`` and the weight average on its validation split?"""
    bar = {}
    for t in tasks:
        val = {m: models[m]["val"]["tasks"][t]["exact"] for m in ("base", f"expert {t}", "weight_average")
               if "val" in models.get(m, {})}
        expert = val[f"expert {t}"]
        bar[t] = {"val_exact": val, "n_val": models["base"]["val"]["tasks"][t]["n"],
                  "gain_over_base": expert - val["base"], "beats_base_by_target": expert - val["base"] >= target_gain,
                  "beats_weight_average": expert > val["weight_average"] if "weight_average" in val else None}
        print(f"expert bar {t}: " + ", ".join(f"{m} {v:.3f}" for m, v in val.items()))
    return bar


def closed_form_groups(models: dict) -> dict[str, list[str]]:
    """The attn/MLP-level closed-form merges of all three, grouped by positions (all / answer-side) over seeds."""
    groups: dict[str, list[str]] = {}
    for name, entry in models.items():
        if name.startswith("closed form (attn_mlp") and "[" not in name:
            groups.setdefault(entry.get("positions", "all"), []).append(name)
    return groups


def compare(models: dict, tasks) -> dict:
    """Paired bootstrap intervals over the pooled test prompts: attn/MLP closed form (each seed, and the per-prompt
    mean over seeds) minus task arithmetic, weight averaging and TIES; the spread of the closed form over seeds."""
    hits = lambda name: [h for t in tasks for h in models[name]["test"]["tasks"][t]["exact_hits"]]  # noqa: E731
    references = [m for m in ("task_arithmetic", "weight_average", "ties") if m in models]
    out = {}
    for positions, names in closed_form_groups(models).items():
        per_seed = [hits(n) for n in names]
        mean_hits = [sum(col) / len(col) for col in zip(*per_seed)]
        accs = [sum(h) / len(h) for h in per_seed]
        out[positions] = {
            "models": names, "seed_accuracies": accs, "seed_mean": sum(accs) / len(accs),
            "seed_spread": max(accs) - min(accs),
            "minus": {ref: {"seed_mean": paired_difference(mean_hits, hits(ref)).to_dict(),
                            "per_seed": [paired_difference(h, hits(ref)).to_dict() for h in per_seed]}
                      for ref in references}}
        for ref in references:
            print(f"closed form (attn_mlp, {positions}) - {ref}: {out[positions]['minus'][ref]['seed_mean']}")
    return out


def verdict_text(results: dict, circuit_aware: str) -> str:
    """Closed form at attn/MLP level vs task arithmetic (paired interval; mean over seeds), per fitted positions;
    circuit-aware vs attn/MLP."""
    models, parts = results["models"], []
    for positions, c in results.get("comparisons", {}).items():
        diff = c["minus"].get("task_arithmetic", {}).get("seed_mean")
        if diff is None:
            continue
        word = "beats" if diff["low"] > 0 else "is below" if diff["high"] < 0 else "is not distinguishable from"
        parts.append(f"attn/MLP-level closed form ({positions} positions, {len(c['models'])} seed(s)) "
                     f"{word} task arithmetic: difference {diff['value']:+.3f} (95% CI {diff['low']:+.3f} to "
                     f"{diff['high']:+.3f}, n={diff['n']} test prompts).")
    circ, am = models.get(circuit_aware), models.get("closed form (attn_mlp)")
    if circ is not None and am is not None:
        a, b = circ["test"]["avg"], am["test"]["avg"]
        parts.append(f"Circuit-aware {a:.3f} vs attn/MLP {b:.3f}: {'helps' if a > b else 'does not help'}.")
    return " ".join(parts)


def _pct(estimate: dict) -> str:
    """``57.5 (48.6–66.0)``: a proportion or difference in points with its 95% interval."""
    return f"{100 * estimate['value']:.1f} ({100 * estimate['low']:.1f} to {100 * estimate['high']:.1f})"


def check_tables_of(results, path) -> None:
    """Raise :class:`circuits.errors.InputError` naming ``path`` unless ``results`` holds the models table that
    :func:`markdown_summary` reads: a ``--config`` run, a failed run or another experiment's results.json does not."""
    from circuits.errors import InputError

    models = results.get("models") if isinstance(results, dict) else None
    if not isinstance(models, dict) or not all(isinstance(e, dict) for e in models.values()):
        what = "no 'models' table" if models is None else f"'models' as a {type(models).__name__}, not a table"
        raise InputError(f"{path} holds {what}: it is not the results of a merge experiment run (a --config run "
                         "merges one YAML and has no tables; a failed run may stop before any). Pass the --out folder "
                         "of a `python -m experiments.merge` run without --config.")
    for name, entry in models.items():
        test = entry.get("test")
        if test is not None and not (isinstance(test, dict) and isinstance(test.get("tasks"), dict)
                                     and isinstance(test.get("pooled"), dict)):
            raise InputError(f"{path}: models[{name!r}].test lacks its 'tasks' and 'pooled' accuracies; the file "
                             "was edited or written by another version. Run the experiment again.")


def markdown_summary(results: dict, tasks) -> str:
    """docs/results.md tables of a run's results.json: the experts' validation bar, test accuracy per model with
    Wilson intervals, the closed form over seeds, the paired differences, and the claim row (Dai et al.)."""
    models, lines = results["models"], []
    if "expert_bar" in results:
        lines += ["| task | base (val) | expert (val) | weight average (val) | gain | +target and > WA | n val |",
                  "|---|---|---|---|---|---|---|"]
        for t, b in results["expert_bar"].items():
            v = b["val_exact"]
            met = b["beats_base_by_target"] and bool(b["beats_weight_average"])
            lines.append(f"| {t} | {100 * v['base']:.1f} | {100 * v[f'expert {t}']:.1f} | "
                         f"{100 * v['weight_average']:.1f} | {100 * b['gain_over_base']:+.1f} | "
                         f"{'yes' if met else 'no'} | {b['n_val']} |" if "weight_average" in v else
                         f"| {t} | {100 * v['base']:.1f} | {100 * v[f'expert {t}']:.1f} | – | "
                         f"{100 * b['gain_over_base']:+.1f} | – | {b['n_val']} |")
        lines.append("")
    lines += ["| model | " + " | ".join(tasks) + " | pooled (95% CI) | n |", "|---|" + "---|" * (len(tasks) + 2)]
    for name, e in models.items():
        if e.get("test") is None:
            continue
        cells = [_pct(e["test"]["tasks"][t]["exact_ci"]) if t in e["test"]["tasks"] else "–" for t in tasks]
        config = f" ({e['config']})" if isinstance(e.get("config"), dict) else ""
        lines.append(f"| {name}{config} | " + " | ".join(cells) + f" | {_pct(e['test']['pooled'])} | "
                     f"{e['test']['pooled']['n']} |")
    for positions, c in results.get("comparisons", {}).items():
        lines += ["", f"Closed form (attn/MLP, {positions} positions): per-seed pooled accuracy "
                  + ", ".join(f"{100 * a:.1f}" for a in c["seed_accuracies"])
                  + f"; mean {100 * c['seed_mean']:.1f}, spread (max − min) {100 * c['seed_spread']:.1f} points.", "",
                  "| closed form − | mean over seeds (95% paired CI) | per seed |", "|---|---|---|"]
        for ref, d in c["minus"].items():
            lines.append(f"| {ref} | {_pct(d['seed_mean'])} | " + "; ".join(_pct(x) for x in d["per_seed"]) + " |")
    diff = results.get("comparisons", {}).get("all", {}).get("minus", {}).get("task_arithmetic", {}).get("seed_mean")
    if diff is not None:
        verdict = "reproduced" if diff["low"] > 0 else "not reproduced (below)" if diff["high"] < 0 else \
            "not reproduced (no difference resolved)"
        lines += ["", "| claim | paper | ours (95% CI) | verdict |", "|---|---|---|---|",
                  f"| closed-form attn/MLP merge beats task arithmetic | 51.05 vs 48.24 (Llama-2-13B) | "
                  f"{_pct(diff)} points, n = {diff['n']} | {verdict} on gemma-3-270m |"]
    if "circuit_column" in results:
        from experiments.merge.circuit_column import markdown

        lines += ["", "The circuit column:", markdown(results["circuit_column"])]
    return "\n".join(lines)
