"""How does the model represent numbers? Fourier features, helix, mod-T probes, heuristic neurons.

    python -m experiments.numbers [--model gemma-3-270m] [--out runs/numbers-<timestamp>] [--overwrite]

1. **numbers alone**: h(n) for n = 0..``--n-numbers``−1 at the number's last token ("{n}"),
   every layer and component; the embedding / unembedding rows of single-token numbers;
2. **sums**: prompts "a + b = " (a, b in 0..``--operand-max``, every sum present
   ``--per-result`` times), h at END per prompt, indexed by the sum;
3. for every (layer, component) of both: Fourier spectrum vs the shuffled-n null, helix
   fit vs PCA of equal rank (held-out numbers), mod-T probes (κ, held-out, vs shuffled labels);
4. **frequency filter** on the sum prompts: remove the low band (periods ≥ ``--low-min-period``),
   the high band (periods ≤ ``--high-max-period``) or, as a control, the mid band between them,
   of every MLP's or every attention layer's output over the sum; first-token accuracy;
5. **helix-subspace patching** at END (resid_post, ``--patch-layers``): pairs of correctly answered
   sum prompts with different first answer digits; helix vs PCA vs random subspace of the
   same dimension vs the whole layer; fraction of the logit difference moved;
6. **heuristic neurons** on the one-digit grid a, b in 0..9: the ``--top-neurons`` END MLP neurons
   by attribution, classified by their (a, b) pattern; mean-ablation knockout per type vs
   as many random neurons;
7. results.json, figures.html and report.html in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time

import numpy as np
import torch

from circuits.heuristics import census, classify_grids
from circuits.loading import load_model
from circuits.number_geometry import HELIX_PERIODS, fit_helix, fourier_spectrum, mod_probe, orthonormal_columns, pca_subspace
from circuits.numbers import (
    COMPONENTS,
    arithmetic_activations,
    arithmetic_prompts,
    group_mean,
    number_activations,
    number_token_vectors,
    pairs_by_result,
    single_token_numbers,
)
from circuits.runs import StageTimer, complete_run, default_run_dir, prepare_run_dir, save_results
from circuits.stats import paired_difference, proportion
from experiments._numbers_report import write_report
from patching.number_interventions import (
    evaluate_end,
    fraction_moved,
    frequency_band,
    frequency_filter_edit,
    neuron_attribution,
    neuron_knockout_edit,
    subspace_patch_edit,
    top_neurons,
)

MODULI = (2, 5, 10)

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--model", default="gemma-3-270m")
parser.add_argument("--n-numbers", type=int, default=400, help="numbers 0..n-1 (a multiple of 100 puts T=2,5,10,100 "
                    "on exact frequencies)")
parser.add_argument("--template", default="{n}", help="context of a number alone; {n} is the number")
parser.add_argument("--components", nargs="+", default=["resid_post", "attn_out", "mlp_out"], choices=list(COMPONENTS),
                    help="resid_pre (= the previous layer's resid_post) and resid_mid are available too")
parser.add_argument("--n-shuffles", type=int, default=50, help="shuffled-n spectra for the null")
parser.add_argument("--alpha", type=float, default=0.05, help="family-wise level of the spectrum null")
parser.add_argument("--operand-max", type=int, default=99)
parser.add_argument("--per-result", type=int, default=1, help="sum prompts per result value")
parser.add_argument("--prefix", default="", help="text before every arithmetic prompt (e.g. solved examples)")
parser.add_argument("--low-min-period", type=float, default=20.0)
parser.add_argument("--high-max-period", type=float, default=10.0)
parser.add_argument("--patch-layers", type=int, nargs="+", default=None, help="default: 4 evenly spaced layers")
parser.add_argument("--n-pairs", type=int, default=32)
parser.add_argument("--top-neurons", type=int, default=100)
parser.add_argument("--heuristic-threshold", type=float, default=0.7)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--device", default=None)
parser.add_argument("--dtype", default=None)
parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default); one thread is "
                    "faster on shared, oversubscribed CPUs")
parser.add_argument("--out", default=None)
parser.add_argument("--overwrite", action="store_true")


def _key(layer: int, component: str) -> str:
    return f"L{layer}.{component}"


def analyse(h: torch.Tensor, values: list[int], args, *, spectrum_rows: torch.Tensor | None = None) -> dict:
    """Spectrum (over ``spectrum_rows``, consecutive values), helix vs PCA and mod-T probes of one representation."""
    spectrum = fourier_spectrum(h if spectrum_rows is None else spectrum_rows, n_shuffles=args.n_shuffles,
                                alpha=args.alpha, seed=args.seed)
    row = {"spectrum": spectrum.to_dict(), "helix": fit_helix(h, values, seed=args.seed).to_dict(), "probes": {}}
    for t in MODULI:
        real = mod_probe(h, values, t, seed=args.seed)
        control = mod_probe(h, values, t, seed=args.seed, shuffle_labels=True)
        row["probes"][t] = {"kappa": real.kappa.to_dict(), "accuracy": real.accuracy,
                            "shuffled_kappa": control.kappa.to_dict()}
    return row


def main(argv: list[str] | None = None) -> dict:
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    start = time.perf_counter()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    out = prepare_run_dir(args.out or default_run_dir("numbers"), overwrite=args.overwrite)
    timer = StageTimer(run_dir=out, results={"model": args.model, "settings": vars(args)})  # results.json per stage
    with timer.stage("load model"):
        model = load_model(args.model, device=args.device, dtype=args.dtype)
    n_layers = model.cfg.n_layers
    keys = [(layer, c) for layer in range(n_layers) for c in args.components]
    results: dict = {"model": args.model, "settings": vars(args), "n_layers": n_layers, "moduli": list(MODULI),
                     "helix_periods": list(HELIX_PERIODS)}

    # ------------------------------------------------------------------------ 1. numbers alone
    numbers = list(range(args.n_numbers))
    with timer.stage("number activations"):
        acts = number_activations(model, numbers, keys, template=args.template, batch_size=args.batch_size)
    with timer.stage("number analyses"):
        results["numbers"] = {_key(*k): analyse(acts[k], numbers, args) for k in keys}
        tokens = {}
        for which in ("embed", "unembed"):
            token_numbers, vectors = number_token_vectors(model, args.n_numbers - 1, which)
            spectrum = fourier_spectrum(vectors, n_shuffles=args.n_shuffles, alpha=args.alpha, seed=args.seed)
            tokens[which] = {"numbers": [token_numbers[0], token_numbers[-1]], "spectrum": spectrum.to_dict()}
        results["token_vectors"] = tokens
    del acts

    # ------------------------------------------------------------------------ 2. sums at END
    pairs = pairs_by_result(args.operand_max, args.per_result, seed=args.seed)
    prompts = arithmetic_prompts(model, pairs, prefix=args.prefix)
    sums = prompts.results
    answer_ids = [r["answer_token_ids"][0] for r in prompts.rows]
    with timer.stage("sum activations"):
        end_acts = arithmetic_activations(model, prompts, keys, batch_size=args.batch_size)
    with timer.stage("sum analyses"):
        results["sums"] = {}
        for k in keys:
            _, means = group_mean(end_acts[k], sums)
            results["sums"][_key(*k)] = analyse(end_acts[k], sums, args, spectrum_rows=means)
    with timer.stage("sum accuracy"):
        base = evaluate_end(model, prompts.tokens(), answer_ids, batch_size=args.batch_size)["correct"]
    results["sum_prompts"] = {"n": len(pairs), "operand_max": args.operand_max, "per_result": args.per_result,
                              "example": prompts.rows[0]["prompt"], "accuracy": proportion(base).to_dict()}
    print(f"sum prompts: {len(pairs)}, first-token accuracy {proportion(base)}")

    # ------------------------------------------------------------------------ 3. frequency filter
    n_values = max(sums) - min(sums) + 1
    # The mid band (periods strictly between the two) is the control: removing about as many
    # frequencies as the low band, but ones neither paper assigns to MLPs or attention.
    bands = {"low": frequency_band(n_values, min_period=args.low_min_period),
             "mid": [k for k in frequency_band(n_values, min_period=args.high_max_period, max_period=args.low_min_period)
                     if args.high_max_period < n_values / k < args.low_min_period],
             "high": frequency_band(n_values, max_period=args.high_max_period)}
    bands = {band: ks for band, ks in bands.items() if ks}
    filters = []
    with timer.stage("frequency filter"):
        for component in ("mlp_out", "attn_out"):
            if component not in args.components:
                continue
            for band, ks in bands.items():
                edits = [frequency_filter_edit(f"blocks.{layer}.hook_{component}", end_acts[(layer, component)],
                                               sums, ks, "remove")[0] for layer in range(n_layers)]
                correct = evaluate_end(model, prompts.tokens(), answer_ids, batch_size=args.batch_size,
                                       edit=lambda chunk, edits=edits: [h for e in edits for h in e(chunk)])["correct"]
                filters.append({"component": component, "removed_band": band, "n_frequencies": len(ks),
                                "periods": [round(n_values / k, 2) for k in (ks[0], ks[-1])],
                                "accuracy": proportion(correct).to_dict(),
                                "change": paired_difference(correct.float(), base.float()).to_dict()})
                print(f"remove {band:4s} frequencies of every {component}: accuracy {proportion(correct)}")
    results["frequency_filter"] = {"n_values": n_values, "bands": {b: len(k) for b, k in bands.items()},
                                   "rows": filters}

    # ------------------------------------------------------------------------ 4. helix-subspace patching
    patch_layers = args.patch_layers or sorted(set(np.linspace(0, n_layers - 1, 4).round().astype(int).tolist()))
    rng = random.Random(args.seed)
    correct_idx = [i for i in range(len(pairs)) if base[i]]
    pair_list = []
    for i in rng.sample(correct_idx, len(correct_idx)):
        options = [j for j in correct_idx if answer_ids[j] != answer_ids[i]]
        if options:
            pair_list.append((i, rng.choice(options)))
        if len(pair_list) == args.n_pairs:
            break
    patching = {"layers": patch_layers, "n_pairs": len(pair_list), "rows": []}
    if pair_list:
        clean_tokens = [prompts.rows[i]["tokens"] for i, _ in pair_list]
        clean_ans = [answer_ids[i] for i, _ in pair_list]
        cf_ans = [answer_ids[j] for _, j in pair_list]
        with timer.stage("subspace patching"):
            ld_clean = evaluate_end(model, clean_tokens, clean_ans, alt_ids=cf_ans)["logit_diff"]
            ld_cf = evaluate_end(model, [prompts.rows[j]["tokens"] for _, j in pair_list], clean_ans,
                                 alt_ids=cf_ans)["logit_diff"]
            for layer in patch_layers:
                h = end_acts[(layer, "resid_post")] if (layer, "resid_post") in end_acts else None
                if h is None:
                    break
                fit = fit_helix(h, sums, test_fraction=0.0)
                helix_q = fit.subspace
                rank = helix_q.shape[1]
                generator = torch.Generator().manual_seed(args.seed + layer)
                arms = {"helix": helix_q, "pca": pca_subspace(h, rank),
                        "random": orthonormal_columns(torch.randn(h.shape[1], rank, generator=generator,
                                                                  dtype=torch.float64)),
                        "whole": None}
                cf_rows = h[[j for _, j in pair_list]]
                row = {"layer": layer, "rank": rank, "helix_r2": fit.r2_train}
                for arm, basis in arms.items():
                    name = f"blocks.{layer}.hook_resid_post"
                    patched = evaluate_end(model, clean_tokens, clean_ans, alt_ids=cf_ans,
                                           edit=subspace_patch_edit(name, cf_rows, basis))["logit_diff"]
                    row[arm] = fraction_moved(ld_clean, ld_cf, patched, seed=args.seed).to_dict()
                patching["rows"].append(row)
                print(f"layer {layer:2d} (rank {rank}): " + ", ".join(
                    f"{a} {row[a]['value']:.2f}" for a in arms))
    results["subspace_patching"] = patching

    # ------------------------------------------------------------------------ 5. heuristic neurons
    del end_acts
    grid_pairs = [(a, b) for a in range(10) for b in range(10)]
    grid = arithmetic_prompts(model, grid_pairs, prefix=args.prefix)
    grid_answers = [r["answer_token_ids"][0] for r in grid.rows]
    digits = list(single_token_numbers(model, 9).values())
    layers = list(range(n_layers))
    with timer.stage("neuron attribution"):
        scores, neuron_acts = neuron_attribution(model, grid.tokens(), grid_answers, layers, candidate_ids=digits,
                                                 batch_size=args.batch_size)
    chosen = top_neurons(scores, layers, min(args.top_neurons, scores.numel()))
    grids = torch.stack([neuron_acts[:, layer, index].reshape(10, 10) for layer, index in chosen])
    labels = classify_grids(grids, threshold=args.heuristic_threshold)
    means = {layer: neuron_acts[:, layer].mean(0) for layer in layers}
    with timer.stage("neuron knockout"):
        grid_base = evaluate_end(model, grid.tokens(), grid_answers)["correct"]
        groups = {kind: [n for n, l in zip(chosen, labels) if l.type == kind] for kind in census(labels)}
        groups["all top neurons"] = list(chosen)
        knockouts = []
        pool = [(layer, i) for layer in layers for i in range(model.cfg.d_mlp) if (layer, i) not in set(chosen)]
        for kind, neurons in groups.items():
            if not neurons:
                continue
            random_neurons = random.Random(args.seed).sample(pool, len(neurons))
            arms = {}
            for arm, group in (("ablated", neurons), ("random", random_neurons)):
                correct = evaluate_end(model, grid.tokens(), grid_answers, edit=neuron_knockout_edit(group, means))["correct"]
                arms[arm] = {"accuracy": proportion(correct).to_dict(),
                             "change": paired_difference(correct.float(), grid_base.float()).to_dict()}
            knockouts.append({"type": kind, "n_neurons": len(neurons), **arms})
            print(f"knock out {len(neurons):3d} {kind:18s}: accuracy {arms['ablated']['accuracy']['value']:.2f} "
                  f"(random {arms['random']['accuracy']['value']:.2f}, base {float(grid_base.float().mean()):.2f})")
    results["heuristic_neurons"] = {
        "grid": "a + b, a and b in 0..9", "n_prompts": len(grid_pairs), "base_accuracy": proportion(grid_base).to_dict(),
        "top_k": len(chosen), "threshold": args.heuristic_threshold, "census": census(labels),
        "neurons": [{"layer": layer, "neuron": i, "score": float(scores[layer, i]), "type": l.type,
                     "pattern": l.pattern, "correlation": l.correlation} for (layer, i), l in zip(chosen, labels)],
        "layer_histogram": {str(layer): sum(1 for lay, _ in chosen if lay == layer) for layer in layers},
        "knockout": knockouts,
    }

    # ------------------------------------------------------------------------ outputs
    results["seconds"] = timer.seconds
    results["wall_seconds"] = round(time.perf_counter() - start, 1)
    save_results(out, results)
    # The report reads what results.json holds (JSON keys are strings), not the in-memory dict.
    write_report(json.loads((out / "results.json").read_text()), out, grids=grids[:12], grid_labels=labels[:12])
    complete_run(out, results)
    print(f"wrote {out}/results.json, figures.html, report.html in {results['wall_seconds']:.0f} s")
    return results


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
