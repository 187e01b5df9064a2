"""Precise SFT of key heads vs full SFT vs LoRA on gemma-3-270m (Zhang et al. 2024, §5.3, Tables 1-2).

    python -m experiments.precise_sft --out runs/precise_sft

1. Loads the model and builds the training mix (all four operations, training
   templates only, word problems included), the test suite (held-out
   templates; transfer to two-digit operands, decimals, word problems;
   non-math text for drift) and a validation split: prompts on the held-out
   templates whose asked problem is in neither the test suite nor the
   training set (finetune.evaluate.validation_suite).
2. Key heads: ``--heads L9H1,...``; else path patching over prompts of every
   operation (effects summed over operations, heads ranked by the drop they
   cause). The top MLPs come from the same scores.
3. For every method of ``--methods`` (``precise``: the top ``--k`` heads with
   the K/V slices they read; ``precise_nokv``: the same heads, only their
   W_Q/W_O slices, which matters under multi-query attention where one K/V head
   serves every query head of the layer; ``full``: full SFT, embeddings frozen;
   ``lora``: rank ``--lora-rank`` on every attention and MLP weight;
   ``circuit_lora``: rank ``--lora-rank`` adapters on the top ``--k`` heads'
   slices only, the ones ``precise`` tunes, finetune.circuit_lora;
   ``circuit_lora_nokv``: the same without the K/V rows) trains
   from the same base weights once per learning rate of its grid, scores each
   on the validation split, keeps the lr with the best validation exact
   accuracy (ties: the smaller lr) and reports test scores for that lr only.
4. Optional Table-2 ablation (``--ablation-k``, ``--ablation-mlps``) at the lr
   chosen for ``precise``.
5. Writes ``<out>/results.json``: per method the lr search (validation
   accuracy with Wilson interval per lr), test accuracy (Wilson 95% interval,
   n), gain over base (paired bootstrap over prompts), drift (per-token KL and
   LM-loss increase, bootstrap over texts), trained parameters, and the claim
   "precise SFT >= full SFT's gain with less drift" for both precise arms
   (paired differences); with ``circuit_lora``, its paired differences from
   LoRA, precise and full SFT, and ``circuit_lora_nokv``'s from ``circuit_lora``
   (``circuit_lora_comparison``); ``<out>/report.html``.

``--resume`` continues a folder written with the same settings, skipping the
methods and learning-rate trials it already holds, so the work can be split
over several commands (each trial is recorded as it ends; the best trial's
tuned weights stay under ``<out>/runs/``). Without ``--out`` the folder is
``runs/precise_sft``, so ``--resume`` alone continues the last run there.
Default scale: 256 training examples, 16 optimizer steps of 16 (one epoch),
three learning rates per method. The paper trains 2 epochs of batch 128 on 4
math datasets; scale with ``--n-train``, ``--steps``, ``--batch-size``.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

# only light imports here: the parser answers --help and flag errors before torch or TransformerLens load
from circuits.errors import InputError
from circuits.file_reads import read_json
from experiments.runtime.run_folder import read_marker, release_freed_memory
from experiments.precise_sft.config import DEFAULT_METHODS, DEFAULT_OUT, METHOD_SPECS, SFTComparisonConfig

from experiments.runtime import ModelLoader, Run, cli, run_experiment

if TYPE_CHECKING:
    import torch

    from circuits import MLP, Head
    from finetune import TrainConfig

# flags that may differ between the commands of one --resume'd folder
RESUMABLE = {"methods", "resume", "overwrite", "threads", "out", "debug", "ablation_k", "ablation_mlps"}
OPS = ("+", "-", "*", "/")
HEAD_METHODS = ("precise", "circuit_lora")  # train() methods that tune the chosen heads


parser = cli.config_parser(SFTComparisonConfig, "precise_sft", __doc__, help_texts={"out": f"output folder (default: {DEFAULT_OUT})"})


@dataclass
class SFTState:
    """What the stages carry beside the run's settings and results: the frozen base model and the data."""

    base: torch.nn.Module
    train_set: object = None
    suite: dict = field(default_factory=dict)
    val_suite: dict = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)
    ranked_heads: list[Head] = field(default_factory=list)
    circuit_heads: list[Head] = field(default_factory=list)  # precise_circuit's heads
    ranked_mlps: list[MLP] = field(default_factory=list)
    cache: dict = field(default_factory=dict)  # the circuit-shift prompts and the base model's scores on them


