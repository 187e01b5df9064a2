"""The identify -> validate -> analyze pipeline for one operation, shared by
``experiments.addition``, ``.subtraction``, ``.multiplication`` and ``.division``.

Stages (each timed into results.json ``seconds``):

1. data: few-shot one-digit prompts in the three template styles, base accuracy
   per style, then only the prompts the model answers correctly;
2. identify: path patching from every head and MLP to the answer logit; the key heads;
3. validate: mean-ablation knockout of the top-k heads against k random heads,
   and of the key heads on the transfer formats (multi-digit, decimals, word problems, zero-shot);
4. analyze: attention reads of every head, classified into operand / operator heads (the
   key heads' role distribution as the paper's Figure 5), MLP probes and the logit lens;
4b. edge circuit (``experiments.circuit``): EAP-IG edge scores on half of ``--circuit-prompts``
   correct prompts, the MIB faithfulness curve, CPR and CMD on the other half, the smallest
   circuit with f >= 0.8 (chosen on the first half, its f read on the second), which key heads
   it holds; EAP-IG / MIB circuit files in edge_circuit/ (``--circuit-prompts 0`` skips it);
5. AF1: a coarse (L_wait, L_transfer) faithfulness grid on the zero-shot one-token prompts
   ``experiments.af1`` uses (``--af1-stride``; 0 skips it; too few correct prompts: a note, no grid);
6. with ``--finetune``: a short precise SFT of the key heads, accuracy before and after;
7. outputs: results.json (keys in docs/results_json.md), figures/*.json (plotly), report.html.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from circuits.attention import (
    HeadClassConfig, attention_reads, attention_views, classes_table, classify_heads, plot_role_distribution, plot_role_heatmap,
)
from circuits.circuit_figure import circuit_figure
from circuits.export import StaticExportError, export_figures, parse_formats
from circuits.loading import load_model
from circuits.probes import ProbeConfig, plot_top_tokens, probe_mlps, top_number_tokens
from experiments._report import run_report
from circuits.errors import InputError
from circuits.run_dirs import StageTimer, complete_run, default_run_dir, prepare_run_dir, write_text_atomic
from circuits.scoring import score_rows
from circuits.stats import proportion
from circuits.tasks import CORRUPTIONS, TaskConfig, accuracy_mask, filter_correct, make_dataset, transfer_datasets
from circuits.templates import resolve_operation
from finetune import ArithmeticMix, MathSuiteConfig, TrainConfig, arithmetic_train_set, evaluate, math_suite, train
from patching.af1 import AF1Config, AF1Runner, faithfulness_heatmap, grid_faithfulness
from patching.af1_data import authors_templates, make_template_dataset
from patching.knockout import knockout_curve, knockout_transfer
from patching.path_patching import path_patch
from patching.key_heads import combine_key_heads
from patching.results import key_heads

from experiments import _cli as cli
from experiments.circuit import MIN_PROMPTS as MIN_CIRCUIT_PROMPTS
from experiments.circuit import CircuitConfig, add_report_section, edge_circuit_stage
from experiments.circuit import summary as circuit_summary

logger = logging.getLogger("experiments")

AF1_TEMPLATES = ("af1-equation", "af1-verbal", "af1-question")  # experiments.af1's default search templates
CASE_PROBLEMS = {"+": "4 + 3 = ", "-": "7 - 3 = ", "*": "4 * 2 = ", "/": "8 / 2 = "}


@dataclass(frozen=True)
class PipelineConfig:
    """Every flag of the experiment, with its default."""

    model: str = "gemma-3-270m"
    device: str = "auto"
    dtype: str | None = None
    op: str = "+"
    n_prompts: int = 200
    n_shots: int = 3
    seed: int = 0
    top_k: int = 8
    knockout_prompts: int = 64
    knockout_ks: str = "1,2,4,8"
    knockout_seeds: int = 10
    knockout_pool: int = 512
    corrupt: str = "query"
    transfer_prompts: int = 32
    af1_stride: int = 3
    af1_prompts: int = 55
    circuit_prompts: int = 40
    finetune: bool = False
    finetune_steps: int = 30
    batch_size: int = 32
    threads: int = 0
    out: str | None = None
    overwrite: bool = False
    figures: str = ""


FLAG_HELP = {
    "model": "offline model name, TransformerLens model name, or a saved model directory",
    "n_prompts": "prompts sampled before keeping the correctly answered ones",
    "n_shots": "solved examples before each prompt",
    "seed": "seed of the data, the random-rank knockouts and training",
    "top_k": "number of key heads (by path-patching effect)",
    "knockout_prompts": "prompts for the knockout curves",
    "knockout_ks": "comma-separated numbers of heads to knock out",
    "knockout_seeds": "random-rank repeats per k",
    "knockout_pool": "prompts (none of them evaluated) the ablation means are averaged over, per format",
    "corrupt": "counterfactual twins of the key-head ranking: 'query' (the queried operator) or 'all' (every operator, shots too); both are reported",
    "transfer_prompts": "prompts per transfer format",
    "af1_stride": "L_wait step of the coarse AF1 grid on zero-shot one-token prompts (0: skip AF1)",
    "af1_prompts": "prompts for the AF1 grid (55 = every one-digit sum below 10)",
    "circuit_prompts": "correct prompts for the EAP-IG edge circuit, half to score and choose, half to report (0: skip)",
    "finetune": "also tune the key heads with precise SFT and report accuracy before/after",
    "finetune_steps": "optimizer steps of that precise SFT run",
    "batch_size": "prompts per forward pass",
    "threads": "torch CPU threads (0: torch's default)",
    "out": "output folder (default: runs/<operation>-<timestamp>)",
    "overwrite": "write into an existing output folder",
    "figures": "also write each figure as static files next to its JSON, sized for a two-column paper: a "
               "comma-separated subset of svg,pdf,png; needs kaleido and Chrome/Chromium (default: none)",
}

# Checked when parsed, so a bad flag fails before the model loads (experiments._cli).
FLAG_TYPES = {
    "n_prompts": cli.positive_int, "n_shots": cli.nonnegative_int, "seed": int, "top_k": cli.positive_int,
    "knockout_prompts": cli.positive_int, "knockout_ks": cli.int_list, "knockout_seeds": cli.positive_int,
    "knockout_pool": cli.positive_int,
    "transfer_prompts": cli.positive_int, "af1_stride": cli.nonnegative_int, "af1_prompts": cli.positive_int,
    "circuit_prompts": cli.nonnegative_int,
    "finetune_steps": cli.positive_int, "batch_size": cli.positive_int, "threads": cli.nonnegative_int,
    "figures": cli.figure_formats,
}


def build_parser(op: str) -> argparse.ArgumentParser:
    """The parser of ``python -m experiments.<operation>``: one flag per :class:`PipelineConfig` field."""
    name = resolve_operation(op).name
    parser = cli.make_parser(name, f"Identify, validate and analyze the {name} circuit of a model.\n\n"
                             + __doc__.split("\n\n", 1)[1])
    cli.add_device_flags(parser)
    for f in dataclasses.fields(PipelineConfig):
        if f.name in ("op", "device", "dtype"):
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            parser.add_argument(flag, action="store_true", help=FLAG_HELP[f.name])
        else:
            kind = FLAG_TYPES.get(f.name, str)
            metavar = {int: "N", cli.positive_int: "N", cli.nonnegative_int: "N", cli.int_list: "K,K,...",
                       cli.figure_formats: "FORMATS"}.get(kind)
            choices = CORRUPTIONS if f.name == "corrupt" else None
            parser.add_argument(flag, type=kind, default=f.default, choices=choices, metavar=metavar,
                                help=FLAG_HELP[f.name])
    return parser


def parse_config(op: str, argv: list[str] | None = None) -> PipelineConfig:
    """CLI flags for every field of :class:`PipelineConfig` (``--help`` lists the defaults)."""
    args = vars(build_parser(op).parse_args(argv))
    args.pop("debug")
    return PipelineConfig(op=op, **args)


def _style_accuracy(dataset, mask) -> dict[str, float]:
    by_style: dict[str, list[bool]] = {}
    for style, ok in zip(dataset["style"], mask):
        by_style.setdefault(style, []).append(ok)
    return {style: sum(v) / len(v) for style, v in by_style.items()}


def _style_estimates(dataset, mask) -> dict[str, dict]:
    by_style: dict[str, list[bool]] = {}
    for style, ok in zip(dataset["style"], mask):
        by_style.setdefault(style, []).append(ok)
    return {style: proportion(torch.tensor(v, dtype=torch.float64)).to_dict() for style, v in by_style.items()}


def _accuracy_estimates(model, dataset, mask, batch_size: int) -> dict:
    """First-token accuracy beside the whole answer (teacher-forced) and one-token answers, each with a Wilson interval."""
    whole = score_rows(model, dataset, "whole", batch_size)
    one_token = [ok for ok, ids in zip(mask, dataset["answer_token_ids"]) if len(ids) == 1]
    as_tensor = lambda v: torch.tensor(v, dtype=torch.float64)
    return {"first_token": proportion(as_tensor(mask)).to_dict(), "whole_answer": proportion(as_tensor(whole)).to_dict(),
            "one_token_answers": proportion(as_tensor(one_token)).to_dict(),
            "by_style_first_token": _style_estimates(dataset, mask), "by_style_whole_answer": _style_estimates(dataset, whole),
            "interval": "95% Wilson over prompts"}


@torch.no_grad()
def run(cfg: PipelineConfig) -> dict:
    """Run the pipeline; return the results dict that is also written to results.json."""
    start = time.perf_counter()
    if cfg.corrupt not in CORRUPTIONS:
        raise InputError(f"--corrupt must be one of {CORRUPTIONS}, got {cfg.corrupt!r}.")
    cli.set_threads(cfg.threads)
    name = resolve_operation(cfg.op).name
    out = prepare_run_dir(cfg.out or default_run_dir(name), overwrite=cfg.overwrite)
    figures_dir = out / "figures"  # created by the first figure written, so an interrupted run leaves none
    figures: dict = {}
    results: dict = {"experiment": name, "settings": dataclasses.asdict(cfg)}
    timer = StageTimer(run_dir=out, results=results)  # saves results.json (status running) stage by stage

    # 1. model and data ------------------------------------------------------------------
    with timer.stage("load model"), cli.progress(f"loading {cfg.model} (a first run builds the model cache: ~1 min)"):
        model = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)
    with timer.stage("data"):
        task = TaskConfig(op=cfg.op, n_prompts=cfg.n_prompts, n_shots=cfg.n_shots, seed=cfg.seed)
        with cli.progress(f"building {cfg.n_prompts} {name} prompts"):
            dataset = make_dataset(model, task)
        with cli.progress(f"base accuracy on {len(dataset)} prompts"):
            mask = accuracy_mask(model, dataset, cfg.batch_size)
        kept, base_accuracy = filter_correct(model, dataset, mask=mask)
        # the same prompts with every operator corrupted in their twins (shots included)
        twins = {"query": kept, "all": make_dataset(model, task, corrupt="all").select([i for i, ok in enumerate(mask) if ok])}
        accuracy = _accuracy_estimates(model, dataset, mask, cfg.batch_size)
    results |= {"model": cfg.model, "n_layers": model.cfg.n_layers, "n_heads": model.cfg.n_heads,
                "n_prompts": len(dataset), "n_kept": len(kept), "base_accuracy": base_accuracy,
                "accuracy_by_style": _style_accuracy(dataset, mask), "accuracy": accuracy}
    print(f"base accuracy {base_accuracy:.1%} on {len(dataset)} prompts (whole answer "
          f"{accuracy['whole_answer']['value']:.1%}); {len(kept)} kept")

    # 2. identify: path patching to the answer logit -------------------------------------
    with timer.stage("path patching"):
        by_corrupt = {c: path_patch(model, twins[c], batch_size=cfg.batch_size) for c in ("query", "all")}
        scores = by_corrupt[cfg.corrupt]
        heads, fraction = key_heads(scores, top_k=cfg.top_k)
        rule = combine_key_heads({cfg.op: scores}, top_k=cfg.top_k).rule | {"corrupt": cfg.corrupt}
    figures["path_patching"] = scores.figure(title=f"Path patching, {name}: effect on the answer logit (%), "
                                                   f"twins corrupt={cfg.corrupt!r}", key_heads=heads)
    results |= {"path_patching": scores.to_dict(), "key_heads": [str(h) for h in heads], "key_head_fraction": fraction,
                "key_heads_rule": rule, "corrupt": cfg.corrupt, "identification_by_corrupt": _by_corrupt(by_corrupt, cfg.top_k)}

    # 3. validate: knockout curves, then transfer formats ---------------------------------
    with timer.stage("knockout"):
        knock_data = kept.shuffle(seed=cfg.seed).select(range(min(cfg.knockout_prompts, len(kept))))
        ks = [int(k) for k in cfg.knockout_ks.split(",") if int(k) <= model.cfg.n_layers * model.cfg.n_heads]
        curve = knockout_curve(model, knock_data, scores, ks=ks, n_seeds=cfg.knockout_seeds, n_pool=cfg.knockout_pool,
                               seed=cfg.seed, batch_size=cfg.batch_size)
        results["knockout"] = curve.to_dict()  # saved with this stage, before the (slower) transfer formats
    with timer.stage("knockout on transfer formats"):
        formats = transfer_datasets(model, cfg.op, n_prompts=cfg.transfer_prompts, seed=cfg.seed, n_shots=cfg.n_shots)
        curve.transfer = knockout_transfer(model, formats, heads, n_pool=cfg.knockout_pool, drop_uncovered=True,
                                           seed=cfg.seed, batch_size=cfg.batch_size)
    figures["knockout"] = curve.figure(title=f"Knockout, {name}: effect-rank vs random-rank heads")
    figures["knockout_transfer"] = curve.transfer_figure(title=f"Key heads of {name} knocked out on other formats")
    results["knockout"] = curve.to_dict()

    # 4. analyze: attention reads, MLP probes, logit lens --------------------------------
    with timer.stage("attention reads"):
        reads = attention_reads(model, kept, batch_size=cfg.batch_size)  # every head: cheap, END query only
        classes = classify_heads(reads, HeadClassConfig())
        key_classes = [c for c in classes if c.head in set(heads)]
        role = {c.head: c.label for c in classes}
        views = _views_per_head(attention_views(model, kept, heads[:4], max_prompts=1, last_tokens=MAX_VIEW_TOKENS),
                                heads[:4], role, "few-shot")
        for format_name in ("multi_digit", "word_problem"):
            views += _views_per_head(attention_views(model, formats[format_name], heads[:1], max_prompts=1,
                                                     last_tokens=MAX_VIEW_TOKENS),
                                     heads[:1], role, format_name.replace("_", "-"))
    figures["attention_roles"] = plot_role_distribution(reads, heads, key_classes, title=f"END-query attention of the key heads, {name}")
    figures["attention_all_heads"] = plot_role_heatmap(reads, model.cfg.n_layers, model.cfg.n_heads)
    results |= {"head_classes": classes_table(key_classes), "all_head_classes": classes_table(classes, only_labelled=True),
                "operand_heads": [str(c.head) for c in classes if c.label == "operand"],
                "operator_heads": [str(c.head) for c in classes if c.label == "operator"]}
    ranks = {c: [n for n, _ in s.ranked("heads", by="neg")] for c, s in by_corrupt.items()}
    results["identification_by_corrupt"]["labelled_head_ranks"] = {
        str(c.head): {"label": c.label, **{k: ranks[k].index(c.head) + 1 for k in ranks}} for c in classes if c.label}
    with timer.stage("MLP probes and logit lens"):
        probes = probe_mlps(model, kept, ProbeConfig(batch_size=cfg.batch_size))
        case = kept[0]["prompt"].rsplit("\n", 1)[0] + "\n" + CASE_PROBLEMS[resolve_operation(cfg.op).symbol] \
            if cfg.n_shots else CASE_PROBLEMS[resolve_operation(cfg.op).symbol]
        top = top_number_tokens(model, case)
    figures["top_tokens"] = plot_top_tokens(top, case.splitlines()[-1])
    results |= {"logit_lens": probes.lens_table(), "first_top1_layer": probes.first_top1_layer(),
                "c_rise_range": probes.rise_range("mlp_out", "C")}
    figures["circuit"] = circuit_figure(scores.heads, scores.mlps, {c.head: c.label for c in classes},
                                        top_heads=len(heads), top_mlps=3, rank_by="negative")

    # 4b. edge circuit: EAP-IG edges, faithfulness curve, smallest faithful circuit ---------
    if cfg.circuit_prompts > 0:
        results["edge_circuit"], circuit_figures = _edge_circuit(model, kept, heads, role, cfg, out, timer)
        figures |= circuit_figures

    # 5. AF1 grid ------------------------------------------------------------------------
    if cfg.af1_stride > 0:
        with timer.stage("AF1 grid"):
            results["af1"], af1_figure = _af1_grid(model, cfg)
        if af1_figure is not None:
            figures["af1"] = af1_figure

    # 6. precise SFT of the key heads ------------------------------------------------------
    if cfg.finetune:
        with timer.stage("precise SFT"):
            results["finetune"] = _precise_sft(model, heads, cfg, out)

    # 7. outputs --------------------------------------------------------------------------
    for key, fig in figures.items():
        write_text_atomic(figures_dir / f"{key}.json", fig.to_json())
    if cfg.figures:
        with timer.stage("static figures"), cli.progress(f"writing {cfg.figures} figures"):
            try:  # the run's results matter more than its static copies: a failure is recorded, not fatal
                written = export_figures(figures, figures_dir, parse_formats(cfg.figures))
                results["static_figures"] = [str(p.relative_to(out)) for p in written]
            except StaticExportError as err:
                results["static_figures_error"] = str(err)
                print(f"warning: {err}")
    results["seconds"] = timer.seconds
    results["wall_seconds"] = round(time.perf_counter() - start, 1)
    report = run_report(
        f"The {name} circuit of {cfg.model}",
        dataset=dataset, base_accuracy=base_accuracy, n_kept=len(kept),
        patching_figure=figures["path_patching"], knockout_figure=figures["knockout"],
        head_classes=classes, attention_figures=[figures["attention_roles"], figures["attention_all_heads"]], attention_views=views,
        probes=probes, top_tokens_figure=figures["top_tokens"], circuit_figure=figures["circuit"],
        notes=_summary(results), captions=_captions(results, cfg), notices=_small_samples(results, cfg),
    )
    report.add_figure(figures["knockout_transfer"], heading="Do the key heads transfer?", caption=(
        f"Accuracy (first answer token, top-1) of the full model and with the {len(heads)} key heads mean-ablated, "
        f"per data format (Zhang et al. Figure 4); {cfg.transfer_prompts} prompts per format, all prompts "
        f"(not only correctly answered ones); point estimates, no interval."))
    if "af1" in figures:
        af1 = results["af1"]
        report.add_figure(figures["af1"], heading="All for One", caption=(
            f"AF1 faithfulness per (L_wait, L_transfer) on a coarse grid (every {cfg.af1_stride} L_wait; Mamidanna et "
            f"al. 2025): the share of the {af1['n_eval']} evaluation prompts (zero-shot, one-token answers, templates "
            f"{', '.join(af1['templates'])}; the full model answers {af1['base_accuracy']:.0%}) that the AF1 model still "
            f"answers correctly; 1 = as the full model. Point estimates on one prompt set, no interval."))
    elif "af1" in results:
        report.add_notice(f"All for One: {results['af1']['skipped']}", heading="All for One")
    if "edge_circuit" in results:
        if "skipped" in results["edge_circuit"]:
            report.add_notice(results["edge_circuit"]["skipped"], heading="Edge circuit (EAP-IG)")
        else:
            add_report_section(report, results["edge_circuit"], figures)
    if "finetune" in results:
        report.add_table(results["finetune"]["table"], heading="Precise SFT of the key heads")
    report.add_table(timer.seconds | {"total": results["wall_seconds"]}, heading="Wall time per stage",
                     columns=("stage", "seconds"))
    report.add_settings(dataclasses.asdict(cfg))
    report.save(out / "report.html")
    complete_run(out, results)
    print(_summary(results))
    print(f"report: {out / 'report.html'}")
    return results


MAX_VIEW_TOKENS = 160  # an attention view shows the whole prompt up to this many tokens (a grid grows as n^2)
MIN_READABLE = 20  # fewer prompts than this and a stage's numbers are noise: the report says so instead


def _by_corrupt(by_corrupt: dict, top_k: int) -> dict:
    """Key heads under each counterfactual rule, their overlap, and each head's effect with its interval."""
    out = {}
    for corrupt, s in by_corrupt.items():
        top, _ = key_heads(s, top_k=top_k)
        out[corrupt] = {"key_heads": [str(h) for h in top], "baseline": s.baseline, "n_prompts": s.n_prompts,
                        "effects": {str(h): s.estimate(h).to_dict() for h in top}}
    sets = [set(v["key_heads"]) for v in out.values()]
    out["overlap"] = sorted(set.intersection(*sets))
    if "all" in by_corrupt:
        out["all_scores"] = by_corrupt["all"].to_dict()
    return out


