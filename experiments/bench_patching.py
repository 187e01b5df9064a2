"""Benchmark: this package's patching sweeps vs TransformerLens' activation patching, side by side.

    python -m experiments.bench_patching --n-prompts 64 --out runs/bench_patching [--threads 1]

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
   ``--knockout-seeds`` per k, means over a pool of other prompts) with ``patching.node_level.knockout_curves``'s
   fast path, with the fast path minus its screened top-1 (float32 argmax) and shared suffix starts, and with the
   plain hook implementation (one full forward per knockout set) on the same prompts and means,
   and checks that every per-prompt hit is equal (``--knockout-only`` runs just this arm).
7. Prints the speed-up ratios and writes everything to ``<out>/results.json`` (atomic writes, after every
   stage; its ``status`` says ``running``, ``complete`` or ``failed: <stage>: <why>``).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from experiments.runtime import ModelLoader, Run, RunSettings, cli, option, run_experiment
from experiments.runtime.bench_prompts import one_length_prompts
from experiments.runtime.cli import override
from experiments.runtime.settings import PromptSettings

if TYPE_CHECKING:  # the library loads torch: imported where used, so --help answers before it loads
    import torch
    from transformer_lens import HookedTransformer

    from circuits.tasks import TaskBatch
    from patching.sweeps.results import ActivationScores, NodeScores


def layer_spec(text: str) -> str:
    """``all``, a count of layers >= 1, or a comma list of layer indices (returned as given, for the config)."""
    items = [t.strip() for t in text.split(",")]
    if text == "all" or all(t.isdigit() for t in items) and (len(items) > 1 or int(items[0]) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"expected 'all', a number of layers >= 1 or a comma list of layers, got {text!r}")


@dataclass(frozen=True)
class BenchPatchingConfig(PromptSettings, RunSettings):
    """Every flag of ``python -m experiments.bench_patching`` beyond :class:`RunSettings`, with its default."""

    n_prompts: int = override(PromptSettings, "n_prompts", 64, "prompts in the batch")
    n_shots: int = override(PromptSettings, "n_shots", 2)
    op: str = option("+", "arithmetic operation")
    check_senders: int = option(18, "senders checked with plain hook path patching (0: none, -1: all)")
    tl_layers: str = option("4", "layers of the TransformerLens baseline sweep: 'all', a count of evenly spaced layers "
                                 "(first and last included), or a comma list; the full-sweep TL time is then "
                                 "extrapolated per head (TL runs a full forward per head, whatever its layer)",
                            type=layer_spec)
    knockout_seeds: int = option(3, "random head sets per k in the knockout arm", type=cli.nonnegative_int)
    knockout_only: bool = option(False, "run only the knockout arm (and the path patching it ranks by)")


parser = cli.config_parser(BenchPatchingConfig, "bench_patching", __doc__)


def same_length_prompts(model: HookedTransformer, cfg: BenchPatchingConfig):
    """``n_prompts`` few-shot prompts of one template and one token length (one batch, no padding); the batch."""
    from circuits.tasks import single_batch

    data = one_length_prompts(model, op=cfg.op, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, seed=cfg.seed)
    batch = single_batch(data, device=model.cfg.device)
    print(f"{cfg.n_prompts} prompts of {batch.tokens.shape[1]} tokens, e.g. {batch.prompts[0]!r}")
    return data, batch


def tl_layer_subset(spec: str, n_layers: int) -> list[int]:
    """The layers of ``--tl-layers``: all, ``count`` evenly spaced ones (first and last included), or a list."""
    if spec == "all":
        return list(range(n_layers))
    if "," in spec:
        return sorted({int(x) for x in spec.split(",")})
    count = min(int(spec), n_layers)
    return sorted({round(i * (n_layers - 1) / max(1, count - 1)) for i in range(count)})


def time_transformer_lens(model: HookedTransformer, batch: TaskBatch, tl_layers: list[int], seconds: dict) -> torch.Tensor:
    """TransformerLens' activation patching of each head of ``tl_layers`` at all positions (the baseline): [layer, head]."""
    import pandas as pd
    import torch
    from transformer_lens import patching as tl_patching

    answers = batch.answer_ids

    def tl_metric(logits):
        return logits[torch.arange(len(answers)), -1, answers].mean()

    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    start = time.perf_counter()
    with torch.no_grad():
        _, cf_cache = model.run_with_cache(batch.cf_tokens)
        t_cache = time.perf_counter() - start
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
    # TL runs one full forward per head, so its full-sweep time scales with the number of heads.
    t_full = t_cache + (t_tl - t_cache) * n_layers / len(tl_layers)
    seconds |= {"transformer_lens_heads_all_pos_measured": t_tl, "transformer_lens_heads_all_pos_full_sweep": t_full}
    print(f"TransformerLens heads sweep on {len(tl_layers)} layers: {t_tl:.1f} s (full sweep: {t_full:.1f} s"
          f"{'' if len(tl_layers) == n_layers else ', extrapolated'})")
    return tl_heads