SFTRun = Run[SFTComparisonConfig, SFTState]


def train_config(cfg: SFTComparisonConfig) -> TrainConfig:
    """The training settings every method shares (its lr and method overrides are set per trial)."""
    from finetune.lora import LoraSettings
    from finetune import TrainConfig

    return TrainConfig(batch_size=cfg.batch_size, micro_batch_size=cfg.micro_batch_size, max_steps=cfg.steps,
                       seed=cfg.seed, lora=LoraSettings(r=cfg.lora_rank), progress=False)


# ---------------------------------------------------------------------------- stage: run folder, model, data


# settings the earlier code did not have: recorded only when they differ from their default, so a folder's
# record keeps the keys that code wrote (and --resume of such a folder reads a missing one as its default)
ADDED_SETTINGS = ("dtype", "circuit_size", "shift_prompts", "circuit_lora_lrs", "warm_start", "learn_objective",
                  "learn_steps", "learn_lr", "learn_batch_size", "learn_samples", "learn_restarts",
                  "learn_faithfulness_penalty")


def recorded_args(cfg: SFTComparisonConfig) -> dict:
    """The settings as results.json records them (``args``): every field but the :data:`ADDED_SETTINGS` left at
    their defaults."""
    args = json.loads(json.dumps(dataclasses.asdict(cfg)))
    defaults = json.loads(json.dumps(dataclasses.asdict(SFTComparisonConfig())))
    for name in ADDED_SETTINGS:
        if args[name] == defaults[name]:
            del args[name]
    return args


def resumed_results(cfg: SFTComparisonConfig) -> dict | None:
    """The results so far of ``--out`` when ``--resume`` finds a folder of the same settings (None: a new run).

    Read and checked before the lifecycle starts, so a folder of other settings is left as it is.
    """
    out = Path(cfg.out)
    if not (cfg.resume and read_marker(out) is not None and (out / "results.json").is_file()):
        return None
    results = read_json(out / "results.json", "the results.json of an earlier run", error=InputError,
                        hint="--resume needs the run folder as the toolkit wrote it; use another --out.")
    if not isinstance(results, dict):
        raise InputError(f"--resume: {out / 'results.json'} holds no results object; use another --out.")
    before = results.get("args", {})
    # a setting the earlier record lacks had its default then (dtype, and flags added since, such as circuit_size)
    defaults = json.loads(json.dumps(dataclasses.asdict(SFTComparisonConfig())))
    differ = sorted(k for k, v in json.loads(json.dumps(dataclasses.asdict(cfg))).items()
                    if k not in RESUMABLE and v != before.get(k, defaults.get(k)))
    if differ:
        raise InputError(f"--resume: {out} was run with other settings ({', '.join(differ)}); "
                         "use the same flags or another --out.")
    return results


def load_base(run: SFTRun) -> None:
    """The base model, frozen and in eval mode: every method trains a copy of it."""
    base = run.load_model()
    base.eval()
    for p in base.parameters():
        p.requires_grad_(False)
    run.state = SFTState(base)


def build_data(run: SFTRun) -> None:
    """Training mix, test suite, validation split (disjoint from both) and the drift texts."""
    from circuits.seeds import derived_seed
    from finetune import arithmetic_train_set, ArithmeticMix, MathSuiteConfig, math_suite
    from finetune.evaluate import NON_MATH_SENTENCES, pydoc_passages, validation_suite

    cfg, state = run.cfg, run.state
    base = state.base
    state.train_set = arithmetic_train_set(base, ArithmeticMix(ops=OPS, n_examples=cfg.n_train, n_shots=cfg.n_shots,
                                                               seed=cfg.seed))
    suite_config = MathSuiteConfig(ops=OPS, n_heldout=cfg.n_heldout, n_transfer=cfg.n_transfer,
                                   n_shots=cfg.n_shots, seed=derived_seed(cfg.seed, "sft test suite"))
    state.suite = math_suite(base, suite_config)
    state.val_suite = validation_suite(base, suite_config, cfg.n_val, exclude=[*state.suite.values(), state.train_set],
                                       seed=derived_seed(cfg.seed, "sft validation"))
    state.texts = (pydoc_passages(cfg.n_pydoc) if cfg.n_pydoc else []) + list(NON_MATH_SENTENCES[: cfg.n_sentences])
    example = state.train_set[0]
    print(f"{len(state.train_set)} training examples, e.g. {example['prompt'][-60:]!r} -> {example['answer']!r}")