def _summary(results: dict) -> str:
    knock = results["knockout"]
    k = knock["ks"][-1]
    lo, hi = knock["random_ci"][-1] if knock.get("random_ci") else (float("nan"), float("nan"))
    drop = (f"knocking out the top-{k} heads: accuracy {knock['effect_rank'][-1]:.0%} "
            f"vs {knock['random_rank'][-1]:.0%} [{lo:.0%}, {hi:.0%}] for {k} random heads over {knock['n_seeds']} seeds, "
            f"on {knock.get('n_prompts')} prompts the full model answers correctly (there {knock['base_accuracy']:.0%}; "
            f"ablation means over {knock.get('n_pool')} other prompts)")
    return (f"{results['experiment']}: base accuracy {results['base_accuracy']:.1%} of {results['n_prompts']} prompts "
            f"({results['n_kept']} answered correctly); key heads {', '.join(results['key_heads'])} "
            f"({results['key_head_fraction']:.1%} of heads); {drop}.")


def _views_per_head(views: list, heads: list, role: dict, label: str) -> list:
    """Split circuitsvis views of several heads into one view per head, titled with the head and its role."""
    out = []
    for view in views:
        for i, head in enumerate(heads):
            kind = role.get(head, "other")
            out.append(dataclasses.replace(view, attention=view.attention[i:i + 1], head_names=[str(head)],
                                           title=f"{head} ({kind} head), key head #{i + 1}, {label} prompt"
                                           + (f" (its last {MAX_VIEW_TOKENS} tokens)" if len(view.tokens) >= MAX_VIEW_TOKENS
                                              else "")))
    return out


