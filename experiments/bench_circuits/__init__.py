"""Benchmark: edge attribution, faithfulness curves and exact edge patching, side by side with hannamw/EAP-IG.

    python -m experiments.bench_circuits --threads 1 --out runs/bench_circuits
    python -m experiments.bench_circuits --exact-edges all --out runs/bench_circuits_full   # every edge exactly
    python -m experiments.bench_circuits --acdc-receivers 40 --no-attribution --exact-edges 0 --compare-per-stratum 0
    python -m experiments.bench_circuits --task pairs.csv --out runs/bench_circuits_pairs   # a prompt-pair file

On a machine shared with other processes, pass ``--threads 1``: multi-threaded ops wait for descheduled
threads (one gemma-3-270m block on 32x5 tokens took 0.90 s with 2 threads and 0.066 s with 1 at load average 5).

1. Samples few-shot addition prompts of one template and one token length (default 32; ``--op``, or ``--task``
   with an operation's name, picks another operation). ``--task`` names a pair task instead: ``ioi``,
   ``greater-than`` (``circuits.classic_tasks``) or the path of a prompt-pair file (CSV or JSON lines,
   ``circuits.pair_tasks``). Its prompts are its pairs whose clean and corrupted prompts have one token length
   (a twin cut or padded to fit is left out), the largest group of one length, at most ``--n-prompts`` of it
   (a generated task draws 16x as many rows to fill one length); every arm below, hannamw/EAP-IG's included,
   scores them by the task's own metric (IOI and a file: logit(answer) − logit(distractor); greater-than: a
   probability difference; ``patching.sweeps.task_metrics``), as ``experiments.circuit --task`` does, where the
   arithmetic prompts are scored by the answer's logit. results.json ``task`` says which pairs were kept and
   ``metric`` the metric. ``--op`` and ``--n-shots`` shape arithmetic prompts and are refused beside a pair task.
2. Times ``patching.edges.attribute`` (EAP-IG-inputs, ``--ig-steps`` steps, and EAP) over every edge.
3. When hannamw/EAP-IG is importable (see ``experiments/bench_circuits/eap_ig_arm.py``), times its ``attribute`` on the
   same prompts with the same metric (ours, in its signature) in this process and reports the largest score
   difference relative to the largest score
   (over all edges, and over the edges whose sender is not a head: on models with norms after attention
   the two tools' head outputs differ by design, see docs/methods.md). Otherwise the arm is skipped.
4. Times ``patching.edges.faithfulness_curve`` at MIB's ten sizes (top-n by |EAP-IG score|, pruned as MIB
   prunes) and, with EAP-IG, its ``evaluate_graph`` on the same circuits; reports both curves.
5. Exact edge patching (``patching.edges.edge_patch``) of ``--exact-edges`` edges (a seeded random sample, or
   ``all``): time, and Spearman rank correlation of EAP and EAP-IG scores with the exact effects, over
   those edges and over the top 1% of them by |exact effect|. With ``all``, the exact effects are saved
   (``<out>/exact_edges.safetensors``: per-prompt effects and edge indices; ``<out>/exact_edges_eap.json``:
   the mean effects as an EAP-IG graph file).
   ``--time-prefix-rotary`` first patches the same edges with the fast path's old rotary (TransformerLens
   rotating the prefix's cached keys at every call): both times side by side, and the largest difference.
6. Speed-up of ``edge_patch``'s fast path over its hook path (``fast=False``), both timed in this run on
   the same stratified sample: ``--compare-per-stratum`` edges per (receiver layer, receiver kind).
7. ``--acdc-receivers N``: ACDC (:mod:`patching.edges.acdc`, speculative batches) over the incoming edges of
   the last N receivers, and the plain edge-by-edge loop over the same edges (``acdc_arm.plain_acdc``), timed
   side by side in this run: the speed-up, and whether both kept the same circuit with the same damages
   (``--acdc-objective``: the END distribution's KL, or the task metric, which needs no full-vocabulary unembedding
   unless it reads probabilities, as greater-than's does).
   ``--no-plain-acdc`` leaves the plain loop out. When auto-circuit is importable, its ACDC over the same edges,
   in the same order, at the same τ, is timed too, and its kept edges compared with ours (else skipped, and on
   models with norms after attention, whose heads it patches before the norm: ``acdc_arm``).
8. Prints a table and writes everything to ``<out>/results.json`` (atomic writes, after every stage; its
   ``status`` says ``running``, ``complete`` or ``failed: <stage>: <why>``, Ctrl-C included).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

# only light imports here: the parser answers --help and flag errors before torch or TransformerLens load
from experiments.bench_circuits.config import BenchCircuitsConfig
from experiments.runtime import ModelLoader, Run, cli, run_experiment
from experiments.runtime.bench_prompts import one_length_prompts
from experiments.runtime.timing import wall_and_cpu

if TYPE_CHECKING:
    from circuits.graph import GraphLayout
    from patching.edges.patch import EdgeEffects

parser = cli.config_parser(BenchCircuitsConfig, "bench_circuits", __doc__)

#: rows a generated pair task (ioi, greater-than) draws per prompt asked for, so that its largest group of one token
#: length can fill --n-prompts (IOI's templates differ in length; drawing rows is cheap beside any arm)
GENERATED_ROWS_PER_PROMPT = 16


@dataclass
class BenchState:
    """What the stages carry beside the run's settings and results: model, prompts, graph layout, and each
    method's scores."""

    model: Any
    data: Any
    batch: Any
    layout: GraphLayout
    scores: dict = field(default_factory=dict)  # method -> EdgeScores (ours) or [n_forward, n_backward] (EAP-IG's)
    eap_ig_batches: Optional[list] = None  # set when the EAP-IG arm runs
    metric: Any = "logit"  # what every arm scores at END: the answer's logit, or a pair task's own PatchMetric
    alt_ids: Any = None  # a pair task's distractor ids in batch order (its logit difference reads them); else None