def evaluate_test(run: SFTRun, model) -> dict:
    """Test accuracy per family (per prompt) and drift on the non-math texts."""
    from finetune import evaluate_suite

    state = run.state
    return evaluate_suite(model, state.base, state.suite, state.texts, drift_tokens=run.cfg.drift_tokens, progress=False,
                    per_prompt=True)


def evaluate_val(run: SFTRun, model) -> dict:
    """Validation exact accuracy (Wilson), the score that chooses the lr."""
    from finetune.evaluate import accuracy_estimate, answer_accuracy

    model.eval()
    scores = {name: answer_accuracy(model, ds, per_prompt=True) for name, ds in run.state.val_suite.items()}
    return accuracy_estimate(scores, "heldout").to_dict()


# ---------------------------------------------------------------------------- stage: key heads and MLPs


def _rank_nodes(base, cfg: SFTComparisonConfig) -> tuple[str, list[Head], list[MLP]]:
    """Key heads and MLPs: from the flags, else by path patching summed (as % of baseline) over the operations."""
    from circuits import Head, MLP, parse_node
    from circuits.tasks import make_dataset
    from patching import SweepOptions, path_patch

    ranked_heads = [parse_node(h) for h in cfg.heads.split(",")] if cfg.heads else []
    ranked_mlps = [parse_node(m) for m in cfg.mlps.split(",")] if cfg.mlps else []
    if ranked_heads and (ranked_mlps or not cfg.ablation_mlps):
        return "--heads", ranked_heads, ranked_mlps
    total = None
    for i, op in enumerate(OPS):
        probe = make_dataset(base, op=op, n_prompts=cfg.n_rank_prompts, styles=("equation", "statement", "question"),
                             seed=1000 + i)
        scores = path_patch(base, probe, options=SweepOptions(progress=False))
        as_percent = {n: scores.percent(n) for n, _ in scores.ranked("all")}
        total = as_percent if total is None else {n: total[n] + as_percent[n] for n in total}
    order = [n for n, _ in sorted(total.items(), key=lambda item: item[1])]  # largest drop first
    return ("--heads" if cfg.heads else "path_patching",
            ranked_heads or [n for n in order if isinstance(n, Head)],
            ranked_mlps or [n for n in order if isinstance(n, MLP)])


def _circuit_heads(base, cfg: SFTComparisonConfig) -> list[Head]:
    """The ``k`` heads with the most in-circuit edge score: the default learned circuit (top-n warm-started from
    ``--warm-start``, the ``--learn-*`` flags) on the ranking prompts of every operation, each operation's scores
    scaled to a largest |score| of 1 and summed, then the top ``circuit_size`` circuit."""
    from circuits.tasks import make_dataset

    from circuits import Graph
    from patching.edges.faithful_circuit import circuit_heads, score_selection

    search = cfg.learned_search()
    total = None
    for i, op in enumerate(OPS):
        probe = make_dataset(base, op=op, n_prompts=cfg.n_rank_prompts, styles=("equation", "statement", "question"),
                             seed=1000 + i)
        scores = score_selection(base, probe, search).scores.scores.abs()
        scaled = scores / scores.nan_to_num(0.0).max().clamp_min(1e-12)
        total = scaled if total is None else total + scaled
    heads = circuit_heads(Graph.from_model(base).__class__(Graph.from_model(base).layout, total), cfg.k, cfg.circuit_size)
    if len(heads) < cfg.k:
        raise InputError(f"The edge circuit at {cfg.circuit_size:g} of the edges touches only {len(heads)} heads, fewer "
                         f"than --k {cfg.k}: raise --circuit-size or lower --k.")
    return heads


