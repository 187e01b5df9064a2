"""Merging three experts: weight-space baselines vs closed-form submodule merging (Dai et al., ICLR 2025).

    python -m experiments.merge --threads 1
    python -m experiments.merge --config merge.yml --out runs/my-merge   # run a mergekit YAML, save the model

1. Trains three experts from the base model with finetune (full SFT, embeddings
   frozen, by default): (a) addition word problems, (b) multiplication
   (equation/statement/question templates), (c) English -> French number words
   (0..30, few-shot, words split into train/val/test). Experts are saved as
   model directories under ``<out>/experts`` (reuse them with ``--experts-dir``).
2. Merges all three with every data-free method in ``merging.REGISTRY`` (λ / density
   tuned on the validation split, tiny grids; each method's time and peak
   memory of one merge recorded) and with closed-form submodule
   merging at every level (model, layer, attn_mlp, head), plus circuit-aware
   merging: head-level α in the layers of the key heads that path patching finds
   on the base for + and *, attn/MLP level elsewhere. ``--pairs`` also merges
   each pair (best baseline configs from the triple, closed form at attn_mlp).
3. Scores every model on the test split of each task (teacher-forced accuracy
   of the whole answer, ``exact``; first-token accuracy in results.json), times
   every method, saves the best merged model (reloaded and checked), and writes
   ``results.json`` and ``report.html`` (table, α heatmap, linearity figure).

``--config merge.yml`` instead runs one mergekit merge YAML
(:func:`merging.load_mergekit_config`) and saves the merged model (loaded into
``--model``'s architecture) as ``<out>/merged`` with ``results.json`` (method,
config, seconds, peak memory); nothing is trained or scored.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import threading
import time

import torch

from circuits.loading import load_model
from circuits.report import Report
from circuits.runs import StageTimer, complete_run, default_run_dir, prepare_run_dir, save_results
from circuits.cache import save_model
from circuits.nodes import parse_node
from circuits.tasks import make_dataset
from finetune import TrainConfig, encode_pairs, split_templates, train
from finetune.data import arithmetic_rows
from finetune.evaluate import answer_accuracy
from merging import (CONFIGS, METHODS, LinearityConfig, SubmoduleMergeConfig, alpha_heatmap, load_mergekit_config, merge,
                     merge_submodules, nonlinearity_figure, nonlinearity_scores)
from merging.circuit_aware import circuit_levels
from merging.submodule import LEVELS

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--model", default="gemma-3-270m", help="base model (offline name or model directory)")
parser.add_argument("--out", default=None, help="run folder (default runs/merge-<time>)")
parser.add_argument("--overwrite", action="store_true", help="reuse a non-empty --out")
parser.add_argument("--experts-dir", default=None, help="folder with saved experts (<task>/ model dirs): skip training")
parser.add_argument("--expert-method", default="full", choices=("full", "precise", "lora"), help="finetune method")
parser.add_argument("--steps", type=int, default=16, help="optimizer steps per expert")
parser.add_argument("--batch-size", type=int, default=8, help="examples per optimizer step")
parser.add_argument("--micro-batch-size", type=int, default=8)
parser.add_argument("--lr", type=float, default=1e-5, help="expert learning rate (full SFT with Adam: higher values blow up the loss at batch 8)")
parser.add_argument("--n-train", type=int, default=128, help="training examples per task")
parser.add_argument("--n-val", type=int, default=12, help="validation prompts per task (baseline tuning)")
parser.add_argument("--n-test", type=int, default=24, help="test prompts per task")
parser.add_argument("--n-shots", type=int, default=1, help="few-shot examples per prompt")
parser.add_argument("--n-samples", type=int, default=16, help="samples per task for the closed form (paper: 30)")
parser.add_argument("--cf-batch-size", type=int, default=4, help="batch of the closed-form fit")
parser.add_argument("--levels", default=",".join(LEVELS), help="closed-form levels to run ('': no closed form, "
                    "circuit-aware included)")
parser.add_argument("--ta-lambdas", default="0.5,1.0", help="task-arithmetic λ grid (val)")
parser.add_argument("--ties-densities", default="0.2,0.5", help="TIES density grid (val)")
parser.add_argument("--heads", default=None, help="key heads, e.g. L5H0,L9H1 (default: path patching)")
parser.add_argument("--k", type=int, default=4, help="key heads per operation from path patching")
parser.add_argument("--n-patch", type=int, default=12, help="prompts per operation for path patching")
parser.add_argument("--linearity-samples", type=int, default=6, help="samples per task for the linearity figure (0: skip)")
parser.add_argument("--linearity-alphas", default="0.5,1.0", help="uniform α values of the linearity figure")
parser.add_argument("--pairs", action="store_true", help="also merge every pair of experts")
parser.add_argument("--eval-batch-size", type=int, default=12)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
parser.add_argument("--config", default=None, help="run this mergekit merge YAML instead (merge and save only)")
parser.add_argument("--methods", default=",".join(METHODS), help="data-free merge methods to run (comma-separated)")


def _rss_bytes() -> int:
    """Resident memory of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def measured(fn, *args, **kwargs):
    """``(fn(...), seconds, peak MB of resident memory above the start)``, memory sampled every 5 ms."""
    start_rss, peak, done = _rss_bytes(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            done.wait(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    start = time.perf_counter()
    try:
        out = fn(*args, **kwargs)
    finally:
        seconds = time.perf_counter() - start
        done.set()
        thread.join()
    return out, seconds, max(peak[0], _rss_bytes()) / 2**20 - start_rss / 2**20


def run_config(args) -> None:
    """Run the mergekit YAML ``args.config``: merge, load into ``args.model``'s architecture, save, write results.json."""
    out = prepare_run_dir(args.out or default_run_dir("merge-config"), args.overwrite)
    plan = load_mergekit_config(args.config)
    merged, seconds, peak_mb = measured(plan.run)
    model = load_model(args.model)
    missing, unexpected = model.load_state_dict(merged, strict=False)
    if unexpected or any(not k.endswith(("IGNORE", "mask", "rotary_sin", "rotary_cos")) for k in missing):
        raise SystemExit(f"The merged weights do not fit {args.model}: missing {missing[:5]}, unexpected {unexpected[:5]}.")
    path = save_model(model, out / "merged", overwrite=args.overwrite)
    complete_run(out, {
        "config": str(args.config), "method": plan.method, "method_config": repr(plan.config),
        "weights": plan.weights, "models": plan.expert_names, "seconds": round(seconds, 2),
        "peak_mb": round(peak_mb, 1), "merged": str(path)})
    print(f"{plan.method}: merged {len(plan.experts)} models in {seconds:.1f} s (peak +{peak_mb:.0f} MB) -> {path}")


def main(argv: list[str] | None = None) -> None:
    """Run the experiment with command-line flags ``argv`` (default: ``sys.argv``)."""
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.config:
        return run_config(args)
    out = prepare_run_dir(args.out or default_run_dir("merge"), args.overwrite)
    timer = StageTimer()
    results: dict = {"args": vars(args), "models": {}, "seconds": timer.seconds}
    timer.run_dir, timer.results = out, results  # results.json (status running) after every stage
    save = lambda: save_results(out, results)  # noqa: E731

    # ---------------------------------------------------------------- base and data
    with timer.stage("load"):
        base = load_model(args.model)
    base.eval()
    for p in base.parameters():
        p.requires_grad_(False)

    ENGLISH = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
               "seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four twenty-five twenty-six "
               "twenty-seven twenty-eight twenty-nine thirty").split()
    FRENCH = ("zéro un deux trois quatre cinq six sept huit neuf dix onze douze treize quatorze quinze seize dix-sept "
              "dix-huit dix-neuf vingt vingt-et-un vingt-deux vingt-trois vingt-quatre vingt-cinq vingt-six vingt-sept "
              "vingt-huit vingt-neuf trente").split()
    numbers = list(range(31))
    random.Random(args.seed).shuffle(numbers)
    word_split = {"test": numbers[:9], "val": numbers[9:15], "train": numbers[15:]}

    def french_pairs(queries: list[int], n: int, seed: int) -> list[tuple[str, str]]:
        """``n`` few-shot prompts: shots from the training words, the query from ``queries``."""
        rng = random.Random(seed)
        pairs = []
        for i in range(n):
            q = queries[i % len(queries)]
            shots = rng.sample([w for w in word_split["train"] if w != q], args.n_shots)
            prompt = "".join(f"English: {ENGLISH[s]}\nFrench: {FRENCH[s]}\n" for s in shots)
            pairs.append((prompt + f"English: {ENGLISH[q]}\nFrench:", " " + FRENCH[q]))
        return pairs

    def arith(op: str, styles: tuple[str, ...], split: str, n: int, seed: int):
        """SFT rows of ``op``: training templates for ``train``, held-out templates (other seeds) for val/test."""
        train_ids, held_ids = split_templates(op, styles)
        ids = train_ids if split == "train" else held_ids
        return arithmetic_rows(base, op, ids, n, operand_range=(1, 9), n_shots=args.n_shots, seed=seed)

    TASKS = ("add_word", "mul", "en_fr")
    data = {}
    for split, n, seed in (("train", args.n_train, 1), ("val", args.n_val, 2), ("test", args.n_test, 3)):
        seed += 10 * args.seed
        data[("add_word", split)] = arith("+", ("word_problem",), split, n, seed)
        data[("mul", split)] = arith("*", ("equation", "statement", "question"), split, n, seed)
        data[("en_fr", split)] = encode_pairs(base, french_pairs(word_split[split], n, seed))
    for t in TASKS:
        row = data[(t, "test")][0]
        print(f"{t}: {row['prompt'][-70:]!r} -> {row['answer']!r}")
    cf_tasks = [[r["prompt"] + r["answer"] for r in data[(t, "train")].select(range(args.n_samples))] for t in TASKS]

    def score(model, split: str = "test", tasks=TASKS) -> dict:
        """Accuracy per task on ``split`` and the mean of ``exact`` over tasks."""
        model.eval()
        per = {t: answer_accuracy(model, data[(t, split)], args.eval_batch_size) for t in tasks}
        return {"tasks": per, "avg": sum(s["exact"] for s in per.values()) / len(per)}

    def record(name: str, model, seconds: float, **extra) -> dict:
        """Score ``model`` on test, store it under ``name``, print a line, save results.json."""
        entry = {"test": score(model), "seconds": round(seconds, 2), **extra}
        results["models"][name] = entry
        accs = " ".join(f"{t}={entry['test']['tasks'][t]['exact']:.3f}" for t in TASKS)
        print(f"{name:28s} {accs} avg={entry['test']['avg']:.3f} ({seconds:.0f} s)", flush=True)
        save()
        return entry

    with timer.stage("eval base"):
        record("base", base, 0.0)

    # ---------------------------------------------------------------- experts
    experts_dir = args.experts_dir or out / "experts"
    experts = {}
    for t in TASKS:
        path = f"{experts_dir}/{t}"
        start = time.perf_counter()
        if args.experts_dir:
            model = load_model(path)
            info = {"loaded_from": path}
        else:
            model = copy.deepcopy(base)
            cfg = TrainConfig(lr=args.lr, batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
                              max_steps=args.steps, seed=args.seed, progress=False)
            heads = None
            if args.expert_method == "precise":
                heads = [parse_node(h) for h in (args.heads or "").split(",") if h] or None
            res = train(model, data[(t, "train")], cfg, method=args.expert_method, heads=heads)
            save_model(model, path, overwrite=args.overwrite)
            info = {"train": res.summary(), "losses": res.losses}
        train_seconds = time.perf_counter() - start
        timer.seconds[f"expert {t}"] = round(train_seconds, 2)
        experts[t] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        with timer.stage("eval experts"):
            record(f"expert {t}", model, train_seconds, **info)
        del model

    work = copy.deepcopy(base)  # merged state dicts are loaded into this model for scoring

    def load_into_work(state_dict) -> None:
        work.load_state_dict(state_dict)

    # ---------------------------------------------------------------- key heads
    if args.heads:
        key_heads = [parse_node(h) for h in args.heads.split(",")]
    else:
        from patching.path_patching import path_patch
        from patching.results import key_heads as top_heads

        key_heads = []
        with timer.stage("path patching"):
            for i, op in enumerate(("+", "*")):
                probe = make_dataset(base, op=op, n_prompts=args.n_patch, n_shots=args.n_shots, seed=100 + i)
                heads, _ = top_heads(path_patch(base, probe, progress=False), top_k=args.k)
                key_heads += [h for h in heads if h not in key_heads]
    results["key_heads"] = [str(h) for h in key_heads]
    print("key heads:", ", ".join(results["key_heads"]))

    # ---------------------------------------------------------------- merges
    def baseline_grid() -> dict[str, list]:
        """Configs per data-free method: tiny λ / density grids; the papers' sparsity where mergekit's default is none."""
        grid = {m: [CONFIGS[m]()] for m in args.methods.split(",") if m}
        papers = {"dare_linear": dict(density=0.1, rescale_norm="inverse_density"), "dare_ties": dict(density=0.1),
                  "breadcrumbs": dict(density=0.9), "breadcrumbs_ties": dict(density=0.9),
                  "della": dict(density=0.5, epsilon=0.1), "della_linear": dict(density=0.5, epsilon=0.1)}
        for m, kw in papers.items():
            if m in grid:
                grid[m] = [CONFIGS[m](**kw)]
        if "task_arithmetic" in grid:
            grid["task_arithmetic"] = [CONFIGS["task_arithmetic"](lam=float(x)) for x in args.ta_lambdas.split(",")]
        if "ties" in grid:
            grid["ties"] = [CONFIGS["ties"](density=float(x)) for x in args.ties_densities.split(",")]
        return grid

    def merge_all(names: tuple[str, ...], suffix: str, configs: dict | None = None) -> dict:
        """Merge the experts ``names`` with every baseline (val-tuned unless ``configs``) and the closed form."""
        srcs, tasks = [experts[n] for n in names], [cf_tasks[TASKS.index(n)] for n in names]
        chosen = {}
        for method, grid in (baseline_grid() if configs is None else {m: [c] for m, c in configs.items()}).items():
            start, best = time.perf_counter(), None
            for cfg in grid:
                state, secs, peak = measured(merge, method, base, srcs, cfg, progress=False)
                load_into_work(state)
                del state
                val = score(work, "val", names)["avg"] if len(grid) > 1 else None
                if best is None or val > best[0]:
                    best = (val, cfg, copy.deepcopy(work.state_dict()) if len(grid) > 1 else None, secs, peak)
            if best[2] is not None:
                load_into_work(best[2])
            chosen[method] = best[1]
            record(f"{method}{suffix}", work, time.perf_counter() - start, config=best[1], val_avg=best[0],
                   grid=[str(c) for c in grid], merge_seconds=round(best[3], 2), peak_mb=round(best[4], 1))
        levels = [lv for lv in args.levels.split(",") if lv] if configs is None else ["attn_mlp"]
        cf = SubmoduleMergeConfig(n_samples=args.n_samples, batch_size=args.cf_batch_size)
        plans = [(f"closed form ({lv}){suffix}", lv) for lv in levels]
        if configs is None and levels:  # --levels "" runs no closed form at all
            plans.append((f"circuit-aware (head in key layers){suffix}", circuit_levels(key_heads, base.cfg.n_layers)))
        for name, spec in plans:
            start = time.perf_counter()
            res = merge_submodules(base, srcs, tasks, cf, levels=spec, expert_names=list(names), progress=False)
            load_into_work(res.state_dict)
            record(name, work, time.perf_counter() - start, alphas=res.alphas.to_dict())
            alpha_tables[name] = res.alphas
        return chosen

    alpha_tables: dict = {}
    with timer.stage("merge all three"):
        chosen = merge_all(TASKS, "")
    if args.pairs:
        with timer.stage("merge pairs"):
            for i in range(len(TASKS)):
                for j in range(i + 1, len(TASKS)):
                    merge_all((TASKS[i], TASKS[j]), f" [{TASKS[i]}+{TASKS[j]}]", chosen)

    # ---------------------------------------------------------------- save the best merge, reload, compare
    merged = {k: v for k, v in results["models"].items() if not k.startswith(("base", "expert")) and "[" not in k}
    best_name = max(merged, key=lambda k: merged[k]["test"]["avg"])
    with timer.stage("save best"):
        if best_name.startswith("closed form") or best_name.startswith("circuit"):
            spec = circuit_levels(key_heads, base.cfg.n_layers) if best_name.startswith("circuit") else \
                best_name.split("(")[1].split(")")[0]
            cf = SubmoduleMergeConfig(n_samples=args.n_samples, batch_size=args.cf_batch_size)
            load_into_work(merge_submodules(base, list(experts.values()), cf_tasks, cf, levels=spec, progress=False).state_dict)
        else:
            load_into_work(merge(best_name, base, list(experts.values()), chosen[best_name], progress=False))
        best_dir = save_model(work, out / "merged_best", overwrite=args.overwrite)
        reloaded = load_model(best_dir)
        probe = base.to_tokens(data[("en_fr", "test")][0]["prompt"])
        with torch.no_grad():
            same = torch.equal(work(probe), reloaded(probe))
    results["best_merge"] = {"name": best_name, "path": str(best_dir), "reload_logits_equal": same}
    print(f"best merge {best_name!r} saved to {best_dir}; reloaded logits equal: {same}")
    del reloaded

    # ---------------------------------------------------------------- linearity
    lin_fig = None
    if args.linearity_samples:
        with timer.stage("linearity"):
            alphas = [(float(v),) * len(TASKS) for v in args.linearity_alphas.split(",")]
            lin = nonlinearity_scores(base, list(experts.values()), cf_tasks, alphas,
                                      LinearityConfig(level="attn_mlp", n_samples=args.linearity_samples,
                                                      batch_size=args.cf_batch_size), progress=False)
        results["linearity"] = lin.records
        lin_fig = nonlinearity_figure(lin)
        for kind in ("attn", "mlp", "model"):
            s = lin.scores(kind)
            print(f"non-linearity {kind}: mean {sum(s) / max(len(s), 1):.3f}")
    save()

    # ---------------------------------------------------------------- table and report
    ROW_ORDER = [m for m in METHODS if m in results["models"]]
    names = [f"expert {t}" for t in TASKS] + ["base"] + ROW_ORDER + [k for k in merged if k not in ROW_ORDER]
    names += [k for k in results["models"] if k not in names]
    table = []
    for n in names:
        e = results["models"][n]
        row = {"model": n, **{t: round(e["test"]["tasks"][t]["exact"], 3) for t in TASKS if t in e["test"]["tasks"]}}
        row.update({"average": round(e["test"]["avg"], 3), "seconds": e["seconds"],
                    "merge_seconds": e.get("merge_seconds", ""), "peak_mb": e.get("peak_mb", ""),
                    "config": str(e.get("config", ""))})
        table.append(row)
    results["table"] = table
    ta = merged.get("task_arithmetic", {}).get("test", {}).get("avg")
    am = merged.get("closed form (attn_mlp)", {}).get("test", {}).get("avg")
    circ = merged.get("circuit-aware (head in key layers)", {}).get("test", {}).get("avg")
    verdict = (f"attn/MLP-level closed form average {am:.3f} vs task arithmetic {ta:.3f}: "
               f"{'beats' if am > ta else 'does not beat'} TA. " if am is not None and ta is not None else "") + \
              (f"Circuit-aware {circ:.3f} vs attn/MLP {am:.3f}: {'helps' if circ > am else 'does not help'}." if circ is not None
               and am is not None else "")
    results["verdict"] = verdict
    print("\n" + "\n".join(f"{r['model']:45s} " + " ".join(f"{r.get(t, ''):>8}" for t in TASKS)
                           + f" {r['average']:>8} {r['seconds']:>8}" for r in table))
    print(verdict)
    save()

    report = Report("Merging three experts", f"{args.model}: add_word, mul, en_fr")
    report.add_text("Test accuracy = teacher-forced exact answer (every answer token argmax). Baseline λ/density "
                    "chosen on the validation split. " + verdict, heading="Summary")
    report.add_table(table, heading="Test accuracy (exact); time per method (s, includes val tuning), one merge's "
                                    "time (merge_seconds) and peak resident memory above the start (peak_mb, MB)")
    report.add_text("Key heads (path patching on the base, + and *): " + ", ".join(results["key_heads"]))
    for name in ("closed form (attn_mlp)", "circuit-aware (head in key layers)"):
        if name in alpha_tables:
            report.add_figure(alpha_heatmap(alpha_tables[name], f"α: {name}"), heading=f"α ({name})")
    if lin_fig is not None:
        report.add_figure(lin_fig, heading="Non-linearity of attention/MLP vs the whole model")
    report.add_settings(vars(args))
    report.add_table(timer.seconds, heading="Stage times (s)")
    report.save(out / "report.html")
    complete_run(out, results)
    print(f"report: {out / 'report.html'}; total {timer.total / 60:.1f} min")


if __name__ == "__main__":
    main()
