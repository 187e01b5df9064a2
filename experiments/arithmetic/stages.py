"""The stages of the arithmetic pipeline (``experiments.arithmetic``), one function each, in the order they run.

Every stage takes the run (:data:`PipelineRun`: settings ``run.cfg``, run folder, the results dict
that becomes results.json, and the pipeline's own :class:`PipelineState`: the model and the figures)
and what earlier stages found; it times its work under its own name (``run.stage``), adds its keys to
``results`` and its figures to ``run.state.figures``, and returns what later stages read. Each stage
saves results.json as it ends, so a run that fails late keeps what the earlier stages found.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import plotly.graph_objects as go
import torch
from datasets import Dataset
from transformer_lens import HookedTransformer

from circuits.analyze.attention import (
    HeadClass, HeadClassConfig, attention_reads, attention_views, classes_table, classify_heads, plot_role_distribution,
    plot_role_heatmap,
)
from circuits.show.node_circuit import circuit_figure
from circuits.show.static_export import StaticExportError, export_figures, parse_formats
from circuits.errors import InputError
from circuits import Head
from circuits.analyze.probes import ProbeConfig, ProbeResults, plot_top_tokens, probe_mlps, top_number_tokens
from circuits.atomic_files import write_text_atomic
from circuits.answer_scoring import first_and_whole
from circuits.seeds import derived_seed
from circuits.stats import proportion
from circuits.tasks import filter_correct, make_dataset, transfer_datasets
from circuits.templates import resolve_operation
from finetune import ArithmeticMix, MathSuiteConfig, TrainConfig, arithmetic_train_set, evaluate_suite, math_suite, train
from patching import SweepOptions, key_heads, knockout_curve, knockout_transfer, path_patch
from patching.all_for_one import AF1Config, AF1Runner, authors_templates, make_template_dataset
from patching.all_for_one.runner import NoEvalPromptsError
from patching.all_for_one.search import faithfulness_heatmap, grid_faithfulness
from patching.node_level.head_ranking import combine_key_heads
from patching.sweeps.results import KnockoutCurve, NodeScores

from experiments.arithmetic.config import MIN_READABLE, PipelineConfig
from experiments.runtime import Run
from experiments.runtime.edge_circuit import edge_circuit_stage
from experiments.runtime.node_info import path_patching_info
from experiments.runtime.edge_circuit import summary as circuit_summary
from experiments.runtime.settings import project
from patching.edges.faithful_circuit import MIN_PROMPTS as MIN_CIRCUIT_PROMPTS
from patching.edges import CircuitSearch

AF1_TEMPLATES = ("af1-equation", "af1-verbal", "af1-question")  # experiments.af1's default search templates
CASE_PROBLEMS = {"+": "4 + 3 = ", "-": "7 - 3 = ", "*": "4 * 2 = ", "/": "8 / 2 = "}
MAX_VIEW_TOKENS = 160  # an attention view shows the whole prompt up to this many tokens (a grid grows as n^2)
FINETUNE_BATCH = 16  # prompts per step of the short precise SFT run


@dataclass
class PipelineState:
    """What the pipeline's stages carry beside the run's settings and results: the model and the figures drawn."""

    model: HookedTransformer
    figures: dict[str, go.Figure] = field(default_factory=dict)


#: a pipeline run; its ``name`` is the operation's name (``addition``, ``subtraction``, ...)
PipelineRun = Run[PipelineConfig, PipelineState]


@dataclass
class Prompts:
    """Stage 1: the sampled prompts, which of them the model answers, and the answered ones' twins per rule."""

    dataset: Dataset
    correct: list[bool]
    kept: Dataset  # the correctly answered prompts (their twins corrupt the queried operator)
    twins: dict[str, Dataset]  # counterfactual rule ("query", "all") -> the kept prompts with such twins
    base_accuracy: float


@dataclass
class KeyHeadChoice:
    """Stage 2: path patching under each counterfactual rule, and the key heads of ``cfg.corrupt``'s ranking."""

    by_corrupt: dict[str, NodeScores]
    scores: NodeScores  # the ranking the key heads, the knockout curve and the node circuit use
    heads: list[Head]