def choose_nodes(run: SFTRun) -> None:
    """Ranked heads and MLPs (kept from an earlier command of a resumed folder), recorded in the results."""
    from circuits import parse_node

    cfg, results, state = run.cfg, run.results, run.state
    if "ranked_heads" in results:
        head_source = results["head_source"]
        state.ranked_heads = [parse_node(h) for h in results["ranked_heads"]]
        state.ranked_mlps = [parse_node(m) for m in results["ranked_mlps"]]
    else:
        head_source, state.ranked_heads, state.ranked_mlps = _rank_nodes(state.base, cfg)
    if max([cfg.k, *cfg.ablation_ks()]) > len(state.ranked_heads):
        raise InputError(f"Only {len(state.ranked_heads)} ranked heads; lower --k / --ablation-k or pass more --heads.")
    heads, top_mlps = state.ranked_heads[: cfg.k], state.ranked_mlps[: cfg.ablation_mlps]
    print(f"key heads ({head_source}): {', '.join(map(str, heads))}; top MLPs: {', '.join(map(str, top_mlps)) or '-'}")
    if "precise_circuit" in cfg.methods or "circuit_heads" in results:
        if "circuit_heads" not in results:
            results["circuit_heads"] = [str(h) for h in _circuit_heads(state.base, cfg)]
        state.circuit_heads = [parse_node(h) for h in results["circuit_heads"]]
        overlap = sorted(set(map(str, heads)) & set(results["circuit_heads"]))
        results["head_choice_overlap"] = {"n": len(overlap), "heads": overlap}
        print(f"edge-circuit heads: {', '.join(results['circuit_heads'])} ({len(overlap)} shared with the key heads)")
    results.setdefault("args", recorded_args(cfg))
    results.update({"head_source": head_source, "ranked_heads": [str(h) for h in state.ranked_heads[:32]],
                    "ranked_mlps": [str(m) for m in state.ranked_mlps[:8]], "key_heads": [str(h) for h in heads],
                    "n_train": len(state.train_set), "n_val_prompts": sum(len(d) for d in state.val_suite.values()),
                    "validation": "held-out templates; asked problems disjoint from the test suite and the training set"})
    results.setdefault("runs", {})
    results.setdefault("lr_search", {})


def score_base(run: SFTRun) -> None:
    """Test and validation scores of the untrained model (once per folder)."""
    from experiments.precise_sft.summary import score_summary

    if "base" in run.results:
        return
    print("evaluating the base model")
    run.results["base"] = evaluate_test(run, run.state.base) | {"validation_exact": evaluate_val(run, run.state.base)}
    run.results["base"]["summary"] = score_summary(run.results["base"], None)
    run.save()


# ---------------------------------------------------------------------------- stage: lr search and test per method


def train_copy(run: SFTRun, method_key: str, lr: float, heads=None, mlps=None, out_dir: Path | None = None):
    """Train a copy of the base model with ``method_key`` at ``lr``: (tuned model, train result)."""
    from finetune import train

    method, overrides, _ = METHOD_SPECS[method_key]
    release_freed_memory()  # so each run's peak RSS is its own
    model = copy.deepcopy(run.state.base)
    overrides = dict(overrides)
    base_config = train_config(run.cfg)
    if "lora_targets" in overrides:  # a circuit-LoRA arm on other weight matrices: same rank, other targets
        overrides["lora"] = dataclasses.replace(base_config.lora, targets=overrides.pop("lora_targets"))
    run_config = dataclasses.replace(base_config, lr=lr, **overrides)
    result = train(model, run.state.train_set, run_config, method=method, heads=heads, mlps=mlps, out_dir=out_dir)
    return model, result


def _trial(run: SFTRun, method_key: str, lr: float, trial_dir: Path):
    """One (method, lr) trial from the base weights: (tuned model, its entry in ``lr_search``)."""
    shutil.rmtree(trial_dir, ignore_errors=True)  # a trial cut short restarts from the base weights
    tick = time.perf_counter()
    model, result = train_copy(run, method_key, lr, _heads_of(run, method_key), out_dir=trial_dir)
    val = evaluate_val(run, model)
    entry = {"lr": lr, "validation_exact": val, "final_loss": result.losses[-1], "kept": False,
             "train": result.summary(), "losses": result.losses, "seconds": time.perf_counter() - tick}
    print(f"{method_key} lr {lr:g}: validation exact {val['value']:.3f} [{val['low']:.3f}, {val['high']:.3f}] "
          f"(n={val['n']}), final loss {result.losses[-1]:.4f}, {entry['seconds']:.0f} s")
    return model, entry


