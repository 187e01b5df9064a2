"""Benchmark: edge attribution, faithfulness curves and exact edge patching, side by side with hannamw/EAP-IG.

    python -m experiments.bench_circuits --out runs/bench_circuits
    python -m experiments.bench_circuits --exact-edges all --out runs/bench_circuits_full   # every edge exactly

1. Samples few-shot addition prompts of one template and one token length (default 32).
2. Times ``patching.edge_attribution`` (EAP-IG-inputs, ``--ig-steps`` steps, and EAP) over every edge.
3. When hannamw/EAP-IG is importable (see ``experiments/_eap_ig_arm.py``), times its ``attribute`` on the
   same prompts in this process and reports the largest score difference relative to the largest score
   (over all edges, and over the edges whose sender is not a head: on models with norms after attention
   the two tools' head outputs differ by design, see docs/methods.md). Otherwise the arm is skipped.
4. Times ``patching.faithfulness_curve`` at MIB's ten sizes (top-n by |EAP-IG score|, pruned as MIB
   prunes) and, with EAP-IG, its ``evaluate_graph`` on the same circuits; reports both curves.
5. Exact edge patching (``patching.edge_patch``) of ``--exact-edges`` edges (a seeded random sample, or
   ``all``): time, and Spearman rank correlation of EAP and EAP-IG scores with the exact effects, over
   those edges and over the top 1% of them by |exact effect|. With ``all``, the exact effects are saved
   (``<out>/exact_edges.safetensors``: per-prompt effects and edge indices; ``<out>/exact_edges_eap.json``:
   the mean effects as an EAP-IG graph file).
6. Speed-up of ``edge_patch``'s fast path over its hook path (``fast=False``), both timed in this run on
   the same stratified sample: ``--compare-per-stratum`` edges per (receiver layer, receiver kind).
7. Prints a table and writes everything to ``<out>/results.json`` (atomic write).
"""

from __future__ import annotations

import os
import time

import torch
from safetensors.torch import save_file
from scipy.stats import spearmanr

from circuits.graph import GraphLayout
from circuits.graph_io import save_eap_json
from circuits.graph_selection import mib_selector
from circuits.loading import load_model
from circuits.run_dirs import prepare_run_dir, write_json_atomic
from circuits.tasks import make_dataset, single_batch
from circuits.templates import get_templates
from experiments import _cli as cli
from experiments import _eap_ig_arm
from patching.edge_attribution import edge_attribution
from patching._edge_fast import receiver_kind
from patching.edge_patching import EdgeEffects, edge_patch
from patching.faithfulness import MIB_FRACTIONS, faithfulness_curve

parser = cli.make_parser("bench_circuits", __doc__)
parser.add_argument("--model", default="gemma-3-270m", help="model name for circuits.loading.load_model")
parser.add_argument("--n-prompts", type=cli.positive_int, metavar="N", default=32,
                    help="prompts (one template, one token length)")
parser.add_argument("--n-shots", type=cli.nonnegative_int, metavar="N", default=2, help="few-shot examples before each prompt")
parser.add_argument("--op", default="+", help="arithmetic operation")
parser.add_argument("--ig-steps", type=cli.positive_int, metavar="N", default=5, help="EAP-IG integration steps")
parser.add_argument("--eap-ig-batch-size", type=cli.positive_int, metavar="N", default=8, help="batch size of the EAP-IG arm")
parser.add_argument("--exact-edges", default="300",
                    help="edges patched exactly: a count (seeded random sample), 'all', or 0 for none")
parser.add_argument("--compare-per-stratum", type=cli.nonnegative_int, metavar="N", default=2,
                    help="edges per (receiver layer, q/k/v/mlp/logits) stratum timed on edge_patch's fast and hook "
                         "paths side by side (0: skip)")
parser.add_argument("--no-eap-ig", action="store_true", help="skip the hannamw/EAP-IG arm even if importable")
parser.add_argument("--no-curve", action="store_true", help="skip the faithfulness curves")
parser.add_argument("--memory-mb", type=cli.positive_float, metavar="MB", default=2048,
                    help="activation budget per batched forward")