def time_activation_patch(model, batch: TaskBatch, tl_layers: list[int], tl_heads: torch.Tensor,
                          seconds: dict) -> tuple[ActivationScores, float]:
    """``patching.activation_patch`` on the same heads as TransformerLens; the max |difference| from TL's."""
    from patching import SweepOptions, activation_patch

    start = time.perf_counter()
    act = activation_patch(model, batch, component="z", positions="all",
                           options=SweepOptions(metric="logit"), layers=tl_layers)
    seconds["activation_patch_heads"] = time.perf_counter() - start
    diff = float((act.patched[tl_layers] - tl_heads[tl_layers].to(act.patched.device)).abs().max())
    print(f"patching.activation_patch on the same heads: {seconds['activation_patch_heads']:.2f} s, "
          f"max |diff| vs TransformerLens {diff:.2e}")
    return act, diff


def time_path_patch(model, batch: TaskBatch, seconds: dict) -> NodeScores:
    """The full path-patching sweep (every head and MLP -> logits) on the fast path."""
    from circuits.nodes import all_nodes
    from patching import SweepOptions, path_patch

    start = time.perf_counter()
    path = path_patch(model, batch, options=SweepOptions(metric="logit"))
    seconds["path_patch_full"] = time.perf_counter() - start
    print(f"patching.path_patch (fast, {len(all_nodes(model))} senders): {seconds['path_patch_full']:.2f} s")
    return path