def _tunes_kv(method_key: str) -> bool | None:
    """Whether a head-tuning arm trains the K/V rows its heads read (None for arms that tune no heads)."""
    method, overrides, _ = METHOD_SPECS[method_key]
    if method == "circuit_lora":
        return "attn.W_K" in overrides.get("lora_targets", ("attn.W_K",))
    return overrides.get("tune_kv")


def _heads_of(run: SFTRun, method_key: str):
    """The heads a method tunes: the edge circuit's for precise_circuit, the key heads for the other precise arms and
    for circuit_lora (so it differs from ``precise`` only in training low-rank adapters instead of the slices)."""
    if method_key == "precise_circuit":
        return run.state.circuit_heads
    return run.state.ranked_heads[: run.cfg.k] if METHOD_SPECS[method_key][0] in HEAD_METHODS else None


def search_lr(run: SFTRun, method_key: str):
    """Try every lr of the method's grid (skipping trials already recorded); the best on validation.

    Each trial is recorded as it ends and only the best one's tuned weights stay on disk
    (runs/<method>_lr<lr>/final), so a command stopped by its time limit resumes at the next trial.
    Returns (validation estimate, lr, tuned model, trial entry) of the best trial.
    """
    from finetune import load_tuned

    grid = run.cfg.lr_grid(method_key)
    search = run.results["lr_search"].setdefault(method_key, {
        "grid": grid, "chosen_lr": None, "by_lr": {}, "rule": "best validation exact accuracy; ties: smaller lr"})
    best = None  # (validation estimate, lr, tuned model, trial entry)
    for lr in grid:
        key, trial_dir = f"{lr:g}", run.out / "runs" / f"{method_key}_lr{lr:g}"
        entry = search["by_lr"].get(key)
        if entry is not None:  # done by an earlier command
            if entry["kept"]:
                model = copy.deepcopy(run.state.base)
                load_tuned(model, trial_dir / "final")
                best = (entry["validation_exact"], lr, model, entry)
            continue
        model, entry = _trial(run, method_key, lr, trial_dir)
        discard = trial_dir
        if best is None or entry["validation_exact"]["value"] > best[0]["value"]:  # strict: ties keep the smaller lr
            discard = None if best is None else run.out / "runs" / f"{method_key}_lr{best[1]:g}"
            if best is not None:
                best[3]["kept"] = False
            entry["kept"] = True
            best = (entry["validation_exact"], lr, model, entry)
        search["by_lr"][key] = entry
        run.save()  # before deleting: a stop in between leaves a kept trial's weights on disk
        if discard is not None and run.main_process:  # the main process wrote the trial; it alone deletes it
            shutil.rmtree(discard, ignore_errors=True)
        del model
        gc.collect()
    search["chosen_lr"] = best[1]
    return best


def run_method(run: SFTRun, method_key: str) -> None:
    """The lr search on validation, then the test scores at the chosen lr only."""
    from experiments.precise_sft.summary import score_summary

    val, lr, model, entry = search_lr(run, method_key)
    scores = evaluate_test(run, model)
    tunes_heads = METHOD_SPECS[method_key][0] in HEAD_METHODS
    run.results["runs"][method_key] = {"method": METHOD_SPECS[method_key][0], "lr": lr,
                                       "k": run.cfg.k if tunes_heads else None,
                                       "heads": [str(h) for h in _heads_of(run, method_key) or []],
                                       "tune_kv": _tunes_kv(method_key), "validation_exact": val,
                                       "train": entry["train"], "losses": entry["losses"], **scores,
                                       "summary": score_summary(scores, run.results["base"])}
    if run.cfg.shift_prompts:
        from patching.edges.engine import edge_model_problem

        problem = edge_model_problem(model)
        run.results["runs"][method_key]["circuit_shift"] = (
            _shift_summary(run, model) if problem is None else {"skipped": f"the tuned model has no edge graph: {problem}"})
    s = run.results["runs"][method_key]["summary"]
    print(f"{method_key}: lr {lr:g}, test held-out exact {s['heldout_exact']['value']:.3f} "
          f"(gain {s['heldout_gain']['value']:+.3f} [{s['heldout_gain']['low']:+.3f}, {s['heldout_gain']['high']:+.3f}]), "
          f"KL {scores['drift']['kl']:.4f}, {entry['train']['n_trainable']:,} trained")
    run.save()
    del model
    gc.collect()


