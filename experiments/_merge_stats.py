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
