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
   ``lora``: rank ``--lora-rank`` on every attention and MLP weight) trains
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
   (paired differences); ``<out>/report.html``.

``--resume`` continues a folder written with the same settings, skipping the
methods and learning-rate trials it already holds, so the work can be split
over several commands (each trial is recorded as it ends; the best trial's
tuned weights stay under ``<out>/runs/``).
Default scale: 256 training examples, 16 optimizer steps of 16 (one epoch),
three learning rates per method. The paper trains 2 epochs of batch 128 on 4
math datasets; scale with ``--n-train``, ``--steps``, ``--batch-size``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import shutil
import time
from pathlib import Path

import torch

from circuits.errors import InputError
from circuits.loading import load_model
from circuits.nodes import MLP, Head, parse_node
from circuits.report import Report
from circuits.run_dirs import complete_run, prepare_run_dir, read_marker, release_freed_memory, save_results
from circuits.tasks import make_dataset
from finetune import ArithmeticMix, load_tuned, LoraSettings, MathSuiteConfig, TrainConfig, arithmetic_train_set, train
from finetune.evaluate import (
    NON_MATH_SENTENCES, accuracy_estimate, answer_accuracy, drift_estimates, evaluate, math_suite, paired_comparison,
    pydoc_passages, validation_suite,
)
from patching.path_patching import path_patch

from experiments import _cli as cli

# method -> (train() method, TrainConfig overrides, lr-grid flag)
METHOD_SPECS = {
    "precise": ("precise", {"tune_kv": True}, "precise_lrs"),
    "precise_nokv": ("precise", {"tune_kv": False}, "precise_lrs"),
    "full": ("full", {}, "full_lrs"),
    "lora": ("lora", {}, "lora_lrs"),
}
# flags that may differ between the commands of one --resume'd folder
RESUMABLE = {"methods", "resume", "overwrite", "threads", "out", "debug", "ablation_k", "ablation_mlps"}


def lr_list(text: str) -> list[float]:
    """Comma-separated learning rates > 0, e.g. ``1e-5,3e-5``."""
    lrs = sorted({cli.positive_float(t.strip()) for t in text.split(",") if t.strip()})
    if not lrs:
        raise argparse.ArgumentTypeError(f"expected comma-separated learning rates such as 1e-5,3e-5, got {text!r}")
    return lrs


def method_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in METHOD_SPECS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown method(s) {unknown or text!r}; choose from {', '.join(METHOD_SPECS)}")
    return names