def _shift_summary(run: SFTRun, model) -> dict:
    """The base model's addition circuit inside ``model``, and ``model``'s own: CPR, CMD, Jaccard, Spearman."""
    from circuits.tasks import make_dataset

    from patching import ShiftSettings, circuit_shift

    state = run.state

    if "shift_data" not in state.cache:
        from circuits.answer_scoring import first_token_hits
        from circuits.tasks import filter_correct

        data = make_dataset(state.base, op="+", n_prompts=4 * run.cfg.shift_prompts, seed=2024)
        mask = first_token_hits(state.base, data)
        if sum(mask) >= 2:  # the base model's circuit of the prompts it answers (as MIB evaluates)
            data, _ = filter_correct(state.base, data, mask=mask)
        state.cache["shift_correct_only"] = sum(mask) >= 2
        state.cache["shift_data"] = data.select(range(min(run.cfg.shift_prompts, len(data))))
    settings = ShiftSettings(n_bootstrap=500, seed=run.cfg.seed)
    shift = circuit_shift(state.base, model, state.cache["shift_data"], settings,
                          reference_scores=state.cache.get("shift_base_scores"), path_patching=False)
    state.cache["shift_base_scores"] = shift.reference_scores
    full = shift.to_dict()
    size = f"{100 * settings.size:g}%"
    return {"n_prompts": len(state.cache["shift_data"]), "correct_only": state.cache["shift_correct_only"], "reference_cpr": full["reference_curve"]["cpr"],
            "transferred_cpr": full["transferred_curve"]["cpr"], "transferred_cmd": full["transferred_curve"]["cmd"],
            "own_cpr": full["changed_curve"]["cpr"], "jaccard_at_size": full["jaccard"][size], "size": settings.size,
            "spearman": full["spearman"], "edges": full["edges"], "node_mass": full["node_mass"][:10],
            # per prompt: the base circuit's metric at each size in this model, then its full and empty runs
            # (paired differences of preservation between methods, on the same prompts)
            "transferred_fractions": list(settings.fractions),
            "transferred_table": shift.transferred_curve.table.tolist()}


def run_methods(run: SFTRun) -> None:
    """Every method of ``--methods`` not yet in the folder, each a timed stage."""
    for method_key in run.cfg.methods:
        if method_key in run.results["runs"]:
            print(f"--- {method_key}: already in {run.out}, skipped")
            continue
        with run.stage(f"method {method_key}"):
            run_method(run, method_key)


# ---------------------------------------------------------------------------- stage: Table-2 ablation


def run_ablation(run: SFTRun) -> None:
    """Precise SFT of the top k heads (and, if asked, the top MLPs) at the lr chosen for ``precise``."""
    from experiments.precise_sft.summary import score_summary

    ablation_k, top_mlps = run.cfg.ablation_ks(), run.state.ranked_mlps[: run.cfg.ablation_mlps]
    if not (ablation_k or top_mlps):
        return
    if "precise" not in run.results["lr_search"]:
        raise InputError("The ablation uses the lr chosen for 'precise': include it in --methods (or a resumed run).")
    lr = run.results["lr_search"]["precise"]["chosen_lr"]
    for k in ablation_k:
        for mlps in ([], top_mlps) if top_mlps else ([],):
            name = f"ablation_k{k}" + (f"_mlp{len(mlps)}" if mlps else "")
            if name in run.results["runs"]:
                continue
            model, result = train_copy(run, "precise", lr, run.state.ranked_heads[:k], mlps or None,
                                       out_dir=run.out / "runs" / name)
            scores = evaluate_test(run, model)
            run.results["runs"][name] = {"method": "precise", "lr": lr, "k": k, "mlps": [str(m) for m in mlps],
                                         "tune_kv": True, "train": result.summary(), "losses": result.losses,
                                         **scores, "summary": score_summary(scores, run.results["base"])}
            run.save()
            del model, result
            gc.collect()