def _captions(results: dict, cfg: PipelineConfig) -> dict[str, str]:
    """Captions that name this run's sample sizes (the rest of the wording is circuits.report.CAPTIONS)."""
    from experiments._report import CAPTIONS

    knock, n = results["knockout"], results["n_kept"]
    n_knock = min(cfg.knockout_prompts, n)
    return {
        "path_patching": CAPTIONS["path_patching"] + f" n = {n} prompts the model answers correctly.",
        "knockout": CAPTIONS["knockout"] + (
            f" n = {knock.get('n_prompts', n_knock)} prompts, ablation means over {knock.get('n_pool')} other prompts; "
            f"effect-rank: one ablation per k, error bars a 95% Wilson interval over prompts; random-rank: mean over "
            f"{knock['n_seeds']} random head sets, error bars a 95% bootstrap interval over prompts and head sets."),
        "attention_roles": CAPTIONS["attention_roles"] + f" n = {n} prompts.",
        "attention_all_heads": CAPTIONS["attention_all_heads"] + f" n = {n} prompts.",
    }


def _small_samples(results: dict, cfg: PipelineConfig) -> list[str]:
    """One notice per stage whose sample is too small to read (fewer than MIN_READABLE prompts)."""
    notes, n = [], results["n_kept"]
    if n < MIN_READABLE:
        notes.append(f"Only {n} of {results['n_prompts']} prompts are answered correctly: path patching, knockout, "
                     f"attention reads and probes below rest on them and are too noisy to read (need >= "
                     f"{MIN_READABLE}; raise --n-prompts or use a stronger model).")
    elif min(cfg.knockout_prompts, n) < MIN_READABLE:
        notes.append(f"The knockout curve uses {min(cfg.knockout_prompts, n)} prompts (< {MIN_READABLE}): one prompt "
                     f"moves accuracy by {1 / min(cfg.knockout_prompts, n):.0%}; raise --knockout-prompts.")
    if "edge_circuit" in results and "skipped" not in results["edge_circuit"] \
            and results["edge_circuit"]["n_heldout"] < MIN_READABLE:
        notes.append(f"The edge circuit is reported on {results['edge_circuit']['n_heldout']} held-out prompts "
                     f"(< {MIN_READABLE}); raise --circuit-prompts (half score and choose, half report).")
    if cfg.transfer_prompts < MIN_READABLE:
        notes.append(f"Transfer formats use {cfg.transfer_prompts} prompts each (< {MIN_READABLE}); raise --transfer-prompts.")
    return notes


