"""Merging three experts: weight-space baselines vs closed-form submodule merging (Dai et al., ICLR 2025).

    python -m experiments.merge --threads 1
    python -m experiments.merge --config merge.yml --out runs/my-merge   # run a mergekit YAML, save the model

1. Trains three experts from the base model with finetune (full SFT, embeddings
   frozen, by default): (a) addition word problems, (b) multiplication
   (equation/statement/question templates; ``--mul-operands``), (c) English -> French
   number words (``0..--max-number``, spelled by num2words; test, validation and training
   numbers disjoint). Each expert trains ``--steps`` steps, or with ``--target-gain`` until
   its validation accuracy beats the base's by that much (checked every ``--check-every``
   steps). Experts are saved as model directories under ``<out>/experts`` or
   ``--experts-dir``, where a later run finds and reuses them one by one (resumable).
2. Merges all three with every data-free method in ``merging.methods.REGISTRY`` (λ / density
   tuned on the validation split, tiny grids; each method's time and peak
   memory of one merge recorded) and with closed-form submodule
   merging at every level (model, layer, attn_mlp, head), plus circuit-aware
   merging: head-level α in the layers of the key heads that path patching finds
   on the base for + and *, attn/MLP level elsewhere. ``--pairs`` also merges
   each pair (best baseline configs from the triple, closed form at attn_mlp).
   The closed form can be repeated over ``--cf-seeds`` draws of its ``--n-samples``
   training prompts and fitted over every token or only the answer side
   (``--cf-positions all,answer``: the positions that predict an answer token).
3. Scores every model on the test split of each task (teacher-forced accuracy
   of the whole answer, ``exact``, with per-prompt hits and Wilson intervals; first-token
   accuracy in results.json), checks each expert against the base and the weight average
   on its validation split (``expert_bar``), gives paired bootstrap intervals of the
   attn/MLP closed form minus task arithmetic, weight averaging and TIES (``comparisons``),
   times every method, saves the best merged model (reloaded and checked), and writes
   ``results.json`` and ``report.html`` (table, α heatmap, linearity figure).

``--config merge.yml`` instead runs one mergekit merge YAML
(:func:`merging.load_mergekit_config`) and saves the merged model (loaded into
``--model``'s architecture) as ``<out>/merged`` with ``results.json`` (method,
config, seconds, peak memory); nothing is trained or scored.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

# only light imports here: the parser answers --help and flag errors before torch or TransformerLens load
from circuits.errors import InputError
from circuits.file_reads import read_json
from experiments.runtime.run_folder import write_json_atomic

from experiments.runtime import ModelLoader, Run, cli, run_experiment
from experiments.merge.config import METHODS, TASKS, MergeConfig

if TYPE_CHECKING:
    from experiments.runtime.timing import Progress
    from merging import SubmoduleMergeConfig
    from patching.node_level.head_ranking import KeyHeads


parser = cli.config_parser(MergeConfig, "merge", __doc__)


@dataclass
class MergeState:
    """What the stages carry beside the run's settings and results: the base model, the task data, the experts and
    what has been merged so far."""

    base: object
    data: dict
    experts: dict = field(default_factory=dict)  # task -> state dict
    recipes: dict = field(default_factory=dict)  # merged model name -> how to make it again (for the best one)
    alpha_tables: dict = field(default_factory=dict)
    work: object = None  # the model merged state dicts are loaded into for scoring


MergeRun = Run[MergeConfig, MergeState]


def cf_tasks(run: MergeRun) -> list[list[str]]:
    """Per task, the first ``n_samples`` training prompts with their answers (the linearity figure's samples)."""
    return [[r["prompt"] + r["answer"] for r in run.state.data[(t, "train")].select(range(run.cfg.n_samples))]
            for t in TASKS]


def cf_inputs(run: MergeRun, names, seed: int, positions: str) -> dict:
    """The closed form's data for experts ``names``: ``n_samples`` training rows per task drawn with ``seed``
    (seed 0: the first rows), as token tensors with attention masks and, for ``positions="answer"``, fit masks."""
    from experiments.merge.experts import padded_rows

    tasks, masks, fits = [], [], []
    for t in names:
        rows = run.state.data[(t, "train")]
        picked = range(run.cfg.n_samples) if seed == 0 else \
            sorted(random.Random(seed).sample(range(len(rows)), min(run.cfg.n_samples, len(rows))))
        tokens, attention, answer_side = padded_rows(rows.select(picked).to_list(), run.state.base)
        tasks.append(tokens)
        masks.append(attention)
        fits.append(answer_side if positions == "answer" else None)
    return {"tasks": tasks, "attention_masks": masks, "fit_masks": fits}


def score(run: MergeRun, model, split: str = "test", tasks=TASKS) -> dict:
    """Accuracy per task on ``split`` (with per-prompt hits and a Wilson interval) and pooled over tasks."""
    from circuits.stats import proportion
    from finetune.evaluate import answer_accuracy

    model.eval()
    per = {t: answer_accuracy(model, run.state.data[(t, split)], run.cfg.eval_batch_size, per_prompt=True)
           for t in tasks}
    for s in per.values():
        s["exact_ci"] = proportion(s["exact_hits"]).to_dict()
    pooled = proportion([h for s in per.values() for h in s["exact_hits"]])
    return {"tasks": per, "avg": sum(s["exact"] for s in per.values()) / len(per), "pooled": pooled.to_dict()}


def record(run: MergeRun, name: str, model, seconds: float, val: bool = False, tasks=TASKS, **extra) -> dict:
    """Score ``model`` on the test split of ``tasks`` (and val if ``val``), store it under ``name``, print a line,
    save results.json."""
    entry = {"test": score(run, model, "test", tasks) if tasks else None, "seconds": round(seconds, 2), **extra}
    if val:
        entry["val"] = score(run, model, "val", tasks or TASKS)
    if not tasks:
        run.results["models"][name] = entry
        print(f"{name:28s} (validation only) avg={entry['val']['avg']:.3f} ({seconds:.0f} s)", flush=True)
        run.save()
        return entry
    run.results["models"][name] = entry
    accs = " ".join(f"{t}={entry['test']['tasks'][t]['exact']:.3f}" for t in tasks)
    print(f"{name:28s} {accs} avg={entry['test']['avg']:.3f} ({seconds:.0f} s)", flush=True)
    run.save()
    return entry


# ---------------------------------------------------------------------------- measuring time and memory


# ---------------------------------------------------------------------------- stages


def start_run(run: MergeRun) -> None:
    """The frozen base model, the task data (one example per task printed), the base's scores."""
    from experiments.merge.experts import task_config
    from finetune.expert_tasks import expert_task_data

    cfg = run.cfg
    base = run.load_model(stage="load")
    base.eval()
    for p in base.parameters():
        p.requires_grad_(False)
    data = expert_task_data(base, task_config(cfg))
    for t in TASKS:
        row = data[(t, "test")][0]
        print(f"{t}: {row['prompt'][-70:]!r} -> {row['answer']!r}")
    run.state = MergeState(base, data)
    with run.stage("eval base"):
        record(run, "base", base, 0.0, val=True, tasks=() if cfg.no_base_test else TASKS)


def train_experts(run: MergeRun) -> None:
    """One expert per task, trained from the base (or loaded from ``--experts-dir``), saved, scored (val and test)."""
    from circuits import save_model
    from experiments.merge.experts import train_expert

    cfg = run.cfg
    experts_dir = cfg.experts_dir or run.out / "experts"
    for t in TASKS:
        path = f"{experts_dir}/{t}"
        start = time.perf_counter()
        if os.path.isdir(path):  # saved by an earlier (perhaps interrupted) run: resume from it
            model = run.load_model(path, stage=None)
            trained = read_json(f"{path}.train.json", "an expert's training record", error=InputError,
                                hint="Delete it to reload the expert without it.") \
                if os.path.isfile(f"{path}.train.json") else {}
            info = {"loaded_from": path, **trained}
        else:
            with run.step(f"training the {t} expert"):
                model, info = train_expert(run, t)
            save_model(model, path, overwrite=cfg.overwrite)
            write_json_atomic(f"{path}.train.json", info)
        train_seconds = time.perf_counter() - start
        run.timer.seconds[f"expert {t}"] = round(train_seconds, 2)
        run.state.experts[t] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        with run.stage("eval experts"):
            record(run, f"expert {t}", model, train_seconds, val=True, tasks=(t,), **info)
        del model
    run.state.work = copy.deepcopy(run.state.base)


def choose_key_heads(run: MergeRun) -> KeyHeads:
    """``--heads``, or the union over + and * of each operation's top ``--k`` heads by path patching on the base."""
    from circuits.tasks import make_dataset
    from experiments.merge.experts import given_heads
    from patching.node_level.head_ranking import given_key_heads, rank_key_heads

    if run.cfg.heads:
        chosen = given_key_heads(given_heads(run.cfg))
    else:
        with run.stage("path patching"):
            probes = {op: make_dataset(run.state.base, op=op, n_prompts=run.cfg.n_patch, n_shots=run.cfg.n_shots, seed=100 + i)
                      for i, op in enumerate(("+", "*"))}
            chosen = rank_key_heads(run.state.base, probes, top_k=run.cfg.k, combine="union")
    run.results |= {"key_heads": [str(h) for h in chosen.heads], "key_heads_rule": chosen.rule}
    print("key heads:", ", ".join(run.results["key_heads"]))
    return chosen


def baseline_grid(cfg: MergeConfig) -> dict[str, list]:
    """Configs per data-free method: tiny λ / density grids; the papers' sparsity where mergekit's default is none."""
    from merging.methods import CONFIGS

    grid = {m: [CONFIGS[m]()] for m in cfg.methods.split(",") if m}
    papers = {"dare_linear": dict(density=0.1, rescale_norm="inverse_density"), "dare_ties": dict(density=0.1),
              "breadcrumbs": dict(density=0.9), "breadcrumbs_ties": dict(density=0.9),
              "della": dict(density=0.5, epsilon=0.1), "della_linear": dict(density=0.5, epsilon=0.1)}
    for m, kw in papers.items():
        if m in grid:
            grid[m] = [CONFIGS[m](**kw)]
    if "task_arithmetic" in grid:
        grid["task_arithmetic"] = [CONFIGS["task_arithmetic"](lam=float(x)) for x in cfg.ta_lambdas.split(",")]
    if "ties" in grid:
        grid["ties"] = [CONFIGS["ties"](density=float(x)) for x in cfg.ties_densities.split(",")]
    return grid


def merge_baselines(run: MergeRun, names: tuple[str, ...], suffix: str, configs: dict | None = None,
                    skip=(), only=None, progress: Progress | None = None) -> dict:
    """Merge the experts ``names`` with every data-free method (its grid tuned on val, unless ``configs`` fixes it),
    leaving out the methods in ``skip`` (or all but those in ``only``); ``progress`` advances by one per merge."""
    from experiments.merge.experts import measured
    from merging import merge

    srcs = [run.state.experts[n] for n in names]
    chosen = {}
    grids = baseline_grid(run.cfg) if configs is None else {m: [c] for m, c in configs.items()}
    for method, grid in grids.items():
        if method in skip or (only is not None and method not in only):
            continue
        start, best = time.perf_counter(), None
        for config in grid:
            # a bar per merge: most take seconds, WUDI optimises every matrix for minutes on a CPU
            state, secs, peak = measured(merge, method, run.state.base, srcs, config, progress=True)
            run.state.work.load_state_dict(state)
            del state
            val = score(run, run.state.work, "val", names)["avg"] if len(grid) > 1 else None
            if best is None or val > best[0]:
                best = (val, config, copy.deepcopy(run.state.work.state_dict()) if len(grid) > 1 else None, secs, peak)
            if progress is not None:
                progress.advance()
        if best[2] is not None:
            run.state.work.load_state_dict(best[2])
        chosen[method] = best[1]
        run.state.recipes[f"{method}{suffix}"] = ("method", method, best[1])
        record(run, f"{method}{suffix}", run.state.work, time.perf_counter() - start, val=method == "weight_average" and
                   not suffix, config=best[1], val_avg=best[0],
                   grid=[str(c) for c in grid], merge_seconds=round(best[3], 2), peak_mb=round(best[4], 1))
    return chosen


def closed_form_plans(run: MergeRun, levels: list, key_heads: KeyHeads | None, suffix: str,
                      seeds: int, positions: list[str]) -> list[tuple[str, object, str, int]]:
    """``(name, level spec, positions, seed)`` per closed-form merge: every level x positions x seed, then
    circuit-aware (all positions, seed 0) if ``key_heads``. Names carry the positions and seed only when varied."""
    from experiments.merge.report import CIRCUIT_AWARE
    from merging.circuit_aware import circuit_levels

    plans = []
    repeated = run.cfg.cf_repeat_levels.split(",")
    for seed in range(seeds):  # seed-major: every level and positions choice of seed 0 first
        for lv in (lv for lv in levels if seed == 0 or lv in repeated):
            for pos in (positions if lv in repeated else ["all"]):
                name = f"closed form ({lv}" + (", answer-side" if pos == "answer" else "") + \
                    (f", seed {seed}" if seeds > 1 and lv in repeated else "") + f"){suffix}"
                plans.append((name, lv, pos, seed))
    if key_heads is not None and levels:  # --levels "" runs no closed form at all
        plans.append((f"{CIRCUIT_AWARE}{suffix}", circuit_levels(key_heads.heads, run.state.base.cfg.n_layers), "all", 0))
    return plans


def closed_form_state(run: MergeRun, names, spec, positions: str, seed: int):
    """The closed-form merge of experts ``names`` at level ``spec``, fitted over ``positions`` of seed ``seed``'s
    samples: ``merge_submodules``'s result."""
    from merging import merge_submodules

    return merge_submodules(run.state.base, [run.state.experts[n] for n in names], config=_closed_form_config(run.cfg),
                            levels=spec, expert_names=list(names), progress=False,
                            **cf_inputs(run, names, seed, positions))


def merge_closed_form(run: MergeRun, names: tuple[str, ...], suffix: str, levels: list, key_heads: KeyHeads | None,
                      seeds: int = 1, positions: tuple[str, ...] = ("all",), progress: Progress | None = None) -> None:
    """Closed-form submodule merging of ``names`` at each of ``levels`` (x positions x seeds), and circuit-aware;
    ``progress`` advances by one per merge."""
    for name, spec, pos, seed in closed_form_plans(run, levels, key_heads, suffix, seeds, list(positions)):
        start = time.perf_counter()
        res = closed_form_state(run, names, spec, pos, seed)
        run.state.work.load_state_dict(res.state_dict)
        run.state.recipes[name] = ("closed form", spec, pos, seed)
        record(run, name, run.state.work, time.perf_counter() - start, alphas=res.alphas.to_dict(), positions=pos,
                   sample_seed=seed)
        run.state.alpha_tables[name] = res.alphas
        if progress is not None:
            progress.advance()


def merge_everything(run: MergeRun, key_heads: KeyHeads) -> None:
    """All three experts with every method and level; with ``--pairs`` each pair too (the triple's configs, attn_mlp)."""
    late = [m for m in run.cfg.late_methods.split(",") if m]
    levels, positions = [lv for lv in run.cfg.levels.split(",") if lv], tuple(run.cfg.cf_positions.split(","))
    with run.stage("merge all three"):
        # every config of every method's grid, and every closed-form level x positions x seed (and circuit-aware)
        merges = run.progress(sum(map(len, baseline_grid(run.cfg).values()))
                              + len(closed_form_plans(run, levels, key_heads, "", run.cfg.cf_seeds, list(positions))),
                              "merges of all three")
        chosen = merge_baselines(run, TASKS, "", skip=late, progress=merges)
        merge_closed_form(run, TASKS, "", levels, key_heads, run.cfg.cf_seeds, positions, progress=merges)
        chosen |= merge_baselines(run, TASKS, "", only=late, progress=merges) if late else {}
    if run.cfg.pairs:
        with run.stage("merge pairs"):
            pairs = [(TASKS[i], TASKS[j]) for i in range(len(TASKS)) for j in range(i + 1, len(TASKS))]
            merges = run.progress(len(pairs) * (len(chosen) + 1), "merges of pairs")  # the triple's configs, attn_mlp
            for names in pairs:
                suffix = f" [{names[0]}+{names[1]}]"
                merge_baselines(run, names, suffix, chosen, progress=merges)
                merge_closed_form(run, names, suffix, ["attn_mlp"], None, progress=merges)


def expert_bar(run: MergeRun) -> dict:
    """Per task: does its expert beat the base by ``--target-gain`` and the weight average on its validation split?"""
    from experiments.merge import stats

    run.results["expert_bar"] = bar = stats.expert_bar(run.results["models"], TASKS, run.cfg.target_gain)
    run.save()
    return bar


def compare(run: MergeRun) -> dict:
    """Paired bootstrap intervals of the attn/MLP closed form against task arithmetic, weight averaging and TIES."""
    from experiments.merge import stats

    run.results["comparisons"] = out = stats.compare(run.results["models"], TASKS)
    run.save()
    return out


def rebuild_state(run: MergeRun, name: str) -> dict:
    """The state dict of the merge of all three experts recorded as ``name``, made again from its recipe."""
    from merging import merge

    recipe = run.state.recipes[name]
    if recipe[0] == "closed form":
        return closed_form_state(run, TASKS, *recipe[1:]).state_dict
    return merge(recipe[1], run.state.base, list(run.state.experts.values()), recipe[2], progress=False)


def circuits_of_merges(run: MergeRun) -> None:
    """``--circuit-prompts``: each arithmetic expert's circuit inside every merge of all three (``circuit_column``)."""
    if not run.cfg.circuit_prompts:
        return
    from experiments.merge.circuit_column import circuit_column

    names = [n for n in _triple_merges(run.results) if n in run.state.recipes]
    with run.stage("circuit column"):
        run.results["circuit_column"] = circuit_column(run, names, lambda name: rebuild_state(run, name),
                                                       run.cfg.circuit_prompts)
    run.save()


def save_best(run: MergeRun) -> None:
    """Merge the best merge of all three again, save it, reload it and check its logits are unchanged."""
    import torch

    from circuits import save_model

    best_name = max(_triple_merges(run.results), key=lambda k: run.results["models"][k]["test"]["avg"])  # noqa
    with run.stage("save best"):
        run.state.work.load_state_dict(rebuild_state(run, best_name))
        best_dir = save_model(run.state.work, run.out / "merged_best", overwrite=run.cfg.overwrite)
        reloaded = run.load_model(best_dir, stage=None)
        probe = run.state.base.to_tokens(run.state.data[("en_fr", "test")][0]["prompt"])
        with torch.no_grad():
            same = torch.equal(run.state.work(probe), reloaded(probe))
    run.results["best_merge"] = {"name": best_name, "path": str(best_dir), "reload_logits_equal": same}
    print(f"best merge {best_name!r} saved to {best_dir}; reloaded logits equal: {same}")


def measure_linearity(run: MergeRun):
    """How far attention, MLPs and the whole model are from linear in the experts' weights; its figure (or None)."""
    from merging import LinearityConfig, nonlinearity_scores
    from merging.linearity import nonlinearity_figure

    if not run.cfg.linearity_samples:
        return None
    with run.stage("linearity"):
        alphas = [(float(v),) * len(TASKS) for v in run.cfg.linearity_alphas.split(",")]
        lin = nonlinearity_scores(run.state.base, list(run.state.experts.values()), cf_tasks(run), alphas,
                                  LinearityConfig(level="attn_mlp", n_samples=run.cfg.linearity_samples,
                                                  batch_size=run.cfg.cf_batch_size), progress=False)
    run.results["linearity"] = lin.records
    for kind in ("attn", "mlp", "model"):
        s = lin.scores(kind)
        print(f"non-linearity {kind}: mean {sum(s) / max(len(s), 1):.3f}")
    run.save()
    return nonlinearity_figure(lin)


def summarize(run: MergeRun) -> None:
    """The table of every model's test accuracy and cost, and the verdict: closed form vs TA, circuit-aware vs not."""
    from experiments.merge import stats
    from experiments.merge.report import CIRCUIT_AWARE

    models, merged = run.results["models"], _triple_merges(run.results)
    names = [f"expert {t}" for t in TASKS] + ["base"] + [m for m in METHODS if m in models]
    names += [k for k in merged if k not in names]
    names += [k for k in models if k not in names]
    table = []
    for n in names:
        e = models[n]
        if e["test"] is None:  # scored on validation only (--no-base-test)
            continue
        row = {"model": n, **{t: round(e["test"]["tasks"][t]["exact"], 3) for t in TASKS if t in e["test"]["tasks"]}}
        pooled = e["test"]["pooled"]
        row.update({"average": round(e["test"]["avg"], 3), "pooled_ci": [round(pooled["low"], 3), round(pooled["high"], 3)],
                    "n": pooled["n"], "seconds": e["seconds"],
                    "merge_seconds": e.get("merge_seconds", ""), "peak_mb": e.get("peak_mb", ""),
                    "config": str(e.get("config", ""))})
        table.append(row)
    run.results["verdict"] = stats.verdict_text(run.results, CIRCUIT_AWARE)
    run.results["table"] = table
    print("\n" + "\n".join(f"{r['model']:45s} " + " ".join(f"{r.get(t, ''):>8}" for t in TASKS)
                           + f" {r['average']:>8} {r['seconds']:>8}" for r in table))
    print(run.results["verdict"])
    run.save()


def run(cfg: MergeConfig, *, loader: ModelLoader | None = None) -> dict:
    """Train (or load) the experts, merge them every way, save the best merge, measure linearity, report."""
    bad = set(cfg.cf_positions.split(",")) - {"all", "answer"}
    if bad or not cfg.cf_positions:
        raise InputError(f"--cf-positions {cfg.cf_positions!r}: give 'all', 'answer' or 'all,answer'.")
    operands = cfg.mul_operands.split(",")
    if len(operands) != 2 or not all(x.strip().isdigit() for x in operands) or int(operands[0]) > int(operands[1]):
        raise InputError(f"--mul-operands {cfg.mul_operands!r}: give 'lo,hi' with integers 0 <= lo <= hi, e.g. 10,99.")
    return run_experiment("merge", cfg, _stages, loader=loader, plan=plan(cfg),
                          results={"settings": dataclasses.asdict(cfg), "models": {}})


def plan(cfg: MergeConfig) -> list[str]:
    """The stages a run with these settings goes through, in order (their names as in results.json ``seconds``;
    "eval experts" once per expert, each expert's training between them)."""
    return ["load", "eval base", "eval experts",
            *([] if cfg.no_circuit_aware or cfg.heads else ["path patching"]), "merge all three",
            *(["merge pairs"] if cfg.pairs else []), *(["circuit column"] if cfg.circuit_prompts else []),
            *([] if cfg.no_save_best else ["save best"]), *(["linearity"] if cfg.linearity_samples else [])]


def _stages(run: MergeRun) -> None:
    from experiments.merge.report import write_report

    cfg = run.cfg
    start_run(run)
    train_experts(run)
    key_heads = None if cfg.no_circuit_aware else choose_key_heads(run)
    merge_everything(run, key_heads)
    circuits_of_merges(run)
    expert_bar(run)
    compare(run)
    if not cfg.no_save_best:
        save_best(run)
    linearity_figure = measure_linearity(run)
    summarize(run)
    write_report(run, linearity_figure)
    print(f"report: {run.out / 'report.html'}; total {run.timer.total / 60:.1f} min")


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict | None:
    """Run the experiment with command-line flags ``argv`` (default: ``sys.argv``).

    ``--markdown RUN`` only prints the tables of an earlier run (no run folder); ``--config`` runs a mergekit YAML.
    """
    cfg = cli.parse_config(parser, MergeConfig, argv)  # flags first: --help answers before torch loads
    from experiments.merge import stats
    from experiments.merge.yaml_recipe import run_mergekit_yaml

    if cfg.markdown:
        path = Path(cfg.markdown) / "results.json"
        results = read_json(path, "the results.json of a merge run", error=InputError)
        stats.check_tables_of(results, path)
        print(stats.markdown_summary(results, TASKS))
        return None
    return run_mergekit_yaml(cfg, loader=loader) if cfg.config else run(cfg, loader=loader)


def _closed_form_config(cfg: MergeConfig) -> SubmoduleMergeConfig:
    from merging import SubmoduleMergeConfig

    return SubmoduleMergeConfig(n_samples=cfg.n_samples, batch_size=cfg.cf_batch_size)


def _triple_merges(results: dict) -> dict:
    """The merges of all three experts (not the base, the experts, nor a pair's merge)."""
    return {k: v for k, v in results["models"].items() if not k.startswith(("base", "expert")) and "[" not in k}