@dataclass
class HeadRoles:
    """Stage 4: every head's attention class, the label per head, and attention views of the key heads."""

    classes: list[HeadClass]
    role: dict[Head, str]
    views: list


# ---------------------------------------------------------------------------- 0. settings the model checks


def check_settings_against_model(cfg: PipelineConfig, model: HookedTransformer) -> None:
    """Refuse, right after the model loads and before any work, head counts the model does not have.

    ``--knockout-ks 1,99`` on a model of 72 heads would otherwise knock out 1 head and drop 99 without a
    word; ``--top-k 99`` would choose every head and call them the key heads.
    """
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    total = n_layers * n_heads
    too_many = [k for k in (int(k) for k in cfg.knockout_ks.split(",") if k.strip()) if k > total]
    if too_many:
        raise InputError(f"--knockout-ks {cfg.knockout_ks}: {', '.join(map(str, too_many))} "
                         f"{'is' if len(too_many) == 1 else 'are'} more heads than {cfg.model} has ({total} = "
                         f"{n_layers} layers x {n_heads} heads); give counts in 1..{total}.")
    if cfg.top_k > total:
        raise InputError(f"--top-k {cfg.top_k} is more heads than {cfg.model} has ({total} = {n_layers} layers x "
                         f"{n_heads} heads); give at most {total}.")


# ---------------------------------------------------------------------------- 1. data


def prepare_prompts(run: PipelineRun) -> Prompts:
    """Few-shot prompts, base accuracy (first token, whole answer, per style), the correctly answered ones."""
    cfg, model = run.cfg, run.state.model
    with run.stage("data"):
        task = cfg.task_config(corrupt="query")  # the twins of kept; "all" is built below
        with run.step(f"building {cfg.n_prompts} {run.name} prompts"):
            dataset = make_dataset(model, task)
        with run.step(f"base accuracy on {len(dataset)} prompts (first token and whole answer, one pass)"):
            mask, whole = first_and_whole(model, dataset, cfg.batch_size)
        kept, base_accuracy = filter_correct(model, dataset, mask=mask)
        # the same prompts with every operator corrupted in their twins (shots included)
        twins = {"query": kept, "all": make_dataset(model, task, corrupt="all").select([i for i, ok in enumerate(mask) if ok])}
        accuracy = _accuracy_estimates(dataset, mask, whole)
    run.results |= {"model": cfg.model, "n_layers": model.cfg.n_layers, "n_heads": model.cfg.n_heads,
                    "n_prompts": len(dataset), "n_kept": len(kept), "base_accuracy": base_accuracy,
                    "accuracy_by_style": _style_accuracy(dataset, mask), "accuracy": accuracy}
    print(f"base accuracy {base_accuracy:.1%} on {len(dataset)} prompts (whole answer "
          f"{accuracy['whole_answer']['value']:.1%}); {len(kept)} kept")
    return Prompts(dataset, mask, kept, twins, base_accuracy)


def _by_style(dataset, mask) -> dict[str, list[bool]]:
    by_style: dict[str, list[bool]] = {}
    for style, ok in zip(dataset["style"], mask):
        by_style.setdefault(style, []).append(ok)
    return by_style


def _style_accuracy(dataset, mask) -> dict[str, float]:
    return {style: sum(v) / len(v) for style, v in _by_style(dataset, mask).items()}


def _style_estimates(dataset, mask) -> dict[str, dict]:
    return {style: proportion(torch.tensor(v, dtype=torch.float64)).to_dict() for style, v in _by_style(dataset, mask).items()}


def _accuracy_estimates(dataset, mask, whole) -> dict:
    """First-token accuracy beside the whole answer (teacher-forced) and one-token answers, each with a Wilson interval."""
    one_token = [ok for ok, ids in zip(mask, dataset["answer_token_ids"]) if len(ids) == 1]
    as_tensor = lambda v: torch.tensor(v, dtype=torch.float64)
    return {"first_token": proportion(as_tensor(mask)).to_dict(), "whole_answer": proportion(as_tensor(whole)).to_dict(),
            "one_token_answers": proportion(as_tensor(one_token)).to_dict(),
            "by_style_first_token": _style_estimates(dataset, mask), "by_style_whole_answer": _style_estimates(dataset, whole),
            "interval": "95% Wilson over prompts"}