BenchRun = Run[BenchCircuitsConfig, BenchState]


def timed(run: BenchRun, key: str, fn):
    """``fn()``, its wall time recorded as ``results["seconds"][key]`` and its CPU time as ``[key + "_cpu"]``
    (on a shared machine the CPU time is the fairer comparison: the load changes between arms); each timed
    call's times sit beside the stage times."""
    seconds = run.timer.seconds
    value, seconds[key], seconds[f"{key}_cpu"] = wall_and_cpu(fn)
    return value


def run_options(run: BenchRun, **fields):
    """The :class:`patching.SweepOptions` of every call of this toolkit: the run's memory budget and the task's metric
    (``fields`` add or replace settings), so that each arm scores what the others do."""
    from patching import SweepOptions

    return SweepOptions(**({"memory_mb": run.cfg.memory_mb, "metric": run.state.metric} | fields))


def _relative_differences(layout: GraphLayout, ours, theirs) -> dict:
    import torch

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
    from scipy.stats import spearmanr

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
    import torch

    from patching.edges.patch_fast import receiver_kind

    strata: dict = {}
    for f, b in layout.real_edge_mask.nonzero().tolist():
        key = "logits" if b == layout.logits_backward else receiver_kind(layout, b)[:2]
        strata.setdefault(key, []).append((f, b))
    g = torch.Generator().manual_seed(seed)
    picked = [edges[i] for edges in strata.values() for i in torch.randperm(len(edges), generator=g)[:per_stratum].tolist()]
    return sorted(picked)


