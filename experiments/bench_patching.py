"""Benchmark: this package's patching sweeps vs TransformerLens' activation patching, side by side.

    python -m experiments.bench_patching --n-prompts 64 --out runs/bench_patching

1. Samples few-shot one-digit addition prompts of one template (one token length).
2. Times ``transformer_lens.patching.get_act_patch_attn_head_out_all_pos`` over every head
   (reference tokens as "corrupted", the counterfactual cache as "clean": the counterfactual
   head output is swapped into the reference run), metric = mean answer logit at END.
3. Times ``patching.activation_patch`` on the same sweep and compares the results (max abs diff).
4. Times the full ``patching.path_patch`` sweep (every head and MLP -> logits) and checks it
   against the plain hook-based path patching (one forward per sender) on ``--check-senders`` senders.
5. Times ``patching.attribution_patch`` (every head and MLP from one backward) and reports its
   Spearman rank agreement with exact activation patching (every head) and path patching.
6. Times the knockout curve's sets (top-k heads by path patching and k random heads,
   ``--knockout-seeds`` per k, means over a pool of other prompts) with ``patching.knockout``'s
   fast path, with the fast path minus its top-1 pruning and shared suffix starts, and with the
   plain hook implementation (one full forward per knockout set) on the same prompts and means,
   and checks that every per-prompt hit is equal (``--knockout-only`` runs just this arm).
7. Prints the speed-up ratios and writes everything to ``<out>/results.json`` (atomic write).
"""

from __future__ import annotations

import random
import time

import pandas as pd
import torch
from transformer_lens import patching as tl_patching

from circuits.loading import load_model
from circuits.nodes import all_nodes
from circuits.tasks import make_dataset, single_batch
from circuits.templates import get_templates
from patching.activation_patching import activation_patch
from patching.attribution import attribution_patch, rank_agreement
from patching.knockout import pool_means
from patching.path_patching import path_patch
from circuits.run_dirs import complete_run, prepare_run_dir

from experiments import _cli as cli

parser = cli.make_parser("bench_patching", __doc__)
parser.add_argument("--model", default="gemma-3-270m", help="model name for circuits.loading.load_model")
parser.add_argument("--n-prompts", type=cli.positive_int, metavar="N", default=64, help="prompts in the batch")
parser.add_argument("--n-shots", type=cli.nonnegative_int, metavar="N", default=2, help="few-shot examples before each prompt")
parser.add_argument("--op", default="+", help="arithmetic operation")
parser.add_argument("--check-senders", type=int, default=18, help="senders checked with plain hook path patching (0: none, -1: all)")
parser.add_argument("--tl-layers", default="4", help="layers of the TransformerLens baseline sweep: 'all', a count of "
                    "evenly spaced layers (first and last included), or a comma list; the full-sweep TL time is then "
                    "extrapolated per head (TL runs a full forward per head, whatever its layer)")
cli.add_device_flags(parser, dtype=False)
parser.add_argument("--seed", type=int, default=0, help="data seed")
parser.add_argument("--out", default="runs/bench_patching", help="output folder")
parser.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in --out")
parser.add_argument("--knockout-seeds", type=int, default=3, help="random head sets per k in the knockout arm")
parser.add_argument("--knockout-only", action="store_true", help="run only the knockout arm (and the path patching it ranks by)")


KNOCKOUT_VARIANTS = {  # name: knockout_correct options, timed side by side on the same prompts and means
    "fast": {"method": "prefix"},  # the default: shared starts, no pruned top-1
    "fast_pruned_top1": {"method": "prefix", "prune_top1": True},
    "fast_no_prune_no_share": {"method": "prefix", "prune_top1": False, "share_starts": False},
    "hooks": {"method": "hooks"},
}