parser.add_argument("--threads", type=cli.nonnegative_int, metavar="N", default=1,
                    help="torch CPU threads (0: torch's default). 1 by default: on a machine shared with other "
                         "processes, multi-threaded ops wait for descheduled threads (one gemma-3-270m block on "
                         "32x5 tokens took 0.90 s with 2 threads and 0.066 s with 1 at load average 5)")
cli.add_device_flags(parser, dtype=False)
parser.add_argument("--seed", type=int, default=0, help="data and edge-sample seed")
parser.add_argument("--out", default="runs/bench_circuits", help="output folder")
parser.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in --out")


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def _prompts(model, args):
    template = get_templates(args.op, ("equation",))[0]
    # few-shot answers differ in length: sample extra prompts and keep the most common token length
    data = make_dataset(model, op=args.op, n_prompts=4 * args.n_prompts, template_ids=(template.id,),
                        n_shots=args.n_shots, seed=args.seed)
    lengths = data["end_pos"]
    common = max(set(lengths), key=lengths.count)
    keep = [i for i, n in enumerate(lengths) if n == common][: args.n_prompts]
    if len(keep) < args.n_prompts:
        raise SystemExit(f"Only {len(keep)} prompts of one token length; lower --n-prompts.")
    return data.select(keep)


def _relative_differences(layout: GraphLayout, ours, theirs) -> dict:
    real = layout.real_edge_mask
    head_rows = torch.zeros(layout.n_forward, dtype=torch.bool)
    head_rows[[layout.head_forward(l, h) for l in range(layout.n_layers) for h in range(layout.n_heads)]] = True
    scale = float(theirs[real].abs().max())
    diff = (ours - theirs).abs()
    return {"max_rel_diff_all_edges": float(diff[real].max()) / scale,
            "max_rel_diff_non_head_senders": float(diff[real & ~head_rows[:, None]].max()) / scale,
            "max_rel_diff_head_senders": float(diff[real & head_rows[:, None]].max()) / scale,
            "largest_abs_score": scale}


def _spearman(a, b) -> float:
    return float(spearmanr(a.numpy(), b.numpy())[0])