parser = cli.make_parser("precise_sft", __doc__)
parser.add_argument("--model", default="gemma-3-270m", help="offline model name, TransformerLens model name, or a saved model directory")
parser.add_argument("--methods", type=method_list, default=list(METHOD_SPECS), help="comma-separated methods to run (default: all four)")
parser.add_argument("--heads", default=None, help="key heads, e.g. L9H1,L11H0 (default: path patching)")
parser.add_argument("--mlps", default=None, help="top MLPs for the ablation, e.g. MLP15,MLP16 (default: path patching)")
parser.add_argument("--k", type=cli.positive_int, metavar="N", default=8, help="key heads in the precise runs")
parser.add_argument("--ablation-k", default="", help="head counts of the Table-2 ablation, e.g. 4,8,16,32 ('' skips it)")
parser.add_argument("--ablation-mlps", type=cli.nonnegative_int, metavar="N", default=0, help="top MLPs added in the ablation's second arm (0: skip)")
parser.add_argument("--n-train", type=cli.positive_int, metavar="N", default=256, help="training examples (all four operations)")
parser.add_argument("--steps", type=cli.positive_int, metavar="N", default=16, help="optimizer steps per run")
parser.add_argument("--batch-size", type=cli.positive_int, metavar="N", default=16, help="examples per optimizer step")
parser.add_argument("--micro-batch-size", type=cli.positive_int, metavar="N", default=8, help="examples per forward/backward pass")
parser.add_argument("--precise-lrs", type=lr_list, default=[3e-5, 1e-4, 3e-4], help="lr grid of both precise arms (default: 3e-5,1e-4,3e-4)")
parser.add_argument("--full-lrs", type=lr_list, default=[3e-6, 1e-5, 3e-5], help="lr grid of full SFT (default: 3e-6,1e-5,3e-5)")
parser.add_argument("--lora-lrs", type=lr_list, default=[1e-4, 3e-4, 1e-3], help="lr grid of LoRA (default: 1e-4,3e-4,1e-3)")
parser.add_argument("--lora-rank", type=cli.positive_int, metavar="N", default=8, help="LoRA rank on every attention and MLP weight")
parser.add_argument("--n-val", type=cli.positive_int, metavar="N", default=24, help="validation prompts per operation (choose the lr)")
parser.add_argument("--n-heldout", type=cli.positive_int, metavar="N", default=48, help="held-out-template test prompts per operation")
parser.add_argument("--n-transfer", type=cli.positive_int, metavar="N", default=16, help="test prompts per operation and transfer format")
parser.add_argument("--n-shots", type=cli.nonnegative_int, metavar="N", default=2, help="few-shot examples before each training/eval prompt")
parser.add_argument("--n-pydoc", type=cli.nonnegative_int, metavar="N", default=8, help="pydoc passages in the drift text")
parser.add_argument("--n-sentences", type=cli.positive_int, metavar="N", default=30, help="project sentences in the drift text (at most 30)")
parser.add_argument("--drift-tokens", type=cli.positive_int, metavar="N", default=96, help="tokens per drift passage (KL and LM loss on non-math text)")
parser.add_argument("--n-rank-prompts", type=cli.positive_int, metavar="N", default=24, help="prompts per operation for ranking heads")
parser.add_argument("--seed", type=int, default=0, help="seed of the data and training")
parser.add_argument("--threads", type=cli.nonnegative_int, default=0, metavar="N", help="torch CPU threads (0: torch's default)")
cli.add_device_flags(parser, dtype=False)
parser.add_argument("--out", default="runs/precise_sft", help="output folder")
parser.add_argument("--overwrite", action="store_true", help="start the output folder afresh")
parser.add_argument("--resume", action="store_true", help="add the --methods to an unfinished or finished folder of the same settings")

OPS = ("+", "-", "*", "/")


def _open_run(args) -> tuple[Path, dict]:
    """The run folder and the results so far (empty unless ``--resume`` finds a folder of the same settings)."""
    out = Path(args.out)
    if args.resume and read_marker(out) is not None and (out / "results.json").is_file():
        import json

        results = json.loads((out / "results.json").read_text())
        before = results.get("args", {})
        differ = sorted(k for k, v in vars(args).items() if k not in RESUMABLE and json.loads(json.dumps(v)) != before.get(k))
        if differ:
            raise InputError(f"--resume: {out} was run with other settings ({', '.join(differ)}); "
                             "use the same flags or another --out.")
        return out, results
    return prepare_run_dir(out, overwrite=args.overwrite), {}


def _rank_nodes(base, args) -> tuple[str, list[Head], list[MLP]]:
    """Key heads and MLPs: from the flags, else by path patching summed (as % of baseline) over the operations."""
    ranked_heads = [parse_node(h) for h in args.heads.split(",")] if args.heads else []
    ranked_mlps = [parse_node(m) for m in args.mlps.split(",")] if args.mlps else []
    if ranked_heads and (ranked_mlps or not args.ablation_mlps):
        return "--heads", ranked_heads, ranked_mlps
    total = None
    for i, op in enumerate(OPS):
        probe = make_dataset(base, op=op, n_prompts=args.n_rank_prompts, styles=("equation", "statement", "question"),
                             seed=1000 + i)
        scores = path_patch(base, probe, progress=False)
        as_percent = {n: scores.percent(n) for n, _ in scores.ranked("all")}
        total = as_percent if total is None else {n: total[n] + as_percent[n] for n in total}
    order = [n for n, _ in sorted(total.items(), key=lambda item: item[1])]  # largest drop first
    return ("--heads" if args.heads else "path_patching",
            ranked_heads or [n for n in order if isinstance(n, Head)],
            ranked_mlps or [n for n in order if isinstance(n, MLP)])