# ---------------------------------------------------------------------------- stage: the claim, table, report


def finish(run: SFTRun) -> None:
    """The claims (once full SFT is in), wall time over commands, the table and report; the run stays ``running``
    (for ``--resume``) unless every method ran."""
    from experiments.precise_sft.summary import (
        circuit_lora_comparison, claim, preservation_comparisons, print_table, write_report,
    )
    from finetune.evaluate import paired_comparison

    results = run.results
    if "full" in results["runs"]:
        results["claims"] = {arm: claim(results["runs"][arm], results["runs"]["full"])
                             for arm in ("precise", "precise_nokv", "precise_circuit", "circuit_lora",
                                         "circuit_lora_nokv")
                             if arm in results["runs"]}
    if {"circuit_lora", "circuit_lora_nokv"} & set(results["runs"]):
        results["circuit_lora_comparison"] = circuit_lora_comparison(results["runs"])
    if "precise" in results["runs"] and "precise_circuit" in results["runs"]:
        # the same k heads from the edge circuit instead of path patching: paired differences (circuit - key heads)
        diff = paired_comparison(results["runs"]["precise_circuit"], results["runs"]["precise"])
        results["head_choice"] = {"k": run.cfg.k, "gain_difference": diff["accuracy"].to_dict(),
                                  "kl_difference": diff["kl"].to_dict(), "overlap": results.get("head_choice_overlap"),
                                  "reading": "precise_circuit minus precise: edge-circuit heads minus key heads"}
    preservation = preservation_comparisons(results["runs"], seed=run.cfg.seed)
    if preservation:
        results["circuit_preservation"] = preservation
    if run.main_process:
        write_report(run.out, results, run.cfg.model, dataclasses.asdict(run.cfg))
    # last, so that it matches the wall_seconds the lifecycle records as the run ends (which adds up over commands)
    results.setdefault("wall_seconds_by_command", []).append(time.perf_counter() - run.started)
    results["wall_seconds"] = sum(results["wall_seconds_by_command"])
    print_table(results)
    missing = [m for m in dict.fromkeys(DEFAULT_METHODS + tuple(run.cfg.methods)) if m not in results["runs"]]
    if missing:
        run.complete = False  # results saved with status running: --resume adds the rest
        print(f"methods still to run (--resume --methods {','.join(missing)}): {', '.join(missing)}")


def run(cfg: SFTComparisonConfig, *, loader: ModelLoader | None = None) -> dict:
    """Run (or resume) the experiment; return the results dict that is also written to results.json."""
    if cfg.out is None:
        cfg = dataclasses.replace(cfg, out=DEFAULT_OUT)
    earlier = resumed_results(cfg)  # checked before the folder is touched
    from circuits.process_group import rank_and_world_size

    rank, _ = rank_and_world_size()  # under accelerate launch every process trains; the first one writes
    return run_experiment("precise_sft", cfg, _stages, loader=loader, results=earlier or {},
                          resume=earlier is not None, main_process=rank == 0, plan=plan(cfg))


def plan(cfg: SFTComparisonConfig) -> list[str]:
    """The stages a run with these settings goes through, in order (their names as in results.json ``seconds``);
    a resumed run passes over the methods its folder already holds."""
    return ["load model", "data", "key heads", "base scores", *[f"method {m}" for m in cfg.methods], "ablation",
            "report"]


def _stages(run: SFTRun) -> None:
    load_base(run)
    with run.stage("data"):
        build_data(run)
    with run.stage("key heads"):
        choose_nodes(run)
    with run.stage("base scores"):
        score_base(run)
    run_methods(run)
    with run.stage("ablation"):
        run_ablation(run)
    with run.stage("report"):
        finish(run)


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Parse ``argv`` (default: ``sys.argv``) and run; a launched run ends its process group."""
    results = run(cli.parse_config(parser, SFTComparisonConfig, argv), loader=loader)
    from circuits.process_group import end_process_group  # after parsing: --help answers before torch loads

    end_process_group()  # no process may exit while the main one still writes the run folder
    return results