def _exact_in_parts(run: BenchRun, edges, *, rotate_prefix_once: bool = True) -> EdgeEffects:
    """``edge_patch`` of ``edges`` in parts of three receiver layers, last layers first, noting progress in
    ``<out>/results.json`` after each part (a run stopped by a time limit still says how far it got)."""
    import torch

    from patching.edges import edge_patch
    from patching.edges.patch import EdgeEffects
    from patching.edges.patch_fast import receiver_kind

    layout = run.state.layout
    part_of = {}
    for f, b in edges:
        layer = layout.n_layers if b == layout.logits_backward else receiver_kind(layout, b)[0]
        part_of.setdefault((layout.n_layers - layer) // 3, []).append((f, b))
    parts, done, clock = [], 0, time.perf_counter()
    for key in sorted(part_of):
        parts.append(edge_patch(run.state.model, part_of[key], run.state.batch, rotate_prefix_once=rotate_prefix_once,
                                alt_ids=run.state.alt_ids, options=run_options(run)))
        done += len(part_of[key])
        run.results["exact_progress"] = {"n_edges_done": done, "n_edges": len(edges),
                                         "seconds": time.perf_counter() - clock}
        run.save()
    seconds: dict = {}
    for part in parts:
        for stage, value in part.seconds.items():
            seconds[stage] = seconds.get(stage, 0.0) + value
    reference = sum(p.reference_metric * p.n_prompts for p in parts) / sum(p.n_prompts for p in parts)
    return EdgeEffects(layout, [e for p in parts for e in p.edges], torch.cat([p.per_prompt for p in parts]),
                       parts[0].metric, reference, seconds)


def _save_scores(out, scores: dict) -> None:
    """Every method's edge scores ``[n_forward, n_backward]`` side by side (safetensors, atomic), for later analysis."""
    from safetensors.torch import save_file

    from circuits.atomic_files import atomic_path

    with atomic_path(out / "edge_scores.safetensors") as tmp:
        save_file({name: value.detach().float().cpu().contiguous() for name, value in scores.items()}, str(tmp))


# ---------------------------------------------------------------------------- stages


def setup(run: BenchRun) -> None:
    """Model, the prompts as one batch, the task's metric and the graph layout into ``run.state`` (the run folder,
    threads and seed are set)."""
    import torch

    from circuits.graph import GraphLayout
    from circuits.tasks import single_batch

    cfg = run.cfg
    model = run.load_model()
    model.eval()
    with run.stage("prompts"):
        data, metric, task = task_prompts(model, cfg)
        batch = single_batch(data, device=model.cfg.device)
        layout = GraphLayout.of(model)
    # one batch of one length keeps the dataset's row order, so the distractors line up with the batch's rows
    alt_ids = torch.tensor(data["alt_token_id"], device=batch.tokens.device) \
        if "alt_token_id" in data.column_names else None
    print(f"{cfg.model}: {layout.n_edges} edges; {len(data)} {task['name']} prompts of {batch.tokens.shape[1]} tokens "
          f"(metric {task['metric']}), e.g. {batch.prompts[0]!r}")
    if len(data) < cfg.n_prompts:
        print(f"  ({len(data)} pairs of one token length, fewer than --n-prompts {cfg.n_prompts})")
    run.results |= {"model": cfg.model, "task": task, "n_prompts": len(data), "n_tokens": batch.tokens.shape[1],
                    "op": cfg.op if cfg.arithmetic else None, "n_shots": cfg.n_shots if cfg.arithmetic else None,
                    "ig_steps": cfg.ig_steps, "n_edges": layout.n_edges, "metric": task["metric"],
                    "device": str(model.cfg.device), "dtype": str(model.cfg.dtype),
                    "threads": torch.get_num_threads(), "settings": dataclasses.asdict(cfg)}
    run.state = BenchState(model, data, batch, layout, metric=metric, alt_ids=alt_ids)


def task_prompts(model, cfg: BenchCircuitsConfig):
    """The run's prompts (one token length), the metric every arm scores them by (a name or a PatchMetric), and
    results.json's ``task`` record."""
    if cfg.arithmetic:
        data = one_length_prompts(model, op=cfg.op, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, seed=cfg.seed)
        return data, "logit", {"name": cfg.task_name, "kind": "arithmetic", "metric": "logit"}
    return pair_task_prompts(model, cfg)


def pair_task_prompts(model, cfg: BenchCircuitsConfig):
    """A pair ``--task``'s prompts of one token length, its metric (``patching.sweeps.task_metrics.task_metric``, as
    experiments.circuit scores it) and results.json's ``task`` record (module docstring, step 1)."""
    from collections import Counter

    from circuits.classic_tasks import make_task, task_kind
    from circuits.errors import InputError
    from circuits.pair_tasks import PairTask
    from patching.sweeps.task_metrics import task_metric

    # a generated task draws many more rows than asked: its templates differ in length (IOI has 15), and one length
    # has to fill --n-prompts; a file gives what it holds
    task = make_task(model, cfg.task, n_prompts=GENERATED_ROWS_PER_PROMPT * cfg.n_prompts, seed=cfg.seed)
    rows = task.rows
    fitted = rows["cf_fitted"] if "cf_fitted" in rows.column_names else [""] * len(rows)
    # a twin cut or padded to its prompt's length is left out: hannamw/EAP-IG would tokenise the corrupted text to
    # another length than ours (and its EAP-IG-inputs refuses a batch whose two sides differ in length)
    lengths = [None if fit else n + 1 for n, fit in zip(rows["end_pos"], fitted)]
    counts = Counter(n for n in lengths if n is not None)
    if not counts:
        raise InputError(f"--task {cfg.task}: none of its {len(rows)} pairs has a corrupted prompt of its clean "
                         "prompt's token length (each would be cut or padded to fit), and the benchmark runs pairs of "
                         "one token length in one batch: give corrupted prompts that tokenise to their clean "
                         "prompt's length.")
    n_tokens = max(counts, key=counts.get)  # the largest group (of equal ones, the first in the task's order)
    keep = [i for i, n in enumerate(lengths) if n == n_tokens][:cfg.n_prompts]
    metric, data = task_metric(PairTask(task.name, rows.select(keep), task.metric, task.ordered_ids,
                                        task.description), model)
    return data, metric, task.to_dict() | {
        "kind": task_kind(cfg.task), "n_kept": len(keep), "n_tokens": n_tokens,
        "token_lengths": {str(n): counts[n] for n in sorted(counts)},
        "selection": "the largest group of pairs whose clean and corrupted prompts have one token length (twins cut or "
                     "padded to fit left out), at most --n-prompts of it, in the task's order; not filtered to the "
                     "pairs the model solves (the arithmetic prompts are not either)"}


@cli.no_grad
def model_metrics(run: BenchRun) -> None:
    """The model itself, scored by the task's metric: what the full graph must give, and the empty graph
    (counterfactual ablation)."""
    from patching.sweeps.metrics import get_metric

    state = run.state
    fn = get_metric(state.metric).fn
    run.results["model_metric"] = {
        name: float(fn(state.model(tokens)[:, -1], state.batch.answer_ids, state.alt_ids).double().mean())
        for name, tokens in (("reference", state.batch.tokens), ("counterfactual", state.batch.cf_tokens))}


def our_attribution(run: BenchRun) -> None:
    """This toolkit's EAP-IG-inputs and EAP over every edge, timed."""
    from patching.edges import edge_attribution

    cfg, state, options = run.cfg, run.state, run_options(run)
    state.scores["eap_ig_inputs"] = timed(run, "edge_attribution_eap_ig_inputs", lambda: edge_attribution(
        state.model, state.batch, method="EAP-IG-inputs", ig_steps=cfg.ig_steps, alt_ids=state.alt_ids,
        options=options))
    state.scores["eap"] = timed(run, "edge_attribution_eap", lambda: edge_attribution(
        state.model, state.batch, method="EAP", alt_ids=state.alt_ids, options=options))
    sec = run.timer.seconds
    print(f"edge_attribution: EAP-IG-inputs ({cfg.ig_steps} steps) {sec['edge_attribution_eap_ig_inputs']:.1f} s, "
          f"EAP {sec['edge_attribution_eap']:.1f} s")


def eap_ig_attribution(run: BenchRun) -> None:
    """hannamw/EAP-IG's ``attribute`` on the same prompts with the same metric (when importable), timed; agreement
    with ours."""
    import torch

    from experiments.bench_circuits import eap_ig_arm as _eap_ig_arm

    cfg, results = run.cfg, run.results
    missing = "skipped by --no-eap-ig" if cfg.no_eap_ig else _eap_ig_arm.eap_ig_missing()
    results["eap_ig_arm"] = missing or "ran"
    ours = {"ours_eap_ig_inputs": run.state.scores["eap_ig_inputs"].scores, "ours_eap": run.state.scores["eap"].scores}
    if missing:
        print(f"EAP-IG arm skipped: {missing}")
        _save_scores(run.out, ours)
        return
    labels = run.state.batch.answer_ids.cpu()
    if run.state.alt_ids is not None:  # a pair task's logit difference reads each prompt's distractor too
        labels = torch.stack([labels, run.state.alt_ids.cpu()], 1)
    run.state.eap_ig_batches = batches = _eap_ig_arm.dataloader(
        run.state.data["prompt"], run.state.data["counterfactual"], labels, cfg.eap_ig_batch_size)
    metric = _eap_ig_arm.eap_ig_metric(run.state.metric)  # our metric in its signature: the scores compare
    theirs = timed(run, "eap_ig_attribute_eap_ig_inputs", lambda: _eap_ig_arm.eap_ig_scores(
        run.state.model, batches, "EAP-IG-inputs", cfg.ig_steps, metric=metric))
    run.state.scores["eap_ig_tool_eap_ig_inputs"] = theirs
    results["agreement_eap_ig_inputs"] = _relative_differences(run.state.layout, ours["ours_eap_ig_inputs"], theirs)
    sec = run.timer.seconds
    results["speedup_attribution"] = sec["eap_ig_attribute_eap_ig_inputs"] / sec["edge_attribution_eap_ig_inputs"]
    run.save()  # each arm's result survives a timeout in the next
    theirs_eap = timed(run, "eap_ig_attribute_eap", lambda: _eap_ig_arm.eap_ig_scores(run.state.model, batches, "EAP",
                                                                                     metric=metric))
    results["agreement_eap"] = _relative_differences(run.state.layout, ours["ours_eap"], theirs_eap)
    _save_scores(run.out, {**ours, "eap_ig_tool_eap_ig_inputs": theirs, "eap_ig_tool_eap": theirs_eap})
    agreement = results["agreement_eap_ig_inputs"]
    print(f"EAP-IG attribute: EAP-IG-inputs {sec['eap_ig_attribute_eap_ig_inputs']:.1f} s "
          f"({results['speedup_attribution']:.1f}x slower); max |diff| / max |score|: "
          f"{agreement['max_rel_diff_all_edges']:.1e} (all), {agreement['max_rel_diff_non_head_senders']:.1e} "
          f"(non-head senders)")


def our_curve(run: BenchRun):
    """``faithfulness_curve`` at MIB's ten sizes (top-n by |EAP-IG score|, pruned as MIB prunes), timed."""
    from circuits.graph_selection import mib_selector
    from patching.edges import faithfulness_curve
    from patching.edges.curves import MIB_FRACTIONS

    ig = run.state.scores["eap_ig_inputs"]
    curve = timed(run, "faithfulness_curve", lambda: faithfulness_curve(
        run.state.model, ig, run.state.batch, select=mib_selector(run.state.layout), alt_ids=run.state.alt_ids,
        options=run_options(run)))
    run.results["curve"] = curve.to_dict()
    run.save()
    print(f"faithfulness_curve ({len(MIB_FRACTIONS)} sizes + full + empty): "
          f"{run.timer.seconds['faithfulness_curve']:.1f} s; "
          f"CPR {curve.cpr.value:.3f} [{curve.cpr.low:.3f}, {curve.cpr.high:.3f}], "
          f"CMD {curve.cmd.value:.3f} [{curve.cmd.low:.3f}, {curve.cmd.high:.3f}]")
    return curve


def eap_ig_curve(run: BenchRun, curve) -> None:
    """hannamw/EAP-IG's ``evaluate_graph`` on the same circuits, timed; both curves and their largest difference."""
    from experiments.bench_circuits import eap_ig_arm as _eap_ig_arm
    from patching.edges.curves import MIB_FRACTIONS

    counts = [int(x * run.state.layout.n_edges) for x in MIB_FRACTIONS]
    evals = timed(run, "eap_ig_evaluate_curve", lambda: _eap_ig_arm.eap_ig_evaluate(
        run.state.model, run.state.eap_ig_batches, run.state.scores["eap_ig_inputs"].scores, counts,
        metric=_eap_ig_arm.eap_ig_metric(run.state.metric, summed=False)))
    full, empty = float(evals["full"].mean()), float(evals["empty"].mean())
    theirs_f = [(float(evals[n].mean()) - empty) / (full - empty) for n in counts]
    ours_f = [p.value for p in curve.faithfulness]
    model_cf = run.results["model_metric"]["counterfactual"]
    run.results["curve_eap_ig"] = {"faithfulness": theirs_f, "full_metric": full, "empty_metric": empty,
                                   "max_abs_diff_faithfulness": max(abs(a - b) for a, b in zip(ours_f, theirs_f)),
                                   # which convention reproduces the counterfactual run with every edge ablated
                                   "empty_minus_model_counterfactual": empty - model_cf,
                                   "ours_empty_minus_model_counterfactual": curve.empty.value - model_cf}
    run.results["speedup_curve"] = run.timer.seconds["eap_ig_evaluate_curve"] / run.timer.seconds["faithfulness_curve"]
    print(f"EAP-IG evaluate_graph on the same circuits: {run.timer.seconds['eap_ig_evaluate_curve']:.1f} s "
          f"({run.results['speedup_curve']:.1f}x slower); max |f diff| "
          f"{run.results['curve_eap_ig']['max_abs_diff_faithfulness']:.2e}")


def fast_vs_hook_path(run: BenchRun) -> None:
    """``edge_patch``'s hook path and fast path on the same stratified sample, side by side."""
    from patching.edges import edge_patch

    cfg, sec, state, options = run.cfg, run.timer.seconds, run.state, run_options(run)
    sample = _strata(state.layout, cfg.compare_per_stratum, cfg.seed)
    hooked = timed(run, "edge_patch_sample_hook_path", lambda: edge_patch(
        state.model, sample, state.batch, alt_ids=state.alt_ids, options=options, fast=False))
    fast = timed(run, "edge_patch_sample_fast_path", lambda: edge_patch(state.model, sample, state.batch,
                                                                       alt_ids=state.alt_ids, options=options))
    compared = run.results["edge_patch_fast_vs_hook_path"] = {
        "n_edges": len(sample), "per_stratum": cfg.compare_per_stratum,
        "speedup": sec["edge_patch_sample_hook_path"] / sec["edge_patch_sample_fast_path"],
        "max_abs_diff": float((fast.per_prompt - hooked.per_prompt).abs().max()),
        "max_abs_effect": float(hooked.per_prompt.abs().max()),
        "seconds_by_stage_hook_path": hooked.seconds, "seconds_by_stage_fast_path": fast.seconds}
    print(f"edge_patch on {len(sample)} stratified edges: hook path {sec['edge_patch_sample_hook_path']:.1f} s, "
          f"fast path {sec['edge_patch_sample_fast_path']:.1f} s ({compared['speedup']:.1f}x); "
          f"max |diff| {compared['max_abs_diff']:.1e}")


def _exact_sample(run: BenchRun) -> list[tuple[int, int]]:
    import torch

    layout = run.state.layout
    n_exact = layout.n_edges if run.cfg.exact_edges == "all" else min(int(run.cfg.exact_edges), layout.n_edges)
    pairs = layout.real_edge_mask.nonzero()
    pick = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(run.cfg.seed))[:n_exact]
    return [tuple(p) for p in pairs[pick.sort().values].tolist()]