def _score_summary(scores: dict, base_scores: dict | None) -> dict:
    """Test accuracy (Wilson), gain over base (paired bootstrap), drift (bootstrap over texts), as JSON."""
    out = {f"{family}_exact": accuracy_estimate(scores["math"], family).to_dict() for family in ("heldout", "transfer")}
    out["drift_estimates"] = {k: e.to_dict() for k, e in drift_estimates(scores["drift"]["per_text"]).items()}
    if base_scores is not None:
        for family in ("heldout", "transfer"):
            out[f"{family}_gain"] = paired_comparison(scores, base_scores, family=family)["accuracy"].to_dict()
    return out


def _claim(precise: dict, full: dict) -> dict:
    """'precise SFT >= full SFT's gain with less drift' as paired differences (precise - full) and a verdict."""
    diff = paired_comparison(precise, full)
    acc, kl = diff["accuracy"], diff["kl"]
    gain = "higher" if acc.low > 0 else "lower" if acc.high < 0 else "not distinguishable"
    drift = "less" if kl.high < 0 else "more" if kl.low > 0 else "not distinguishable"
    verdict = "reproduced" if gain != "lower" and drift == "less" else "not reproduced"
    return {"gain_difference": acc.to_dict(), "kl_difference": kl.to_dict(),
            "lm_loss_increase_difference": diff["lm_loss_increase"].to_dict(),
            "gain_vs_full": gain, "drift_vs_full": drift, "verdict": verdict}