def _af1_grid(model, cfg: PipelineConfig):
    """Coarse AF1 faithfulness grid on the zero-shot one-token prompts ``experiments.af1`` searches on.

    AF1's claim is about zero-shot prompts (Mamidanna et al. 2025); the pipeline's few-shot prefix
    would answer a different question. When fewer than ``MIN_READABLE`` prompts are answered
    correctly, no grid is drawn (its cells would be noise): the reason goes to the report instead.
    """
    from patching.af1 import NoEvalPromptsError

    authors = {t.id: t for t in authors_templates(cfg.op)}
    templates = [authors[t] for t in AF1_TEMPLATES if t in authors]
    data = make_template_dataset(model, templates, cfg.af1_prompts, n_shots=0, seed=cfg.seed)
    info = {"templates": [t.id for t in templates], "n_shots": 0, "n_prompts": len(data)}
    try:
        runner = AF1Runner.from_dataset(model, data, AF1Config(batch_size=cfg.batch_size, seed=cfg.seed))
    except NoEvalPromptsError as err:
        return info | {"n_eval": 0, "skipped": f"{err} ({len(data)} zero-shot prompts)"}, None
    info |= {"n_eval": runner.n_eval, "base_accuracy": runner.base_accuracy}
    if runner.n_eval < MIN_READABLE:
        return info | {"skipped": (
            f"only {runner.n_eval} of {len(data)} zero-shot one-token prompts are answered correctly by the full "
            f"model ({runner.base_accuracy:.0%}), fewer than the {MIN_READABLE} a faithfulness grid needs to be "
            f"read; no grid is drawn. Run python -m experiments.af1 for the full search.")}, None
    grid = grid_faithfulness(runner, l_waits=range(0, model.cfg.n_layers + 1, cfg.af1_stride))
    figure = faithfulness_heatmap(grid, f"AF1 faithfulness (zero-shot, {', '.join(info['templates'])}; "
                                        f"every {cfg.af1_stride} L_wait)")
    return info | {"grid": grid}, figure