def old_rotary_exact(run: BenchRun, edges) -> EdgeEffects:
    """The same edges with the fast path rotating the prefix's keys at every call (before this toolkit cached them)."""
    return timed(run, "edge_patch_rotary_every_call", lambda: _exact_in_parts(run, edges, rotate_prefix_once=False))


def exact_patching(run: BenchRun) -> None:
    """Exact ``edge_patch`` of the sampled (or all) edges, timed; Spearman of every method's scores against it."""
    import torch

    edges = _exact_sample(run)
    if not edges:
        return
    old = old_rotary_exact(run, edges) if run.cfg.time_prefix_rotary else None
    exact = timed(run, "edge_patch", lambda: _exact_in_parts(run, edges))
    sec, layout, n_exact = run.timer.seconds, run.state.layout, len(edges)
    if old is not None:
        run.results["exact_prefix_rotary_once"] = {
            "n_edges": n_exact, "speedup_wall": sec["edge_patch_rotary_every_call"] / sec["edge_patch"],
            "speedup_cpu": sec["edge_patch_rotary_every_call_cpu"] / sec["edge_patch_cpu"],
            "max_abs_diff": float((old.per_prompt - exact.per_prompt).abs().max())}
    edges = exact.edges
    if n_exact == layout.n_edges:
        exact.save(run.out, run.state.model.cfg.d_model, overwrite=True)  # the run folder is this run's own
    f_idx, b_idx = torch.tensor([e[0] for e in edges]), torch.tensor([e[1] for e in edges])
    truth = exact.scores[f_idx, b_idx].float()
    run.results["exact_seconds_per_edge"] = sec["edge_patch"] / n_exact
    run.results["exact_seconds_by_stage"] = exact.seconds
    run.results["exact_largest_effects"] = {layout.edge_name(*edges[i]): float(truth[i])
                                            for i in truth.abs().argsort(descending=True)[:10].tolist()}
    print(f"edge_patch of {n_exact} edges: {sec['edge_patch']:.1f} s wall, {sec['edge_patch_cpu']:.1f} s CPU "
          f"({sec['edge_patch'] / n_exact * layout.n_edges / 60:.1f} min for all {layout.n_edges})")
    if "eap" in run.state.scores:
        _spearman_vs_exact(run, f_idx, b_idx, truth)
    if old is not None:
        print(f"  with the prefix keys rotated at every call: {sec['edge_patch_rotary_every_call']:.1f} s wall, "
              f"{sec['edge_patch_rotary_every_call_cpu']:.1f} s CPU "
              f"({run.results['exact_prefix_rotary_once']['speedup_cpu']:.2f}x the CPU time)")