# ---------------------------------------------------------------------------- 2. identify


def identify_key_heads(run: PipelineRun, prompts: Prompts) -> KeyHeadChoice:
    """Path patching of every head and MLP to the answer logit, under both twin rules; the top-k heads of one."""
    cfg = run.cfg
    with run.stage("path patching"):
        by_corrupt = {c: path_patch(run.state.model, prompts.twins[c], options=SweepOptions(batch_size=cfg.batch_size))
                      for c in ("query", "all")}
        scores = by_corrupt[cfg.corrupt]
        heads, fraction = key_heads(scores, top_k=cfg.top_k)
        rule = combine_key_heads({cfg.op: scores}, top_k=cfg.top_k).rule | {"corrupt": cfg.corrupt}
    run.state.figures["path_patching"] = scores.figure(title=f"Path patching, {run.name}: effect on the answer logit (%), "
                                                       f"twins corrupt={cfg.corrupt!r}", key_heads=heads)
    run.results |= {"path_patching": scores.to_dict(), "key_heads": [str(h) for h in heads], "key_head_fraction": fraction,
                    "key_heads_rule": rule, "corrupt": cfg.corrupt,
                    "identification_by_corrupt": _by_corrupt(by_corrupt, cfg.top_k)}
    return KeyHeadChoice(by_corrupt, scores, heads)


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


# ---------------------------------------------------------------------------- 3. validate


def knock_out(run: PipelineRun, prompts: Prompts, chosen: KeyHeadChoice) -> KnockoutCurve:
    """Knockout curves: the top-k heads mean-ablated against k random heads, on correctly answered prompts."""
    cfg, model, kept = run.cfg, run.state.model, prompts.kept
    with run.stage("knockout"):
        knock_data = kept.shuffle(seed=cfg.seed).select(range(min(cfg.knockout_prompts, len(kept))))
        ks = [int(k) for k in cfg.knockout_ks.split(",") if k.strip()]  # checked against the model at load
        curve = knockout_curve(model, knock_data, chosen.scores, ks=ks, n_seeds=cfg.knockout_seeds,
                               n_pool=cfg.knockout_pool, seed=cfg.seed, options=SweepOptions(batch_size=cfg.batch_size))
        run.results["knockout"] = curve.to_dict()  # saved with this stage, before the (slower) transfer formats
    run.state.figures["knockout"] = curve.figure(title=f"Knockout, {run.name}: effect-rank vs random-rank heads")
    return curve


def knock_out_on_transfer_formats(run: PipelineRun, chosen: KeyHeadChoice, curve: KnockoutCurve) -> dict[str, Dataset]:
    """The key heads knocked out on other formats (multi-digit, decimals, word problems, zero-shot); the formats."""
    cfg, model = run.cfg, run.state.model
    with run.stage("knockout on transfer formats"):
        formats = transfer_datasets(model, cfg.op, n_prompts=cfg.transfer_prompts, seed=cfg.seed, n_shots=cfg.n_shots)
        curve.transfer = knockout_transfer(model, formats, chosen.heads, n_pool=cfg.knockout_pool, drop_uncovered=True,
                                           seed=cfg.seed, options=SweepOptions(batch_size=cfg.batch_size))
    run.state.figures["knockout_transfer"] = curve.transfer_figure(title=f"Key heads of {run.name} knocked out on other formats")
    run.results["knockout"] = curve.to_dict()
    return formats


# ---------------------------------------------------------------------------- 4. analyze