def _knockout_arm(model, data, path, n_seeds: int) -> dict:
    """The knockout curve: the fast path, the fast path without its top-1 pruning and shared starts, plain hooks.

    Same prompts, same pooled means; every per-prompt hit of each variant is compared with the hooks'.
    """
    from circuits.nodes import all_heads
    from patching.knockout import knockout_correct

    start = time.perf_counter()
    means = pool_means(model, data, all_heads(model))
    t_means = time.perf_counter() - start
    heads = [n for n, _ in path.ranked("heads", by="neg")]
    sets = [[]]
    for k in (1, 2, 4, 8):  # the sets knockout_curve builds (effect-rank, then n_seeds random draws)
        sets.append(heads[:k])
        sets += [random.Random(s).sample(all_heads(model), k) for s in range(n_seeds)]
    hits, seconds, stats = {}, {}, {}
    for name, options in KNOCKOUT_VARIANTS.items():
        stats[name] = {}
        start = time.perf_counter()
        hits[name] = knockout_correct(model, data, sets, means=means, stats=stats[name], **options)
        seconds[name] = time.perf_counter() - start
        print(f"knockout curve ({name}, {len(sets)} sets x {len(data)} prompts): {seconds[name]:.1f} s")
    equal = {name: bool(torch.equal(h, hits["hooks"])) for name, h in hits.items()}
    speedup = {name: seconds["hooks"] / t for name, t in seconds.items()}
    pruned = stats["fast_pruned_top1"]
    full = pruned.get("full", 0) / max(1, pruned.get("rows", 0))
    print(f"knockout curve speed-up vs plain hooks: fast {speedup['fast']:.1f}x, with the pruned top-1 "
          f"{speedup['fast_pruned_top1']:.1f}x, without pruning and shared starts "
          f"{speedup['fast_no_prune_no_share']:.1f}x; hits equal to the hooks': {equal}; full-vocabulary unembedding "
          f"needed for {full:.1%} of the ablated rows; means over {means.n_prompts} pool prompts took {t_means:.1f} s")
    accuracy = hits["fast"].double().mean(1)
    return {"n_seeds": n_seeds, "n_sets": len(sets), "n_pool": means.n_prompts, "seconds_means": t_means,
            "seconds": seconds, "speedup_vs_hooks": speedup, "equal_hits_vs_hooks": equal,
            "fast_stats": pruned, "full_unembedding_fraction": full,
            "seconds_fast": seconds["fast"], "seconds_hooks": seconds["hooks"], "speedup": speedup["fast"],
            "equal_accuracies": equal["fast"], "sets": [[str(n) for n in s] for s in sets],
            "accuracy_per_set": accuracy.tolist()}