def main(argv: list[str] | None = None) -> None:
    """Run the experiment with command-line flags ``argv`` (default: ``sys.argv``)."""
    args = parser.parse_args(argv)
    out, results = _open_run(args)
    cli.set_threads(args.threads)
    started = time.perf_counter()

    # ---------------------------------------------------------------- model and data
    base = load_model(args.model, device=args.device)
    base.eval()
    for p in base.parameters():
        p.requires_grad_(False)
    train_set = arithmetic_train_set(base, ArithmeticMix(ops=OPS, n_examples=args.n_train, n_shots=args.n_shots,
                                                        seed=args.seed))
    suite_config = MathSuiteConfig(ops=OPS, n_heldout=args.n_heldout, n_transfer=args.n_transfer,
                                   n_shots=args.n_shots, seed=12345 + args.seed)
    suite = math_suite(base, suite_config)
    val_suite = validation_suite(base, suite_config, args.n_val, exclude=[*suite.values(), train_set],
                                 seed=777 + args.seed)
    texts = (pydoc_passages(args.n_pydoc) if args.n_pydoc else []) + list(NON_MATH_SENTENCES[: args.n_sentences])
    print(f"{len(train_set)} training examples, e.g. {train_set[0]['prompt'][-60:]!r} -> {train_set[0]['answer']!r}")

    def evaluate_test(model) -> dict:
        return evaluate(model, base, suite, texts, drift_tokens=args.drift_tokens, progress=False, per_prompt=True)

    def evaluate_val(model) -> dict:
        model.eval()
        scores = {name: answer_accuracy(model, ds, per_prompt=True) for name, ds in val_suite.items()}
        return accuracy_estimate(scores, "heldout").to_dict()

    # ---------------------------------------------------------------- key heads and MLPs
    if "ranked_heads" in results:
        head_source = results["head_source"]
        ranked_heads = [parse_node(h) for h in results["ranked_heads"]]
        ranked_mlps = [parse_node(m) for m in results["ranked_mlps"]]
    else:
        head_source, ranked_heads, ranked_mlps = _rank_nodes(base, args)
    ablation_k = [int(k) for k in args.ablation_k.split(",") if k.strip()]
    if max([args.k, *ablation_k]) > len(ranked_heads):
        raise InputError(f"Only {len(ranked_heads)} ranked heads; lower --k / --ablation-k or pass more --heads.")
    top_mlps = ranked_mlps[: args.ablation_mlps]
    heads = ranked_heads[: args.k]
    print(f"key heads ({head_source}): {', '.join(map(str, heads))}; top MLPs: {', '.join(map(str, top_mlps)) or '-'}")

    results.setdefault("args", vars(args))
    results.update({"head_source": head_source, "ranked_heads": [str(h) for h in ranked_heads[:32]],
                    "ranked_mlps": [str(m) for m in ranked_mlps[:8]], "key_heads": [str(h) for h in heads],
                    "n_train": len(train_set), "n_val_prompts": sum(len(d) for d in val_suite.values()),
                    "validation": "held-out templates; asked problems disjoint from the test suite and the training set"})
    results.setdefault("runs", {})
    results.setdefault("lr_search", {})
    if "base" not in results:
        print("evaluating the base model")
        results["base"] = evaluate_test(base) | {"validation_exact": evaluate_val(base)}
        results["base"]["summary"] = _score_summary(results["base"], None)
        save_results(out, results)
    base_scores = results["base"]

    config = TrainConfig(batch_size=args.batch_size, micro_batch_size=args.micro_batch_size, max_steps=args.steps,
                         seed=args.seed, lora=LoraSettings(r=args.lora_rank), progress=False)

    def train_one(name: str, method_key: str, lr: float, heads_=None, mlps_=None, out_dir=None):
        method, overrides, _ = METHOD_SPECS[method_key]
        release_freed_memory()  # so each run's peak RSS is its own
        model = copy.deepcopy(base)
        run_config = dataclasses.replace(config, lr=lr, **overrides)
        if out_dir is None and method == "precise":
            out_dir = out / "runs" / name
        result = train(model, train_set, run_config, method=method, heads=heads_, mlps=mlps_, out_dir=out_dir)
        return model, result

    # ---------------------------------------------------------------- lr search on validation, test at the chosen lr
    # Each trial (method, lr) is recorded as it ends and the best one's tuned weights stay on disk
    # (runs/<method>_lr<lr>/final), so a command stopped by its time limit resumes at the next trial.
    for method_key in args.methods:
        if method_key in results["runs"]:
            print(f"--- {method_key}: already in {out}, skipped")
            continue
        grid = getattr(args, METHOD_SPECS[method_key][2])
        is_precise = METHOD_SPECS[method_key][0] == "precise"
        search = results["lr_search"].setdefault(method_key, {
            "grid": grid, "chosen_lr": None, "by_lr": {}, "rule": "best validation exact accuracy; ties: smaller lr"})
        best = None  # (validation estimate, lr, tuned model, trial entry)
        for lr in grid:
            key, trial_dir = f"{lr:g}", out / "runs" / f"{method_key}_lr{lr:g}"
            entry = search["by_lr"].get(key)
            if entry is not None:  # done by an earlier command
                if entry["kept"]:
                    model = copy.deepcopy(base)
                    load_tuned(model, trial_dir / "final")
                    best = (entry["validation_exact"], lr, model, entry)
                continue
            shutil.rmtree(trial_dir, ignore_errors=True)  # a trial cut short restarts from the base weights
            tick = time.perf_counter()
            model, result = train_one("", method_key, lr, heads if is_precise else None, out_dir=trial_dir)
            val = evaluate_val(model)
            entry = {"lr": lr, "validation_exact": val, "final_loss": result.losses[-1], "kept": False,
                     "train": result.summary(), "losses": result.losses, "seconds": time.perf_counter() - tick}
            print(f"{method_key} lr {lr:g}: validation exact {val['value']:.3f} [{val['low']:.3f}, {val['high']:.3f}] "
                  f"(n={val['n']}), final loss {result.losses[-1]:.4f}, {entry['seconds']:.0f} s")
            discard = trial_dir
            if best is None or val["value"] > best[0]["value"]:  # strict: ties keep the smaller lr
                discard = None if best is None else out / "runs" / f"{method_key}_lr{best[1]:g}"
                if best is not None:
                    best[3]["kept"] = False
                entry["kept"] = True
                best = (val, lr, model, entry)
            search["by_lr"][key] = entry
            save_results(out, results)  # before deleting: a stop in between leaves a kept trial's weights on disk
            if discard is not None:
                shutil.rmtree(discard, ignore_errors=True)
            del model, result
            gc.collect()
        val, lr, model, entry = best
        search["chosen_lr"] = lr
        scores = evaluate_test(model)
        results["runs"][method_key] = {"method": METHOD_SPECS[method_key][0], "lr": lr,
                                       "k": args.k if is_precise else None,
                                       "tune_kv": METHOD_SPECS[method_key][1].get("tune_kv"), "validation_exact": val,
                                       "train": entry["train"], "losses": entry["losses"], **scores,
                                       "summary": _score_summary(scores, base_scores)}
        s = results["runs"][method_key]["summary"]
        print(f"{method_key}: lr {lr:g}, test held-out exact {s['heldout_exact']['value']:.3f} "
              f"(gain {s['heldout_gain']['value']:+.3f} [{s['heldout_gain']['low']:+.3f}, {s['heldout_gain']['high']:+.3f}]), "
              f"KL {scores['drift']['kl']:.4f}, {entry['train']['n_trainable']:,} trained")
        save_results(out, results)
        del best, model
        gc.collect()

    # ---------------------------------------------------------------- Table-2 ablation at precise's chosen lr
    if ablation_k or top_mlps:
        if "precise" not in results["lr_search"]:
            raise InputError("The ablation uses the lr chosen for 'precise': include it in --methods (or a resumed run).")
        lr = results["lr_search"]["precise"]["chosen_lr"]
        for k in ablation_k:
            for mlps in ([], top_mlps) if top_mlps else ([],):
                name = f"ablation_k{k}" + (f"_mlp{len(mlps)}" if mlps else "")
                if name in results["runs"]:
                    continue
                model, result = train_one(name, "precise", lr, ranked_heads[:k], mlps or None)
                scores = evaluate_test(model)
                results["runs"][name] = {"method": "precise", "lr": lr, "k": k, "mlps": [str(m) for m in mlps],
                                         "tune_kv": True, "train": result.summary(), "losses": result.losses, **scores,
                                         "summary": _score_summary(scores, base_scores)}
                save_results(out, results)
                del model, result
                gc.collect()

    # ---------------------------------------------------------------- the claim, table, figure
    if "full" in results["runs"]:
        results["claims"] = {arm: _claim(results["runs"][arm], results["runs"]["full"])
                             for arm in ("precise", "precise_nokv") if arm in results["runs"]}
    results.setdefault("wall_seconds_by_command", []).append(time.perf_counter() - started)
    results["wall_seconds"] = sum(results["wall_seconds_by_command"])
    print_table(results)
    _write_report(out, results, args)
    missing = [m for m in METHOD_SPECS if m not in results["runs"]]
    if missing:
        save_results(out, results)
        print(f"methods still to run (--resume --methods {','.join(missing)}): {', '.join(missing)}")
    else:
        complete_run(out, results)