def read_attention(run: PipelineRun, prompts: Prompts, chosen: KeyHeadChoice, formats: dict[str, Dataset]) -> HeadRoles:
    """Every head's END-query attention, classified into operand / operator heads; views of the top key heads."""
    model, heads = run.state.model, chosen.heads
    with run.stage("attention reads"):
        reads = attention_reads(model, prompts.kept, batch_size=run.cfg.batch_size)  # every head: cheap, END query only
        classes = classify_heads(reads, HeadClassConfig())
        key_classes = [c for c in classes if c.head in set(heads)]
        role = {c.head: c.label for c in classes}
        views = _views_per_head(attention_views(model, prompts.kept, heads[:4], max_prompts=1, last_tokens=MAX_VIEW_TOKENS),
                                heads[:4], role, "few-shot")
        for format_name in ("multi_digit", "word_problem"):
            views += _views_per_head(attention_views(model, formats[format_name], heads[:1], max_prompts=1,
                                                     last_tokens=MAX_VIEW_TOKENS),
                                     heads[:1], role, format_name.replace("_", "-"))
    run.state.figures["attention_roles"] = plot_role_distribution(reads, heads, key_classes,
                                                            title=f"END-query attention of the key heads, {run.name}")
    run.state.figures["attention_all_heads"] = plot_role_heatmap(reads, model.cfg.n_layers, model.cfg.n_heads)
    run.results |= {"head_classes": classes_table(key_classes), "all_head_classes": classes_table(classes, only_labelled=True),
                    "operand_heads": [str(c.head) for c in classes if c.label == "operand"],
                    "operator_heads": [str(c.head) for c in classes if c.label == "operator"]}
    ranks = {c: [n for n, _ in s.ranked("heads", by="neg")] for c, s in chosen.by_corrupt.items()}
    run.results["identification_by_corrupt"]["labelled_head_ranks"] = {
        str(c.head): {"label": c.label, **{k: ranks[k].index(c.head) + 1 for k in ranks}} for c in classes if c.label}
    return HeadRoles(classes, role, views)


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


def probe_mlps_and_lens(run: PipelineRun, prompts: Prompts) -> ProbeResults:
    """MLP probes (similarity to operands and answer), the logit lens, the top number tokens of one worked case."""
    cfg = run.cfg
    with run.stage("MLP probes and logit lens"):
        probes = probe_mlps(run.state.model, prompts.kept, ProbeConfig(batch_size=cfg.batch_size))
        problem = CASE_PROBLEMS[resolve_operation(cfg.op).symbol]
        case = prompts.kept[0]["prompt"].rsplit("\n", 1)[0] + "\n" + problem if cfg.n_shots else problem
        top = top_number_tokens(run.state.model, case)
    run.state.figures["top_tokens"] = plot_top_tokens(top, case.splitlines()[-1])
    run.results |= {"logit_lens": probes.lens_table(), "first_top1_layer": probes.first_top1_layer(),
                    "c_rise_range": probes.rise_range("mlp_out", "C")}
    return probes


def draw_node_circuit(run: PipelineRun, chosen: KeyHeadChoice, roles: HeadRoles) -> None:
    """The node circuit figure: key heads coloured by role, the top MLPs, the logits."""
    run.state.figures["circuit"] = circuit_figure(chosen.scores.heads, chosen.scores.mlps, {c.head: c.label for c in roles.classes},
                                            top_heads=len(chosen.heads), top_mlps=3, rank_by="negative")


def find_edge_circuit(run: PipelineRun, prompts: Prompts, chosen: KeyHeadChoice, roles: HeadRoles) -> None:
    """The edge-circuit stage of ``experiments.circuit`` with this run's key heads and head classes."""
    cfg = run.cfg
    n = min(cfg.circuit_prompts, len(prompts.kept))
    if n < MIN_CIRCUIT_PROMPTS:
        run.results["edge_circuit"] = {
            "skipped": f"only {n} correctly answered prompts for the edge circuit (needs >= {MIN_CIRCUIT_PROMPTS}, "
                       f"two per half); raise --n-prompts or --circuit-prompts."}
        return
    search = project(cfg, CircuitSearch, method=cfg.circuit_method, warm_start=cfg.warm_start_method(),
                     learning=cfg.learn_config())
    stage, figures = edge_circuit_stage(run.state.model, prompts.kept, chosen.heads, roles.role, search, out=run.out,
                                        op=cfg.op, model_name=cfg.model, stage=run.stage,
                                        stability_sets=cfg.circuit_stability_sets,
                                        node_info=path_patching_info(run.results.get("path_patching")))
    print(circuit_summary(stage))
    run.results["edge_circuit"] = stage
    run.state.figures |= figures