def _spearman_vs_exact(run: BenchRun, f_idx, b_idx, truth) -> None:
    methods = {name: run.state.scores[name].scores[f_idx, b_idx] for name in ("eap_ig_inputs", "eap")}
    if "eap_ig_tool_eap_ig_inputs" in run.state.scores:
        methods["eap_ig_tool_eap_ig_inputs"] = run.state.scores["eap_ig_tool_eap_ig_inputs"][f_idx, b_idx]
    rank = run.results["spearman_vs_exact"] = _rank_agreement(methods, truth)
    print(f"  Spearman vs exact: EAP-IG {rank['eap_ig_inputs']:.3f} (top 1%: {rank['eap_ig_inputs_top_1pct']:.3f}), "
          f"EAP {rank['eap']:.3f} (top 1%: {rank['eap_top_1pct']:.3f})")


def head_edge_verdict(run: BenchRun) -> None:
    """On a post-norm model: which head-sender scores rank head edges closest to exact patching.

    A seeded sample of edges out of heads is patched exactly under ``"frozen"`` and ``"recompute"``; the
    EAP-IG-inputs scores of the same edges are computed with each head change (the toolkit's ``"frozen"``,
    hannamw/EAP-IG's ``"pre-norm"``, and ``"recompute"``); Spearman over the sample and the overlap of the
    top 1% by |score| with the top 1% by |exact effect|, each with a 95% bootstrap interval over edges.
    """
    import torch
    from scipy.stats import spearmanr

    from circuits.stats import bootstrap
    from patching.edges import edge_attribution, edge_patch

    cfg, layout = run.cfg, run.state.layout
    heads = {layout.head_forward(l, h) for l in range(layout.n_layers) for h in range(layout.n_heads)}
    edges = [(f, b) for f, b in layout.real_edge_mask.nonzero().tolist() if f in heads]
    g = torch.Generator().manual_seed(cfg.seed)
    edges = sorted(edges[i] for i in torch.randperm(len(edges), generator=g)[:cfg.head_edges].tolist())
    f_idx, b_idx = torch.tensor(edges).T
    options, alt_ids = run_options(run, progress=False), run.state.alt_ids
    exact = {norm: timed(run, f"exact_head_edges_{norm}", lambda norm=norm: edge_patch(
        run.state.model, edges, run.state.batch, norm=norm, alt_ids=alt_ids, options=options)).effects.float()
        for norm in ("frozen", "recompute")}
    scores = {change: timed(run, f"attribution_head_change_{change}", lambda change=change: edge_attribution(
        run.state.model, run.state.batch, method="EAP-IG-inputs", ig_steps=cfg.ig_steps, norm=change,
        alt_ids=alt_ids, options=options)).scores[f_idx, b_idx] for change in ("frozen", "pre-norm", "recompute")}
    k = max(3, len(edges) // 100)

    def overlap(values, truth) -> float:
        top = set(truth.abs().argsort(descending=True)[:k].tolist())
        return len(top & set(values.abs().argsort(descending=True)[:k].tolist())) / k

    table = {}
    for norm, truth in exact.items():
        for change, values in scores.items():
            pairs = torch.stack([values.double(), truth.double()], 1).numpy()
            spearman = bootstrap(pairs, lambda rows: float(spearmanr(rows[:, 0], rows[:, 1])[0]), n_resamples=500,
                                 seed=cfg.seed)
            table[f"{change} vs exact {norm}"] = {"spearman": spearman.to_dict(), "top_1pct_overlap": overlap(values, truth)}
    run.results["head_edge_verdict"] = {"n_edges": len(edges), "n_top_1pct": k, "comparisons": table,
                                        "exact_frozen_vs_recompute_spearman": _spearman(exact["frozen"], exact["recompute"])}
    for key, row in table.items():
        print(f"{key:32s} Spearman {row['spearman']['value']:.3f} [{row['spearman']['low']:.3f}, "
              f"{row['spearman']['high']:.3f}]  top-1% overlap {row['top_1pct_overlap']:.2f}")


def learned_mask_speed(run: BenchRun) -> None:
    """Seconds per step of a learned mask beside one EAP-IG-inputs pass over the same prompts, and the memory peak."""
    from circuits.peak_memory import peak_rss, reset_peak_rss
    from patching.edges import learn_circuit

    cfg = run.cfg
    warm = run.state.scores.get("eap_ig_inputs")
    reset = reset_peak_rss()
    learned = timed(run, "learned_mask", lambda: learn_circuit(
        run.state.model, run.state.batch, method="matryoshka", steps=cfg.learn_steps, init=warm, progress=False,
        metric=run.state.metric, alt_ids=run.state.alt_ids))
    run.results["learned_mask"] = {"steps": cfg.learn_steps, "seconds_per_step": learned.seconds_per_step,
                                   "cpu_seconds": learned.cpu_seconds,
                                   "peak_rss_mb": round(peak_rss(reset) / 2**20, 1), "peak_since_reset": reset,
                                   "eap_ig_pass_seconds": run.timer.seconds.get("edge_attribution_eap_ig_inputs"),
                                   "n_prompts": len(run.state.data)}


def acdc_speed(run: BenchRun) -> None:
    """ACDC's speculative batches and the plain edge-by-edge loop on the same edges, side by side; auto-circuit's
    ACDC beside them when importable."""
    from experiments.bench_circuits import acdc_arm
    from patching.edges.acdc import ACDCConfig, acdc

    cfg, state, sec = run.cfg, run.state, run.timer.seconds
    config = ACDCConfig(threshold=cfg.acdc_threshold, objective=cfg.acdc_objective, max_receivers=cfg.acdc_receivers)
    ours = timed(run, "acdc", lambda: acdc(state.model, state.batch, config=config, alt_ids=state.alt_ids,
                                           options=run_options(run)))
    results = run.results["acdc"] = {**ours.to_dict(), "n_receivers": cfg.acdc_receivers,
                                     "objective": cfg.acdc_objective}
    run.save()
    print(f"ACDC over {ours.n_tested} edges ({cfg.acdc_receivers} receivers, {cfg.acdc_objective}, "
          f"τ {cfg.acdc_threshold:g}): {sec['acdc']:.1f} s in {ours.n_batches} batched forwards")
    if cfg.no_plain_acdc:
        results["plain_loop"] = "skipped by --no-plain-acdc"
    else:
        mask, damages, final = timed(run, "acdc_plain_loop", lambda: acdc_arm.plain_acdc(
            state.model, state.batch, cfg.acdc_threshold, cfg.acdc_objective, n_receivers=cfg.acdc_receivers,
            metric=state.metric, memory_mb=cfg.memory_mb, alt_ids=state.alt_ids))
        ours_damages = [float(ours.graph.scores[e]) for e in damages]
        results |= {"plain_n_tested": len(damages), "same_circuit": bool((mask == ours.graph.in_graph).all()),
                    "max_abs_damage_diff": max(abs(a - b) for a, b in zip(ours_damages, damages.values())),
                    "plain_objective_kept": final, "speedup_wall": sec["acdc_plain_loop"] / sec["acdc"],
                    "speedup_cpu": sec["acdc_plain_loop_cpu"] / sec["acdc_cpu"]}
        run.save()
        print(f"the plain loop {sec['acdc_plain_loop']:.1f} s ({results['speedup_wall']:.1f}x wall, "
              f"{results['speedup_cpu']:.1f}x CPU); same circuit: {results['same_circuit']}, max |damage diff| "
              f"{results['max_abs_damage_diff']:.1e}")
    missing = "skipped by --no-auto-circuit" if cfg.no_auto_circuit else \
        acdc_arm.auto_circuit_missing(state.model, cfg.acdc_objective)
    if missing:
        results["auto_circuit"] = missing
        print(f"auto-circuit arm skipped: {missing}")
        return
    theirs = timed(run, "auto_circuit_acdc", lambda: acdc_arm.auto_circuit_acdc(
        state.model, state.batch.tokens, state.batch.cf_tokens, cfg.acdc_threshold, n_receivers=cfg.acdc_receivers))
    results["auto_circuit"] = {**theirs,
                               "same_circuit": theirs["kept_edges"] == acdc_arm.kept_edges(ours.graph,
                                                                                          cfg.acdc_receivers),
                               "seconds": sec["auto_circuit_acdc"], "cpu_seconds": sec["auto_circuit_acdc_cpu"],
                               "speedup_wall": sec["auto_circuit_acdc"] / sec["acdc"],
                               "speedup_cpu": sec["auto_circuit_acdc_cpu"] / sec["acdc_cpu"]}
    print(f"auto-circuit ACDC over the same {theirs['n_edges']} edges: {sec['auto_circuit_acdc']:.1f} s "
          f"({results['auto_circuit']['speedup_wall']:.1f}x ours, wall); {theirs['n_edges_kept']} kept, same circuit: "
          f"{results['auto_circuit']['same_circuit']}")


def print_table(run: BenchRun) -> None:
    """Each stage's time here and in hannamw/EAP-IG, and the ratio."""
    sec = run.timer.seconds
    stages = [(name, ours_key, theirs_key) for name, ours_key, theirs_key in (
        ("EAP-IG-inputs, every edge", "edge_attribution_eap_ig_inputs", "eap_ig_attribute_eap_ig_inputs"),
        ("EAP, every edge", "edge_attribution_eap", "eap_ig_attribute_eap"),
        ("faithfulness curve (10 sizes)", "faithfulness_curve", "eap_ig_evaluate_curve")) if ours_key in sec]
    if stages:  # none with --no-attribution: no table, not an empty header
        print("\nstage                              this toolkit (s)   hannamw/EAP-IG (s)   speed-up")
    for name, ours_key, theirs_key in stages:
        t_theirs = sec.get(theirs_key)
        ratio = f"{t_theirs / sec[ours_key]:.1f}x" if t_theirs else "-"
        theirs = f"{t_theirs:18.1f}" if t_theirs else f"{'not run':>18}"
        print(f"{name:34s} {sec[ours_key]:16.1f}   {theirs}   {ratio}")
    arm = run.results.get("eap_ig_arm")
    if arm not in (None, "ran"):
        print(f"(hannamw/EAP-IG not run: {arm})")
    print(f"wrote {run.out / 'results.json'}")


def run(cfg: BenchCircuitsConfig, *, loader: ModelLoader | None = None) -> dict:
    """Every stage in order, results.json saved after each; returns the results that results.json holds."""
    return run_experiment("bench_circuits", cfg, _stages, loader=loader, plan=plan(cfg))


def plan(cfg: BenchCircuitsConfig) -> list[str]:
    """The stages a run with these settings goes through, in order (their names as in results.json ``seconds``)."""
    return ["load model", "prompts", "model metrics",
            *([] if cfg.no_attribution else ["attribution", "EAP-IG arm"]),
            *([] if cfg.no_curve or cfg.no_attribution else ["curves"]),
            *(["fast vs hook path"] if cfg.compare_per_stratum else []), "exact patching",
            *(["head-edge verdict"] if cfg.head_edges else []), *(["learned mask"] if cfg.learn_steps else []),
            *(["ACDC"] if cfg.acdc_receivers else [])]


run_bench = run  # the earlier name


def _stages(run: BenchRun) -> None:
    cfg = run.cfg
    setup(run)
    with run.stage("model metrics"):
        model_metrics(run)
    if not cfg.no_attribution:
        with run.stage("attribution"):
            our_attribution(run)
        with run.stage("EAP-IG arm"):
            eap_ig_attribution(run)
    if not (cfg.no_curve or cfg.no_attribution):
        with run.stage("curves"):
            curve = our_curve(run)
            if run.state.eap_ig_batches is not None:
                eap_ig_curve(run, curve)
    if cfg.compare_per_stratum:
        with run.stage("fast vs hook path"):
            fast_vs_hook_path(run)
    with run.stage("exact patching"):
        exact_patching(run)
    if cfg.head_edges:
        with run.stage("head-edge verdict"):
            head_edge_verdict(run)
    if cfg.learn_steps:
        with run.stage("learned mask"):
            learned_mask_speed(run)
    if cfg.acdc_receivers:
        with run.stage("ACDC"):
            acdc_speed(run)
    print_table(run)


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Run the benchmark with command-line flags ``argv`` (default: ``sys.argv``)."""
    return run(cli.parse_config(parser, BenchCircuitsConfig, argv), loader=loader)