def main(argv: list[str] | None = None) -> None:
    """Run the experiment with command-line flags ``argv`` (default: ``sys.argv``)."""
    args = parser.parse_args(argv)
    out = prepare_run_dir(args.out, overwrite=args.overwrite)  # before the slow part: fail fast on an old run

    torch.manual_seed(args.seed)
    model = load_model(args.model, device=args.device)
    model.eval()
    template = get_templates(args.op, ("equation",))[0]
    # Few-shot answers differ in length, so sample extra prompts and keep the most common token length.
    data = make_dataset(model, op=args.op, n_prompts=4 * args.n_prompts, template_ids=(template.id,), n_shots=args.n_shots,
                        seed=args.seed)
    lengths = data["end_pos"]
    common = max(set(lengths), key=lengths.count)
    keep = [i for i, n in enumerate(lengths) if n == common][: args.n_prompts]
    if len(keep) < args.n_prompts:
        raise SystemExit(f"Only {len(keep)} prompts of one token length; lower --n-prompts.")
    data = data.select(keep)
    batch = single_batch(data, device=model.cfg.device)
    answers = batch.answer_ids
    print(f"{args.n_prompts} prompts of {batch.tokens.shape[1]} tokens, e.g. {batch.prompts[0]!r}")

    def tl_metric(logits):
        return logits[torch.arange(len(answers)), -1, answers].mean()

    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if args.tl_layers == "all":
        tl_layers = list(range(n_layers))
    elif "," in args.tl_layers:
        tl_layers = sorted({int(x) for x in args.tl_layers.split(",")})
    else:
        count = min(int(args.tl_layers), n_layers)
        tl_layers = sorted({round(i * (n_layers - 1) / max(1, count - 1)) for i in range(count)})
    print(f"TransformerLens baseline over the heads of layers {tl_layers}")

    if args.knockout_only:
        path = path_patch(model, batch, metric="logit")
        results = {"model": args.model, "n_prompts": args.n_prompts, "n_shots": args.n_shots,
                   "n_tokens": batch.tokens.shape[1], "device": str(model.cfg.device), "dtype": str(model.cfg.dtype),
                   "knockout": _knockout_arm(model, data, path, args.knockout_seeds)}
        complete_run(out, results)
        print(f"wrote {out / 'results.json'}")
        return

    # -- TransformerLens activation patching of each head at all positions (the baseline)
    start = time.perf_counter()
    with torch.no_grad():
        _, cf_cache = model.run_with_cache(batch.cf_tokens)
        t_tl_cache = time.perf_counter() - start
        if len(tl_layers) == n_layers:
            tl_heads = tl_patching.get_act_patch_attn_head_out_all_pos(model, batch.tokens, cf_cache, tl_metric)
        else:  # the same code path (get_act_patch_attn_head_out_all_pos is this partial) on a subset of heads
            index = pd.DataFrame([(l, h) for l in tl_layers for h in range(n_heads)], columns=["layer", "head"])
            flat = tl_patching.generic_activation_patch(model, batch.tokens, cf_cache, tl_metric,
                                                        patch_setter=tl_patching.layer_head_vector_patch_setter,
                                                        activation_name="z", index_df=index)
            tl_heads = torch.full((n_layers, n_heads), float("nan"))
            tl_heads[tl_layers] = flat.view(len(tl_layers), n_heads).cpu()
    t_tl = time.perf_counter() - start
    del cf_cache
    # TL runs one full forward per head, so its full-sweep time scales with the number of heads.
    t_tl_full = t_tl_cache + (t_tl - t_tl_cache) * n_layers / len(tl_layers)
    print(f"TransformerLens heads sweep on {len(tl_layers)} layers: {t_tl:.1f} s (full sweep: {t_tl_full:.1f} s"
          f"{'' if len(tl_layers) == n_layers else ', extrapolated'})")

    # -- this package: activation patching of the same heads
    start = time.perf_counter()
    act = activation_patch(model, batch, component="z", positions="all", metric="logit", layers=tl_layers)
    t_act = time.perf_counter() - start
    act_diff = float((act.patched[tl_layers] - tl_heads[tl_layers].to(act.patched.device)).abs().max())
    print(f"patching.activation_patch on the same heads: {t_act:.2f} s, max |diff| vs TransformerLens {act_diff:.2e}")

    # -- this package: full path-patching sweep (every head and MLP -> logits)
    start = time.perf_counter()
    path = path_patch(model, batch, metric="logit")
    t_path = time.perf_counter() - start
    print(f"patching.path_patch (fast, {len(all_nodes(model))} senders): {t_path:.2f} s")

    # -- check the fast path against plain hook-based path patching
    senders = all_nodes(model)
    if args.check_senders >= 0:
        step = max(1, len(senders) // max(1, args.check_senders))
        senders = senders[::step][: args.check_senders]
    path_diff, t_slow = None, None
    if senders:
        start = time.perf_counter()
        slow = path_patch(model, batch, senders=senders, method="hooks", metric="logit")
        t_slow = time.perf_counter() - start
        fast = [path.score(n) for n in senders]
        path_diff = max(abs(a - slow.score(n)) for a, n in zip(fast, senders))
        print(f"plain hook path patching on {len(senders)} senders: {t_slow:.1f} s, max |diff| vs fast {path_diff:.2e}")

    # -- attribution patching, and how far its ranking can be trusted on these prompts
    start = time.perf_counter()
    attr = attribution_patch(model, batch, metric="logit")
    t_attr = time.perf_counter() - start
    act_all = act if len(tl_layers) == n_layers else activation_patch(model, batch, component="z", metric="logit")
    agreement = {"vs_activation_patching_heads": rank_agreement(attr, act_all, kind="heads"),
                 "vs_path_patching_heads": rank_agreement(attr, path, kind="heads"),
                 "vs_path_patching_all": rank_agreement(attr, path, kind="all"),
                 "path_vs_activation_patching_heads": rank_agreement(path, act_all, kind="heads")}
    print(f"patching.attribution_patch: {t_attr:.2f} s; Spearman vs activation patching (heads) "
          f"{agreement['vs_activation_patching_heads']['spearman']:.2f}, vs path patching (heads) "
          f"{agreement['vs_path_patching_heads']['spearman']:.2f}, (heads + MLPs) "
          f"{agreement['vs_path_patching_all']['spearman']:.2f}")

    results = {
        "model": args.model,
        "n_prompts": args.n_prompts,
        "n_shots": args.n_shots,
        "n_tokens": batch.tokens.shape[1],
        "device": str(model.cfg.device),
        "dtype": str(model.cfg.dtype),
        "tl_layers": tl_layers,
        "tl_full_sweep_extrapolated": len(tl_layers) != n_layers,
        "seconds": {"transformer_lens_heads_all_pos_measured": t_tl, "transformer_lens_heads_all_pos_full_sweep": t_tl_full, "activation_patch_heads": t_act, "path_patch_full": t_path,
                    "path_patch_hooks_checked": t_slow, "attribution_patch": t_attr},
        "attribution_rank_agreement": agreement,
        "speedup_path_patch_vs_tl": t_tl_full / t_path,
        "speedup_activation_patch_vs_tl": t_tl / t_act,
        "max_abs_diff_activation_patch_vs_tl": act_diff,
        "max_abs_diff_path_fast_vs_hooks": path_diff,
        "path_checked_senders": [str(n) for n in senders],
        "top_heads_path_patching": [[str(n), v] for n, v in path.ranked("heads", by="neg")[:10]],
        "knockout": _knockout_arm(model, data, path, args.knockout_seeds),
    }
    complete_run(out, results)
    print(f"speed-up path patching (full sweep, {len(all_nodes(model))} nodes) vs TL heads sweep (72 heads): {results['speedup_path_patch_vs_tl']:.1f}x")
    print(f"speed-up activation patching vs TL on the same heads: {results['speedup_activation_patch_vs_tl']:.1f}x")
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    cli.run_cli(main, "bench_patching")