# ---------------------------------------------------------------------------- 5. AF1


def af1_grid(run: PipelineRun) -> None:
    """Coarse AF1 faithfulness grid on the zero-shot one-token prompts ``experiments.af1`` searches on.

    AF1's claim is about zero-shot prompts (Mamidanna et al. 2025); the pipeline's few-shot prefix
    would answer a different question. When fewer than ``MIN_READABLE`` prompts are answered
    correctly, no grid is drawn (its cells would be noise): the reason goes to the report instead.
    """
    with run.stage("AF1 grid"):
        run.results["af1"], figure = _af1_grid(run.state.model, run.cfg)
    if figure is not None:
        run.state.figures["af1"] = figure


def _af1_grid(model, cfg: PipelineConfig) -> tuple[dict, go.Figure | None]:
    authors = {t.id: t for t in authors_templates(cfg.op)}
    templates = [authors[t] for t in AF1_TEMPLATES if t in authors]
    data = make_template_dataset(model, templates, cfg.af1_prompts, n_shots=0, seed=cfg.seed)
    info = {"templates": [t.id for t in templates], "n_shots": 0, "n_prompts": len(data)}
    try:
        runner = AF1Runner.from_dataset(model, data, AF1Config(seed=cfg.seed),
                                        options=SweepOptions(batch_size=cfg.batch_size))
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
                                        f"every {cfg.af1_stride} L_wait)", n_prompts=runner.n_eval)
    return info | {"grid": grid}, figure


# ---------------------------------------------------------------------------- 6. precise SFT


def tune_key_heads(run: PipelineRun, heads: list[Head]) -> None:
    """A short precise SFT of the key heads on training templates; held-out accuracy and drift before/after."""
    cfg, model = run.cfg, run.state.model
    with run.stage("precise SFT"):
        base = copy.deepcopy(model)  # the reference for drift; the model itself is tuned in place
        suite = math_suite(model, MathSuiteConfig(ops=(cfg.op,), n_heldout=40, n_transfer=16,
                                                    seed=derived_seed(cfg.seed, "test suite")))
        before = evaluate_suite(base, base, suite, progress=False)
        data = arithmetic_train_set(model, ArithmeticMix(ops=(cfg.op,), n_examples=cfg.finetune_steps * FINETUNE_BATCH,
                                                         seed=cfg.seed))
        with torch.enable_grad():
            train_cfg = TrainConfig(lr=1e-4, batch_size=FINETUNE_BATCH, max_steps=cfg.finetune_steps, seed=cfg.seed)
            result = train(model, data, train_cfg, method="precise", heads=heads, out_dir=run.out / "precise_sft")
        after = evaluate_suite(model, base, suite, progress=False)
        table = [{"set": name, "before": before["math"][name], "after": after["math"][name]} for name in suite]
        run.results["finetune"] = {"heads": [str(h) for h in heads], "steps": result.steps,
                                   "n_trainable": result.n_trainable, "seconds_per_step": result.seconds_per_step,
                                   "losses": result.losses, "before": before, "after": after, "table": table}


# ---------------------------------------------------------------------------- 7. outputs


def write_figures(run: PipelineRun) -> None:
    """figures/<key>.json (plotly) for every figure; with ``--figures``, static copies sized for a paper."""
    figures_dir = run.out / "figures"  # created by the first figure written, so an interrupted run leaves none
    for key, fig in run.state.figures.items():
        write_text_atomic(figures_dir / f"{key}.json", fig.to_json())
    if not run.cfg.figures:
        return
    with run.stage("static figures"), run.step(f"writing {run.cfg.figures} figures"):
        try:  # the run's results matter more than its static copies: a failure is recorded, not fatal
            written = export_figures(run.state.figures, figures_dir, parse_formats(run.cfg.figures))
            run.results["static_figures"] = [str(p.relative_to(run.out)) for p in written]
        except StaticExportError as err:
            run.results["static_figures_error"] = str(err)
            print(f"warning: {err}")