def _fmt(e: dict, pct: bool = True, signed: bool = False) -> str:
    f = (lambda x: f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}") if pct else (lambda x: f"{x:.4f}")
    return f"{f(e['value'])} [{f(e['low'])}, {f(e['high'])}]"


def print_table(results: dict) -> None:
    """One line per run: test accuracy (Wilson), gain over base (paired bootstrap), KL (bootstrap), trained entries."""
    print(f"\n{'run':16s} {'lr':>7s} {'held-out exact %':>22s} {'gain (points)':>22s} {'transfer %':>20s} "
          f"{'KL on text':>26s} {'trained':>11s}")
    rows = [("base", results["base"])] + list(results["runs"].items())
    for name, r in rows:
        s = r["summary"]
        gain = _fmt(s["heldout_gain"], signed=True) if "heldout_gain" in s else "-"
        trained = f"{r['train']['n_trainable']:,}" if "train" in r else "-"
        lr = f"{r['lr']:.0e}" if "lr" in r else "-"
        print(f"{name:16s} {lr:>7s} {_fmt(s['heldout_exact']):>22s} {gain:>22s} {_fmt(s['transfer_exact']):>20s} "
              f"{_fmt(s['drift_estimates']['kl'], pct=False):>26s} {trained:>11s}")
    for arm, c in results.get("claims", {}).items():
        print(f"claim ({arm} vs full): gain difference {_fmt(c['gain_difference'], signed=True)} points, "
              f"KL difference {_fmt(c['kl_difference'], pct=False)}: {c['verdict']}")
    print(f"\nwall time {results['wall_seconds'] / 60:.1f} min over {len(results['wall_seconds_by_command'])} command(s)")


def _write_report(out: Path, results: dict, args) -> None:
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
    fig.update_layout(title=f"Precise vs full SFT vs LoRA on {args.model}", height=450, width=1000)
    report = Report(f"Precise SFT vs full SFT vs LoRA: {args.model}")
    report.add_figure(fig)
    report.add_settings(vars(args))
    report.save(out / "report.html")


if __name__ == "__main__":
    cli.run_cli(main, "precise_sft")