def check_path_patch(model, batch: TaskBatch, path: NodeScores, n_senders: int, seconds: dict) -> tuple[list, float | None]:
    """Plain hook path patching on ``n_senders`` evenly spread senders (-1: all); the max |difference| from the fast path."""
    from circuits.nodes import all_nodes
    from patching import SweepOptions, path_patch

    senders = all_nodes(model)
    if n_senders >= 0:
        step = max(1, len(senders) // max(1, n_senders))
        senders = senders[::step][:n_senders]
    diff, seconds["path_patch_hooks_checked"] = None, None
    if senders:
        start = time.perf_counter()
        slow = path_patch(model, batch, senders=senders, method="hooks", options=SweepOptions(metric="logit"))
        seconds["path_patch_hooks_checked"] = time.perf_counter() - start
        diff = max(abs(path.score(n) - slow.score(n)) for n in senders)
        print(f"plain hook path patching on {len(senders)} senders: {seconds['path_patch_hooks_checked']:.1f} s, "
              f"max |diff| vs fast {diff:.2e}")
    return senders, diff


def time_attribution_patch(model, batch: TaskBatch, act: ActivationScores, path: NodeScores, tl_layers: list[int],
                           seconds: dict) -> dict:
    """``patching.attribution_patch`` (one backward) and its Spearman agreement with exact activation and path patching."""
    from patching import SweepOptions, activation_patch, attribution_patch
    from patching.node_level.attribution_patching import rank_agreement

    start = time.perf_counter()
    attr = attribution_patch(model, batch, options=SweepOptions(metric="logit"))
    seconds["attribution_patch"] = time.perf_counter() - start
    act_all = act if len(tl_layers) == model.cfg.n_layers else activation_patch(model, batch, component="z",
                                                                                options=SweepOptions(metric="logit"))
    agreement = {"vs_activation_patching_heads": rank_agreement(attr, act_all, kind="heads"),
                 "vs_path_patching_heads": rank_agreement(attr, path, kind="heads"),
                 "vs_path_patching_all": rank_agreement(attr, path, kind="all"),
                 "path_vs_activation_patching_heads": rank_agreement(path, act_all, kind="heads")}
    print(f"patching.attribution_patch: {seconds['attribution_patch']:.2f} s; Spearman vs activation patching (heads) "
          f"{agreement['vs_activation_patching_heads']['spearman']:.2f}, vs path patching (heads) "
          f"{agreement['vs_path_patching_heads']['spearman']:.2f}, (heads + MLPs) "
          f"{agreement['vs_path_patching_all']['spearman']:.2f}")
    return agreement


def compare_sweeps(model, batch: TaskBatch, cfg: BenchPatchingConfig) -> tuple[dict, NodeScores]:
    """TransformerLens vs activation patching, path patching fast vs hooks, attribution patching: results.json keys."""
    tl_layers = tl_layer_subset(cfg.tl_layers, model.cfg.n_layers)
    print(f"TransformerLens baseline over the heads of layers {tl_layers}")
    seconds: dict = {}
    tl_heads = time_transformer_lens(model, batch, tl_layers, seconds)
    act, act_diff = time_activation_patch(model, batch, tl_layers, tl_heads, seconds)
    path = time_path_patch(model, batch, seconds)
    senders, path_diff = check_path_patch(model, batch, path, cfg.check_senders, seconds)
    agreement = time_attribution_patch(model, batch, act, path, tl_layers, seconds)
    return {
        "tl_layers": tl_layers,
        "tl_full_sweep_extrapolated": len(tl_layers) != model.cfg.n_layers,
        "seconds": seconds,
        "attribution_rank_agreement": agreement,
        "speedup_path_patch_vs_tl": seconds["transformer_lens_heads_all_pos_full_sweep"] / seconds["path_patch_full"],
        "speedup_activation_patch_vs_tl": seconds["transformer_lens_heads_all_pos_measured"] / seconds["activation_patch_heads"],
        "max_abs_diff_activation_patch_vs_tl": act_diff,
        "max_abs_diff_path_fast_vs_hooks": path_diff,
        "path_checked_senders": [str(n) for n in senders],
        "top_heads_path_patching": [[str(n), v] for n, v in path.ranked("heads", by="neg")[:10]],
    }, path


KNOCKOUT_VARIANTS = {  # name: knockout_correct options, timed side by side on the same prompts and means
    "fast": {"method": "prefix"},  # the default: shared starts, screened top-1
    "fast_full_argmax": {"method": "prefix", "screen_argmax": False},
    "fast_no_screen_no_share": {"method": "prefix", "screen_argmax": False, "share_starts": False},
    "hooks": {"method": "hooks"},
}


def knockout_arm(model, data, path, n_seeds: int) -> dict:
    """The knockout curve: the fast path, the fast path without its screened top-1 and shared starts, plain hooks.

    Same prompts, same pooled means; every per-prompt hit of each variant is compared with the hooks'.
    """
    import torch

    from circuits.nodes import all_heads
    from patching.node_level.knockout_curves import knockout_correct, pool_means

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
    screened = stats["fast"]
    full = screened.get("full", 0) / max(1, screened.get("rows", 0))
    print(f"knockout curve speed-up vs plain hooks: fast {speedup['fast']:.1f}x, with the float32 argmax "
          f"{speedup['fast_full_argmax']:.1f}x, without the screen and shared starts "
          f"{speedup['fast_no_screen_no_share']:.1f}x; hits equal to the hooks': {equal}; full float32 unembedding "
          f"needed for {full:.1%} of the ablated rows; means over {means.n_prompts} pool prompts took {t_means:.1f} s")
    work = counted_work(model, data, sets, means)
    print(f"counted work (position-layers of the forwards, the float32 unembedding in the same units): plain hooks "
          f"{work['hooks']:,.0f}, fast path {work['fast']:,.0f}: a ceiling of {work['ratio']:.1f}x at equal efficiency")
    accuracy = hits["fast"].double().mean(1)
    return {"counted_work": work, "n_seeds": n_seeds, "n_sets": len(sets), "n_pool": means.n_prompts, "seconds_means": t_means,
            "seconds": seconds, "speedup_vs_hooks": speedup, "equal_hits_vs_hooks": equal,
            "fast_stats": screened, "full_unembedding_fraction": full,
            "seconds_fast": seconds["fast"], "seconds_hooks": seconds["hooks"], "speedup": speedup["fast"],
            "equal_accuracies": equal["fast"], "sets": [[str(n) for n in s] for s in sets],
            "accuracy_per_set": accuracy.tolist()}


def counted_work(model, data, sets, means) -> dict:
    """The work each knockout arm does, counted rather than timed: (rows x positions x layers) of the forwards,
    plus the float32 unembeddings in block-equivalents (its multiply-adds over one block's weights).

    Plain hooks run every set over every position and layer and unembed every row. The fast path runs
    each set from its first ablated layer, over the positions after the prefix that the prompts share
    with the pool, shared suffix starts once; its top-1 is screened in bfloat16 (not counted: the
    float32 rows it falls back to are under 1%). One layout, as :func:`same_length_prompts` gives.
    """
    import torch

    from patching.node_level.knockout_fast import choose_split

    L, (B, n_pos) = model.cfg.n_layers, torch.tensor(data["tokens"]).shape
    tokens = torch.tensor(data["tokens"])
    block_macs = sum(p.numel() for p in model.blocks[0].parameters())
    unembed = model.cfg.d_model * model.cfg.d_vocab / block_macs  # one row's unembedding, in position-layers
    shared = next(iter(means.shared.values()))
    agree = (tokens[:, : len(shared)] == shared[None]).all(0)
    prefix = int((~agree).nonzero()[0]) if (~agree).any() else len(shared)
    prefix = min(prefix, n_pos - 1)
    split = choose_split(tokens[:, prefix:])
    per_set = (len(split.starts) * split.s + B * (n_pos - prefix - split.s)) if split else B * (n_pos - prefix)
    first = [min((h.layer for h in nodes), default=L) for nodes in sets]
    fast = sum((L - f) * per_set for f in first if f < L)
    hooks = len(sets) * B * (n_pos * L + unembed)
    return {"hooks": hooks, "fast": fast, "ratio": hooks / fast, "unembedding_in_position_layers": unembed,
            "prefix": prefix, "suffix_positions": n_pos - prefix}


def run(cfg: BenchPatchingConfig, *, loader: ModelLoader | None = None) -> dict:
    """Run the benchmark; return the results dict that is also written to results.json."""
    # the run folder is prepared before the slow part: an earlier run in --out fails fast
    return run_experiment("bench_patching", cfg, _stages, loader=loader, plan=plan(cfg))


def plan(cfg: BenchPatchingConfig) -> list[str]:
    """The stages a run with these settings goes through, in order (their names as in results.json ``seconds``)."""
    return ["load model", "prompts", "path patching" if cfg.knockout_only else "sweeps", "knockout"]


def _stages(run: Run) -> None:
    from circuits.nodes import all_nodes
    from patching import SweepOptions, path_patch

    cfg, results = run.cfg, run.results
    model = run.load_model()
    model.eval()
    with run.stage("prompts"):
        data, batch = same_length_prompts(model, cfg)
    results |= {"model": cfg.model, "settings": dataclasses.asdict(cfg), "n_prompts": cfg.n_prompts,
                "n_shots": cfg.n_shots, "n_tokens": batch.tokens.shape[1], "device": str(model.cfg.device),
                "dtype": str(model.cfg.dtype)}
    if cfg.knockout_only:
        with run.stage("path patching"):
            path = path_patch(model, batch, options=SweepOptions(metric="logit"))
    else:
        with run.stage("sweeps"):
            sweeps, path = compare_sweeps(model, batch, cfg)
            # the sweeps' own times join the stage times in results["seconds"]
            results["seconds"].update(sweeps.pop("seconds"))
            results |= sweeps
    with run.stage("knockout"):
        results["knockout"] = knockout_arm(model, data, path, cfg.knockout_seeds)
    if not cfg.knockout_only:
        print(f"speed-up path patching (full sweep, {len(all_nodes(model))} nodes) vs TL heads sweep "
              f"({model.cfg.n_layers * model.cfg.n_heads} heads): {results['speedup_path_patch_vs_tl']:.1f}x")
        print(f"speed-up activation patching vs TL on the same heads: {results['speedup_activation_patch_vs_tl']:.1f}x")
    print(f"wrote {run.out / 'results.json'}")


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Run the benchmark with command-line flags ``argv`` (default: ``sys.argv``)."""
    return run(cli.parse_config(parser, BenchPatchingConfig, argv), loader=loader)


if __name__ == "__main__":
    cli.run_cli(main, "bench_patching")