def _rank_agreement(scores: dict, truth) -> dict:
    """Spearman of each method's scores with the exact effects, over all given edges and the top 1% by |exact|."""
    top = truth.abs().argsort(descending=True)[: max(3, len(truth) // 100)]
    out = {"n_edges": len(truth), "n_top_1pct": len(top)}
    for name, values in scores.items():
        out[name] = _spearman(values, truth)
        out[f"{name}_top_1pct"] = _spearman(values[top], truth[top])
    return out


def _strata(layout: GraphLayout, per_stratum: int, seed: int) -> list[tuple[int, int]]:
    """A seeded sample of ``per_stratum`` edges per (receiver layer, receiver kind) stratum, in index order."""
    strata: dict = {}
    for f, b in layout.real_edge_mask.nonzero().tolist():
        key = "logits" if b == layout.logits_backward else receiver_kind(layout, b)[:2]
        strata.setdefault(key, []).append((f, b))
    g = torch.Generator().manual_seed(seed)
    picked = [edges[i] for edges in strata.values() for i in torch.randperm(len(edges), generator=g)[:per_stratum].tolist()]
    return sorted(picked)


def _exact_in_parts(model, layout: GraphLayout, edges, batch, memory_mb: float, out, results: dict) -> EdgeEffects:
    """``edge_patch`` of ``edges`` in parts of three receiver layers, last layers first, noting progress in
    ``<out>/results.json`` after each part (a run stopped by a time limit still says how far it got)."""
    part_of = {}
    for f, b in edges:
        layer = layout.n_layers if b == layout.logits_backward else receiver_kind(layout, b)[0]
        part_of.setdefault((layout.n_layers - layer) // 3, []).append((f, b))
    parts, done, clock = [], 0, time.perf_counter()
    for key in sorted(part_of):
        parts.append(edge_patch(model, part_of[key], batch, memory_mb=memory_mb))
        done += len(part_of[key])
        results["exact_progress"] = {"n_edges_done": done, "n_edges": len(edges), "seconds": time.perf_counter() - clock}
        write_json_atomic(out / "results.json", results)
    seconds: dict = {}
    for part in parts:
        for stage, value in part.seconds.items():
            seconds[stage] = seconds.get(stage, 0.0) + value
    reference = sum(p.reference_metric * p.n_prompts for p in parts) / sum(p.n_prompts for p in parts)
    return EdgeEffects(layout, [e for p in parts for e in p.edges], torch.cat([p.per_prompt for p in parts]),
                       parts[0].metric, reference, seconds)


def _save_exact(out, exact, d_model: int) -> None:
    """Per-prompt exact effects (safetensors) and the mean effects as an EAP-IG graph file, both written atomically."""
    tmp = out / "exact_edges.safetensors.tmp"
    save_file({"per_prompt": exact.per_prompt.contiguous(), "edges": torch.tensor(exact.edges)}, str(tmp),
              metadata={"metric": exact.metric, "reference_metric": repr(exact.reference_metric)})
    os.replace(tmp, out / "exact_edges.safetensors")
    save_eap_json(exact.graph(), out / "exact_edges_eap.json", d_model=d_model)


def _save_scores(out, scores: dict) -> None:
    """Every method's edge scores ``[n_forward, n_backward]`` side by side (safetensors, atomic), for later analysis."""
    tmp = out / "edge_scores.safetensors.tmp"
    save_file({name: value.detach().float().cpu().contiguous() for name, value in scores.items()}, str(tmp))
    os.replace(tmp, out / "edge_scores.safetensors")


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark with command-line flags ``argv`` (default: ``sys.argv``)."""
    args = parser.parse_args(argv)
    out = prepare_run_dir(args.out, overwrite=args.overwrite)
    cli.set_threads(args.threads)
    torch.manual_seed(args.seed)
    model = load_model(args.model, device=args.device)
    model.eval()
    data = _prompts(model, args)
    batch = single_batch(data, device=model.cfg.device)
    layout = GraphLayout.of(model)
    print(f"{args.model}: {layout.n_edges} edges; {len(data)} prompts of {batch.tokens.shape[1]} tokens, "
          f"e.g. {batch.prompts[0]!r}")
    results = {"model": args.model, "n_prompts": len(data), "n_tokens": batch.tokens.shape[1], "op": args.op,
               "n_shots": args.n_shots, "ig_steps": args.ig_steps, "n_edges": layout.n_edges, "metric": "logit",
               "device": str(model.cfg.device), "dtype": str(model.cfg.dtype), "threads": torch.get_num_threads(),
               "seconds": {}}
    sec = results["seconds"]
    with torch.no_grad():  # the model itself: what the full graph must give, and the empty graph (counterfactual ablation)
        rows = torch.arange(len(data), device=batch.tokens.device)
        results["model_metric"] = {
            name: float(model(tokens)[rows, -1, batch.answer_ids].double().mean())
            for name, tokens in (("reference", batch.tokens), ("counterfactual", batch.cf_tokens))}

    ig, sec["edge_attribution_eap_ig_inputs"] = _timed(lambda: edge_attribution(
        model, batch, method="EAP-IG-inputs", ig_steps=args.ig_steps, memory_mb=args.memory_mb))
    eap, sec["edge_attribution_eap"] = _timed(lambda: edge_attribution(model, batch, method="EAP",
                                                                       memory_mb=args.memory_mb))
    print(f"edge_attribution: EAP-IG-inputs ({args.ig_steps} steps) {sec['edge_attribution_eap_ig_inputs']:.1f} s, "
          f"EAP {sec['edge_attribution_eap']:.1f} s")

    missing = "skipped by --no-eap-ig" if args.no_eap_ig else _eap_ig_arm.eap_ig_missing()
    results["eap_ig_arm"] = missing or "ran"
    if missing:
        print(f"EAP-IG arm skipped: {missing}")
    else:
        batches = _eap_ig_arm.dataloader(data["prompt"], data["counterfactual"], batch.answer_ids.cpu(),
                                         args.eap_ig_batch_size)
        theirs, sec["eap_ig_attribute_eap_ig_inputs"] = _timed(lambda: _eap_ig_arm.eap_ig_scores(
            model, batches, "EAP-IG-inputs", args.ig_steps))
        results["agreement_eap_ig_inputs"] = _relative_differences(layout, ig.scores, theirs)
        results["speedup_attribution"] = sec["eap_ig_attribute_eap_ig_inputs"] / sec["edge_attribution_eap_ig_inputs"]
        write_json_atomic(out / "results.json", results)  # each arm's result survives a timeout in the next
        theirs_eap, sec["eap_ig_attribute_eap"] = _timed(lambda: _eap_ig_arm.eap_ig_scores(model, batches, "EAP"))
        results["agreement_eap"] = _relative_differences(layout, eap.scores, theirs_eap)
        _save_scores(out, {"ours_eap_ig_inputs": ig.scores, "ours_eap": eap.scores,
                           "eap_ig_tool_eap_ig_inputs": theirs, "eap_ig_tool_eap": theirs_eap})
        print(f"EAP-IG attribute: EAP-IG-inputs {sec['eap_ig_attribute_eap_ig_inputs']:.1f} s "
              f"({results['speedup_attribution']:.1f}x slower); max |diff| / max |score|: "
              f"{results['agreement_eap_ig_inputs']['max_rel_diff_all_edges']:.1e} (all), "
              f"{results['agreement_eap_ig_inputs']['max_rel_diff_non_head_senders']:.1e} (non-head senders)")

    if missing:
        _save_scores(out, {"ours_eap_ig_inputs": ig.scores, "ours_eap": eap.scores})
    write_json_atomic(out / "results.json", results)
    if not args.no_curve:
        select = mib_selector(layout)
        curve, sec["faithfulness_curve"] = _timed(lambda: faithfulness_curve(
            model, ig, batch, select=select, memory_mb=args.memory_mb))
        results["curve"] = curve.to_dict()
        write_json_atomic(out / "results.json", results)
        print(f"faithfulness_curve ({len(MIB_FRACTIONS)} sizes + full + empty): {sec['faithfulness_curve']:.1f} s; "
              f"CPR {curve.cpr.value:.3f} [{curve.cpr.low:.3f}, {curve.cpr.high:.3f}], "
              f"CMD {curve.cmd.value:.3f} [{curve.cmd.low:.3f}, {curve.cmd.high:.3f}]")
        if not missing:
            counts = [int(x * layout.n_edges) for x in MIB_FRACTIONS]
            evals, sec["eap_ig_evaluate_curve"] = _timed(lambda: _eap_ig_arm.eap_ig_evaluate(
                model, batches, ig.scores, counts))
            full, empty = float(evals["full"].mean()), float(evals["empty"].mean())
            theirs_f = [(float(evals[n].mean()) - empty) / (full - empty) for n in counts]
            ours_f = [p.value for p in curve.faithfulness]
            model_cf = results["model_metric"]["counterfactual"]
            results["curve_eap_ig"] = {"faithfulness": theirs_f, "full_metric": full, "empty_metric": empty,
                                       "max_abs_diff_faithfulness": max(abs(a - b) for a, b in zip(ours_f, theirs_f)),
                                       # which convention reproduces the counterfactual run with every edge ablated
                                       "empty_minus_model_counterfactual": empty - model_cf,
                                       "ours_empty_minus_model_counterfactual": curve.empty.value - model_cf}
            results["speedup_curve"] = sec["eap_ig_evaluate_curve"] / sec["faithfulness_curve"]
            print(f"EAP-IG evaluate_graph on the same circuits: {sec['eap_ig_evaluate_curve']:.1f} s "
                  f"({results['speedup_curve']:.1f}x slower); max |f diff| "
                  f"{results['curve_eap_ig']['max_abs_diff_faithfulness']:.2e}")

    write_json_atomic(out / "results.json", results)  # partial results survive a timeout in the stages below
    if args.compare_per_stratum:
        sample = _strata(layout, args.compare_per_stratum, args.seed)
        hooked, sec["edge_patch_sample_hook_path"] = _timed(lambda: edge_patch(
            model, sample, batch, memory_mb=args.memory_mb, fast=False))
        fast, sec["edge_patch_sample_fast_path"] = _timed(lambda: edge_patch(model, sample, batch, memory_mb=args.memory_mb))
        results["edge_patch_fast_vs_hook_path"] = {
            "n_edges": len(sample), "per_stratum": args.compare_per_stratum,
            "speedup": sec["edge_patch_sample_hook_path"] / sec["edge_patch_sample_fast_path"],
            "max_abs_diff": float((fast.per_prompt - hooked.per_prompt).abs().max()),
            "max_abs_effect": float(hooked.per_prompt.abs().max()),
            "seconds_by_stage_hook_path": hooked.seconds, "seconds_by_stage_fast_path": fast.seconds}
        print(f"edge_patch on {len(sample)} stratified edges: hook path {sec['edge_patch_sample_hook_path']:.1f} s, "
              f"fast path {sec['edge_patch_sample_fast_path']:.1f} s "
              f"({results['edge_patch_fast_vs_hook_path']['speedup']:.1f}x); max |diff| "
              f"{results['edge_patch_fast_vs_hook_path']['max_abs_diff']:.1e}")

    write_json_atomic(out / "results.json", results)
    n_exact = layout.n_edges if args.exact_edges == "all" else min(int(args.exact_edges), layout.n_edges)
    if n_exact > 0:
        pairs = layout.real_edge_mask.nonzero()
        pick = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(args.seed))[:n_exact]
        edges = [tuple(p) for p in pairs[pick.sort().values].tolist()]
        cpu = time.process_time()
        exact, sec["edge_patch"] = _timed(lambda: _exact_in_parts(model, layout, edges, batch, args.memory_mb,
                                                                  out, results))
        sec["edge_patch_cpu"] = time.process_time() - cpu
        edges = exact.edges
        if n_exact == layout.n_edges:
            _save_exact(out, exact, model.cfg.d_model)
        f_idx, b_idx = torch.tensor([e[0] for e in edges]), torch.tensor([e[1] for e in edges])
        truth = exact.scores[f_idx, b_idx].float()
        methods = {"eap_ig_inputs": ig.scores[f_idx, b_idx], "eap": eap.scores[f_idx, b_idx]}
        if not missing:
            methods["eap_ig_tool_eap_ig_inputs"] = theirs[f_idx, b_idx]
        rank = _rank_agreement(methods, truth)
        results["spearman_vs_exact"] = rank
        results["exact_seconds_per_edge"] = sec["edge_patch"] / n_exact
        results["exact_seconds_by_stage"] = exact.seconds
        results["exact_largest_effects"] = {layout.edge_name(*edges[i]): float(truth[i])
                                            for i in truth.abs().argsort(descending=True)[:10].tolist()}
        print(f"edge_patch of {n_exact} edges: {sec['edge_patch']:.1f} s wall, {sec['edge_patch_cpu']:.1f} s CPU "
              f"({sec['edge_patch'] / n_exact * layout.n_edges / 60:.1f} min for all {layout.n_edges}); Spearman vs "
              f"exact: EAP-IG {rank['eap_ig_inputs']:.3f} (top 1%: {rank['eap_ig_inputs_top_1pct']:.3f}), "
              f"EAP {rank['eap']:.3f} (top 1%: {rank['eap_top_1pct']:.3f})")

    write_json_atomic(out / "results.json", results)
    print("\nstage                              this toolkit (s)   hannamw/EAP-IG (s)   speed-up")
    for name, ours_key, theirs_key in (("EAP-IG-inputs, every edge", "edge_attribution_eap_ig_inputs",
                                        "eap_ig_attribute_eap_ig_inputs"),
                                       ("EAP, every edge", "edge_attribution_eap", "eap_ig_attribute_eap"),
                                       ("faithfulness curve (10 sizes)", "faithfulness_curve", "eap_ig_evaluate_curve")):
        if ours_key in sec:
            t_theirs = sec.get(theirs_key)
            ratio = f"{t_theirs / sec[ours_key]:.1f}x" if t_theirs else "-"
            print(f"{name:34s} {sec[ours_key]:16.1f}   {t_theirs or float('nan'):18.1f}   {ratio}")
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    cli.run_cli(main, "bench_circuits")