def _edge_circuit(model, kept, heads, role, cfg: PipelineConfig, out: Path, timer: StageTimer) -> tuple[dict, dict]:
    """The edge-circuit stage of ``experiments.circuit`` with this run's key heads and head classes."""
    n = min(cfg.circuit_prompts, len(kept))
    if n < MIN_CIRCUIT_PROMPTS:
        return {"skipped": f"only {n} correctly answered prompts for the edge circuit (needs >= {MIN_CIRCUIT_PROMPTS}, "
                           f"two per half); raise --n-prompts or --circuit-prompts."}, {}
    stage_cfg = CircuitConfig(model=cfg.model, op=cfg.op, n_prompts=cfg.n_prompts, circuit_prompts=cfg.circuit_prompts,
                              n_shots=cfg.n_shots, seed=cfg.seed, top_k=cfg.top_k, batch_size=cfg.batch_size)
    stage, figures = edge_circuit_stage(model, kept, heads, role, stage_cfg, out, timer)
    print(circuit_summary(stage))
    return stage, figures


def _precise_sft(model, heads, cfg: PipelineConfig, out: Path) -> dict:
    """A short precise SFT of the key heads on training templates; held-out accuracy and drift before/after."""
    base = copy.deepcopy(model)  # the reference for drift; the model itself is tuned in place
    suite = math_suite(model, MathSuiteConfig(ops=(cfg.op,), n_heldout=40, n_transfer=16, seed=cfg.seed + 1))
    before = evaluate(base, base, suite, progress=False)
    batch = 16
    data = arithmetic_train_set(model, ArithmeticMix(ops=(cfg.op,), n_examples=cfg.finetune_steps * batch, seed=cfg.seed))
    with torch.enable_grad():
        result = train(model, data, TrainConfig(lr=1e-4, batch_size=batch, max_steps=cfg.finetune_steps, seed=cfg.seed),
                       method="precise", heads=heads, out_dir=out / "precise_sft")
    after = evaluate(model, base, suite, progress=False)
    table = [{"set": name, "before": before["math"][name], "after": after["math"][name]} for name in suite]
    return {"heads": [str(h) for h in heads], "steps": result.steps, "n_trainable": result.n_trainable,
            "seconds_per_step": result.seconds_per_step, "losses": result.losses,
            "before": before, "after": after, "table": table}


def main(op: str, argv: list[str] | None = None) -> dict:
    """Parse ``argv`` (default: ``sys.argv``), run, return the results; errors propagate (see :func:`cli_main`)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    return run(parse_config(op, argv))


def cli_main(op: str) -> None:
    """``python -m experiments.<operation>``: bad input is one line on stderr and exit status 2 (``--debug``: traceback)."""
    cli.run_cli(lambda argv: main(op, argv), resolve_operation(op).name)
