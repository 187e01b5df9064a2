"""All for One: where does a model wait, transfer and compute alone? (Mamidanna et al. 2025)

    python -m experiments.af1 [--model gemma-3-270m] [--op +] [--templates af1-equation ...]
                              [--n-prompts 100] [--means cross-fit|split] [--out runs/af1-<timestamp>] [--overwrite]

1. prompts: ``--n-prompts`` zero-shot prompts per search template (one-digit operands; 100 = all
   pairs), ``--n-shots`` solved examples first if asked. ``--means cross-fit`` (default): the
   prompts fall in ``--n-folds`` folds (stratified by the second operand); each fold's prompts with
   a one-token answer that the full model answers correctly are evaluated with CAMA means fitted on
   the other folds, two-digit sums included, so no prompt meets its own mean and no mean falls back
   for lack of prompts (the fallback fraction is reported). ``--means split``: the earlier scheme,
   one-token answers only, a fit half and an eval half;
2. grid: AF1 faithfulness for every (L_wait, L_transfer) (``patching.all_for_one.search``), and at the
   paper's cell (in our layer convention) and its depth-scaled twin, with no selection;
3. selection: the largest L_wait reaching ``--min-faithfulness`` with the fewest
   transfer layers; greedy pruning of its transfer heads at ``--prune-keep``; the same
   selection (and the most faithful cell) chosen on half of the eval prompts and reported on
   the other half with a 95% Wilson interval, then with the halves swapped: both held-out
   scores pooled give one estimate on every eval prompt, each scored under a cell chosen
   without it (``held_out_selection.cross_fit``);
4. the authors' five formats (equation "A+B=", verbal, question, word problem,
   Python): faithfulness of the selected setting (all heads and pruned heads) per
   template, and faithfulness against L_wait at the selected L_transfer;
5. outputs in ``--out``: results.json, heatmap.html, report.html.

``--isolate W,T ...`` replaces 2-4: it scores those pre-specified cells on the same eval prompts
under one change at a time (no CAMA, non-last tokens with full peek, 5 folds, every mean a
fallback), paired against the AF1 model, to find what limits faithfulness (results.json only).

Template ids: ``af1-equation``, ``af1-verbal``, ``af1-question``, ``af1-word``,
``af1-python`` (``patching.all_for_one.template_prompts.authors_templates``) or any id of ``circuits.templates``.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from circuits.errors import InputError
from circuits.show.html_report import Report
from experiments.runtime.run_folder import StageTimer
from circuits.atomic_files import write_text_atomic
from circuits.templates import template_by_id

from experiments.runtime import ModelLoader, Run, RunSettings, cli, option, run_experiment
from experiments.runtime.cli import override
from experiments.runtime.settings import BatchSettings, PromptSettings

if TYPE_CHECKING:  # the library loads torch: imported where used, so --help answers before it loads
    from patching.all_for_one import AF1Config, AF1Runner
    from patching.all_for_one.search import AF1SearchResult


@dataclass(frozen=True)
class AF1ExperimentConfig(BatchSettings, PromptSettings, RunSettings):
    """Every flag of ``python -m experiments.af1`` beyond :class:`RunSettings`, with its default."""

    op: str = option("+", "operation: +, -, * or / (or its name)")
    templates: tuple[str, ...] = option(("af1-equation", "af1-verbal", "af1-question"), "templates of the grid search")
    n_prompts: int = override(PromptSettings, "n_prompts", 100, "operand pairs per template (at most all pairs: 100 for "
                              "+ on 0..9; with --means split, at most the pairs with a one-token answer: 55)")
    means: str = option("cross-fit", "CAMA means cross-fitted over folds of all pairs (default) or fitted on a fixed "
                        "half of the one-token prompts (the earlier scheme)", choices=("cross-fit", "split"))
    n_folds: int = option(2, "folds of the cross-fitted CAMA means", type=cli.positive_int)
    operand_max: int = option(9, "operands are drawn from 0..operand-max", type=cli.nonnegative_int)
    n_shots: int = override(PromptSettings, "n_shots", 0, "solved examples of the same template before each prompt (the "
                            "paper is zero-shot; gemma-3-270m answers few one-token sums zero-shot)")
    min_count: int = option(2, "CAMA: prompts needed for a token-conditioned mean", type=cli.positive_int)
    min_faithfulness: float = option(0.9, "faithfulness an (L_wait, L_transfer) setting must reach to be selected",
                                     type=cli.fraction)
    prune_keep: float = option(0.95, "pruning keeps removing transfer heads while faithfulness stays above this share "
                               "of the unpruned one", type=cli.fraction)
    no_authors: bool = option(False, "skip the authors' five formats")
    isolate: tuple[str, ...] | None = option(None, "instead of the search: score these pre-specified (L_wait, "
                                             "L_transfer) cells, as W,T, under each isolation variant on the same "
                                             "eval prompts (paired), to find what limits faithfulness", nargs="+")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.means == "cross-fit" and self.n_folds < 2:
            raise InputError(f"--n-folds {self.n_folds} with --means cross-fit: cross-fitting fits the means on the "
                             "other folds and evaluates on one, so it needs --n-folds 2 or more (or --means split).")

    def af1_config(self) -> AF1Config:
        """The :class:`patching.all_for_one.AF1Config` these flags describe."""
        from patching.all_for_one.cama import CamaConfig
        from patching.all_for_one import AF1Config

        return AF1Config(cama=CamaConfig(min_count=self.min_count),
                         min_faithfulness=self.min_faithfulness, prune_keep=self.prune_keep, seed=self.seed)


parser = cli.config_parser(AF1ExperimentConfig, "af1", __doc__)


# The authors' demo (af1-demo, table_4_original.py) on Llama-3-8B (32 layers): CAMA at
# blocks.{14}.hook_resid_post, full peek in blocks 15-16, self peek from block 17 on. Our
# L_wait counts the blocks run before CAMA (hook_resid_pre of block L_wait), so theirs is (15, 2) here.
PAPER_CELL = {"model": "Llama-3-8B", "n_layers": 32, "their_wait_until_layer": 14, "their_full_peek_period": 2,
              "their_hook": "blocks.14.hook_resid_post", "l_wait_ours": 15, "l_transfer": 2}
LAYER_CONVENTION = (
    "Ours: L_wait = the number of blocks run before CAMA; CAMA replaces blocks.{L_wait}.hook_resid_pre, full peek "
    "in blocks L_wait .. L_wait+L_transfer-1, self peek after. The authors' demo (table_4_original.py) patches "
    "blocks.{W}.hook_resid_post for wait_until_layer=W and gives full peek to blocks W+1 .. W+full_peek_period: "
    "their (W, T) is our (W+1, T). The paper's Llama-3-8B cell (14, 2) is our (15, 2) of 32 layers, i.e. CAMA "
    "after 47% of the blocks and 2 transfer blocks (6%).")


def _depth_scaled_cell(n_layers: int) -> tuple[int, int]:
    """The paper's cell scaled to this model's depth (same fraction of blocks waited, >= 1 transfer block)."""
    wait = round(PAPER_CELL["l_wait_ours"] / PAPER_CELL["n_layers"] * n_layers)
    transfer = max(1, round(PAPER_CELL["l_transfer"] / PAPER_CELL["n_layers"] * n_layers))
    return wait, min(transfer, n_layers - wait)


def _one_token(data) -> list[bool]:
    return [len(ids) == 1 for ids in data["answer_token_ids"]]


# ---------------------------------------------------------------------------- stage: data and the AF1 runner


def build_runner(model, templates, cfg: AF1ExperimentConfig, config: AF1Config) -> tuple[AF1Runner, dict]:
    """The AF1 runner for ``templates`` (``--means``) and how many prompts each template gave."""
    from patching import SweepOptions
    from patching.all_for_one import AF1Runner, make_template_dataset

    cross_fit = cfg.means == "cross-fit"
    data = make_template_dataset(model, templates, cfg.n_prompts, operand_range=(0, cfg.operand_max),
                                 n_shots=cfg.n_shots, seed=cfg.seed, single_token_answers=not cross_fit)
    options = SweepOptions(batch_size=cfg.batch_size)
    if cross_fit:
        runner = AF1Runner.cross_fitted(model, data, config, eligible=_one_token(data), n_folds=cfg.n_folds,
                                        options=options)
    else:
        runner = AF1Runner.from_dataset(model, data, config, options=options)
    per_template = {}
    prompt_templates = runner.prompt_templates
    for template in templates:
        rows = [i for i, t in enumerate(data["template_id"]) if t == template.id]
        per_template[template.id] = {"n_prompts": len(rows),
                                     "n_one_token": sum(_one_token(data.select(rows))) if rows else 0,
                                     "n_eval_correct": prompt_templates.count(template.id)}
    return runner, per_template


# ---------------------------------------------------------------------------- stage: isolation (--isolate)


#: the isolation variants of ``--isolate``, in the order :func:`_variant_runners` lists them (one stage each)
ISOLATION_VARIANTS = ("main", "abp_only", "others_full_peek", "five_folds", "all_fallback")


def _variant_runners(model, runner: AF1Runner, templates, cfg: AF1ExperimentConfig, config: AF1Config):
    """The isolation variants: each changes one thing of the main (cross-fitted) AF1 model."""
    from patching.all_for_one.cama import CamaConfig

    return {
        "main": lambda: runner,
        # CAMA skipped: only the ABP restrictions (what the attention masks alone cost)
        "abp_only": lambda: runner.with_config(ablate_wait=False),
        # non-last tokens may keep reading each other after L_wait (the paper forbids it)
        "others_full_peek": lambda: runner.with_config(others="full"),
        # means from 4/5 instead of 1/2 of the pairs: how much mean noise costs
        "five_folds": lambda: build_runner(model, templates, dataclasses.replace(cfg, n_folds=5), config)[0],
        # every token-conditioned mean replaced by the position mean: the fallback everywhere
        "all_fallback": lambda: build_runner(model, templates, cfg, dataclasses.replace(
            config, cama=CamaConfig(min_count=10 ** 9)))[0],
    }


def _isolation_cells(model, cfg: AF1ExperimentConfig) -> list[tuple[int, int]]:
    from patching.all_for_one.runner import check_setting

    try:
        cells = [tuple(int(x) for x in cell.split(",")) for cell in cfg.isolate]
    except ValueError:
        raise InputError(f"--isolate takes cells as W,T (e.g. 7,6), got {list(cfg.isolate)}.") from None
    for w, t in cells:
        check_setting(model, w, t)
    return cells


def _score_variant(variant: AF1Runner, runner: AF1Runner, cells, main_hits) -> tuple[dict, dict]:
    """One variant's hits in the main runner's prompt order, and its cells paired against the main model."""
    import torch

    from circuits.stats import paired_difference, proportion

    order = {p: i for i, p in enumerate(variant.prompts)}
    align = torch.tensor([order[p] for p in runner.prompts])  # the main runner's prompt order
    rows = {w: [h[align] for h in variant.sweep_transfer_hits(w)] for w in sorted({w for w, _ in cells})}
    main_hits = main_hits or rows
    result = {"fallback_fraction": variant.cama_counts()["fallback_fraction"], "cells": {}}
    for w, t in cells:
        hit = rows[w][t].double()
        result["cells"][f"{w},{t}"] = {"faithfulness": proportion(hit).to_dict(),
                                      "minus_main": paired_difference(hit, main_hits[w][t].double()).to_dict()}
    best = max(((w, t) for w in rows for t in range(len(rows[w]))), key=lambda c: float(rows[c[0]][c[1]].float().mean()))
    result["best_in_rows"] = {"l_wait": best[0], "l_transfer": best[1],
                              "faithfulness": proportion(rows[best[0]][best[1]].double()).to_dict()}
    return result, rows


def isolate(model, cfg: AF1ExperimentConfig, config: AF1Config, templates, stage) -> dict:
    """Score pre-specified cells under each variant on the same eval prompts, paired against the main model
    (``stage``: the run's ``Run.stage``)."""
    cells = _isolation_cells(model, cfg)
    with stage("data, CAMA means and cached residuals"):
        runner, counts = build_runner(model, templates, cfg, config)
    out, main_hits = {"cells": [list(c) for c in cells], "search_counts": counts, "variants": {}}, None
    for name, make in _variant_runners(model, runner, templates, cfg, config).items():
        with stage(f"isolation: {name}"):
            result, rows = _score_variant(make(), runner, cells, main_hits)
        main_hits = main_hits or rows
        out["variants"][name] = result
        best = result["best_in_rows"]
        print(f"{name:18s} " + "  ".join(f"({c}) {v['faithfulness']['value']:.0%}" for c, v in result["cells"].items())
              + f"  best in rows ({best['l_wait']}, {best['l_transfer']}): {best['faithfulness']['value']:.0%}")
    out["n_eval"] = runner.n_eval
    return out


# ---------------------------------------------------------------------------- stages of the search


def grid_search(model, cfg: AF1ExperimentConfig, config: AF1Config, templates, stage):
    """Data, grid and the selected (pruned) setting on all eval prompts: (runner, counts, hits, search); each step
    timed as a stage of the run (``stage``: its ``Run.stage``)."""
    from patching.all_for_one import search_af1
    from patching.all_for_one.search import grid_hits

    with stage("data, CAMA means and cached residuals"):
        runner, counts = build_runner(model, templates, cfg, config)
    fallback = runner.cama_counts()["fallback_fraction"]
    print(f"search data: eval candidates {runner.n_eval_total}, full-model accuracy {runner.base_accuracy:.1%}, "
          f"{runner.n_eval} correct prompts kept ({counts}); CAMA fallback fraction "
          f"{fallback:.1%}; a constant answer would score {runner.constant_baseline:.1%}")
    with stage("grid"):
        hits = grid_hits(runner)
    with stage("selection and pruning"):
        search = search_af1(model, None, config, runner=runner, hits=hits)
    print(f"selected (all eval prompts, in-sample) L_wait={search.l_wait} L_transfer={search.l_transfer}: "
          f"faithfulness {search.faithfulness:.1%}{'' if search.meets_threshold else ' (below the threshold: best cell)'}; "
          f"{len(search.kept_heads)}/{search.n_transfer_heads} transfer heads kept "
          f"({search.pruned_faithfulness:.1%}): {[str(h) for h in search.kept_heads]}")
    return runner, counts, hits, search


def held_out(runner: AF1Runner, hits, cfg: AF1ExperimentConfig) -> dict:
    """The winner's curse: the cell chosen on one half of the eval prompts, reported on the other (and swapped)."""
    from patching.all_for_one.search import held_out_selection

    if runner.n_eval < 2:
        return {"skipped": f"{runner.n_eval} evaluation prompt(s): nothing to hold out"}
    result = held_out_selection(runner, min_faithfulness=cfg.min_faithfulness, seed=cfg.seed, hits=hits)
    for name, rule in result["rules"].items():
        est = rule["held_out_faithfulness"]
        print(f"held out ({name}): cell ({rule['l_wait']}, {rule['l_transfer']}) chosen on "
              f"{len(result['selection_prompts'])} prompts ({rule['selection_faithfulness']:.1%}) scores "
              f"{est['value']:.1%} [{est['low']:.1%}, {est['high']:.1%}] on the other {est['n']}")
    for name, rule in result["cross_fit"].items():
        est, cells = rule["pooled_faithfulness"], [(f["l_wait"], f["l_transfer"]) for f in rule["folds"]]
        print(f"cross-fitted ({name}): cells {cells[0]} (chosen on A) and {cells[1]} (chosen on B), "
              f"{'the same' if rule['cells_agree'] else 'different'}; pooled held-out {est['value']:.1%} "
              f"[{est['low']:.1%}, {est['high']:.1%}] over all {est['n']} prompts")
    return result


def paper_cells(hits, n_layers: int) -> dict:
    """The paper's cell in our convention and its depth-scaled twin, on all eval prompts (no selection)."""
    from patching.all_for_one.search import cell_estimate

    cells = {}
    for name, (w, t) in {"paper_cell_ours": (PAPER_CELL["l_wait_ours"], PAPER_CELL["l_transfer"]),
                         "depth_scaled": _depth_scaled_cell(n_layers)}.items():
        if w + t <= n_layers and (w, t) in hits:
            cells[name] = cell_estimate(hits, w, t)
            est = cells[name]["faithfulness"]
            print(f"{name} ({w}, {t}), no selection: {est['value']:.1%} [{est['low']:.1%}, {est['high']:.1%}] n={est['n']}")
    return cells


def _format_row(model, template, cfg: AF1ExperimentConfig, config: AF1Config, search: AF1SearchResult) -> dict:
    """One author format at the selected setting: faithfulness (all and pruned heads), and along L_wait."""
    from circuits.stats import proportion
    from patching.all_for_one.runner import NoEvalPromptsError

    try:
        t_runner, counts = build_runner(model, [template], cfg, config)
    except NoEvalPromptsError as err:  # e.g. a format the model never answers: report it, go on
        print(f"{template.id:14s} skipped: {err}")
        return {"template": template.id, "text": template.text, "n_eval": 0, "skipped": str(err)}
    n_layers = model.cfg.n_layers
    along_wait = [t_runner.faithfulness(w, search.l_transfer) for w in range(n_layers - search.l_transfer + 1)]
    hit = t_runner.correct(search.l_wait, search.l_transfer).double()
    row = {
        "template": template.id, "text": template.text, "n_eval": t_runner.n_eval,
        **counts[template.id], "base_accuracy": t_runner.base_accuracy,
        "constant_baseline": t_runner.constant_baseline,
        "faithfulness": along_wait[search.l_wait], "faithfulness_ci": proportion(hit).to_dict(),
        "faithfulness_pruned": t_runner.faithfulness(search.l_wait, search.l_transfer, search.kept_heads),
        "cama_fallback_fraction": t_runner.cama_counts()["fallback_fraction"],
        "faithfulness_by_l_wait": along_wait,
    }
    print(f"{template.id:14s} full acc {row['base_accuracy']:.0%}  n={row['n_eval']:3d}  "
          f"AF1 {row['faithfulness']:.0%}  pruned {row['faithfulness_pruned']:.0%}  "
          f"fallback {row['cama_fallback_fraction']:.0%}")
    return row


def authors_formats(model, cfg: AF1ExperimentConfig, config: AF1Config, search: AF1SearchResult,
                    stage) -> list[dict]:
    """The authors' five formats at the selected setting (``--no-authors``: none)."""
    from patching.all_for_one import authors_templates

    if cfg.no_authors:
        return []
    with stage("authors' templates"):
        return [_format_row(model, template, cfg, config, search) for template in authors_templates(cfg.op)]


# ---------------------------------------------------------------------------- outputs


def write_report(out: Path, cfg: AF1ExperimentConfig, results: dict, runner: AF1Runner, search: AF1SearchResult,
                 heatmap, timer: StageTimer) -> None:
    """report.html: summary, grid heatmap, pruning trace, the authors' formats, wall times, settings."""
    import plotly.graph_objects as go

    per_template, fallback = results["per_template"], results["cama_fallback_fraction"]
    report = Report("All for One: wait, transfer, compute alone",
                    f"{cfg.model}, operation {cfg.op}; CAMA + ABP (Mamidanna et al. 2025)")
    report.add_text(
        f"Grid search on {', '.join(cfg.templates)}: {runner.n_eval} eval prompts that the full model answers "
        f"correctly (full-model accuracy {runner.base_accuracy:.1%}); CAMA means "
        f"{'cross-fitted over folds of all operand pairs' if cfg.means == 'cross-fit' else 'from a disjoint fit split'}"
        f" (fallback fraction {fallback:.1%}). {LAYER_CONVENTION} "
        f"Answers are one token (sums up to 9), so the first-token metric scores the whole answer; a model "
        f"that always gave the most common answer would reach {runner.constant_baseline:.1%}. "
        f"Selected L_wait={search.l_wait}, L_transfer={search.l_transfer} with faithfulness "
        f"{search.faithfulness:.1%} (threshold {cfg.min_faithfulness:.0%}"
        f"{'' if search.meets_threshold else ', not reached: most faithful cell shown'}). "
        f"Pruning kept {len(search.kept_heads)} of {search.n_transfer_heads} transfer heads "
        f"({', '.join(map(str, search.kept_heads)) or 'none'}) at faithfulness {search.pruned_faithfulness:.1%}.",
        heading="Summary")
    report.add_figure(heatmap, heading="Grid", caption="Faithfulness of the AF1 model for each (L_wait, L_transfer); "
                      "x marks the selected setting.")
    report.add_table(search.prune_trace, heading="Pruning trace")
    if per_template:
        by_wait = go.Figure([go.Scatter(x=list(range(len(r["faithfulness_by_l_wait"]))), y=r["faithfulness_by_l_wait"],
                                        mode="lines+markers", name=r["template"]) for r in per_template if r["n_eval"]])
        by_wait.update_layout(title=f"Faithfulness against L_wait at L_transfer={search.l_transfer}, per template",
                              xaxis_title="L_wait", yaxis_title="faithfulness", yaxis_range=[0, 1.05])
        report.add_table([{k: v for k, v in r.items() if k != "faithfulness_by_l_wait"} for r in per_template],
                         heading="The authors' formats at the selected setting")
        report.add_figure(by_wait, caption="Where AF1 holds and where it breaks, per prompt format.")
    report.add_table(dict(timer.seconds) | {"wall": results["wall_seconds"]}, heading="Wall time (s)")
    report.add_settings(dataclasses.asdict(cfg))
    report.save(out / "report.html")


def run(cfg: AF1ExperimentConfig, *, loader: ModelLoader | None = None) -> dict:
    """Run the AF1 experiment; return the results dict that is also written to results.json."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    return run_experiment("af1", cfg, _stages, loader=loader, plan=plan(cfg),
                          results={"model": cfg.model, "op": cfg.op, "settings": dataclasses.asdict(cfg)})


def plan(cfg: AF1ExperimentConfig) -> list[str]:
    """The stages a run with these settings goes through, in order (their names as in results.json ``seconds``):
    the isolation variants with ``--isolate``, the search otherwise."""
    data = "data, CAMA means and cached residuals"
    if cfg.isolate:
        return ["load model", data, *[f"isolation: {name}" for name in ISOLATION_VARIANTS]]
    return ["load model", data, "grid", "selection and pruning", *([] if cfg.no_authors else ["authors' templates"])]


@cli.no_grad
def _stages(run: Run) -> None:
    from circuits.stats import proportion
    from patching.all_for_one.search import faithfulness_heatmap
    from patching.all_for_one import authors_templates

    cfg, results = run.cfg, run.results
    config = cfg.af1_config()
    authors = {t.id: t for t in authors_templates(cfg.op)}
    templates = [authors[t] if t in authors else template_by_id(t) for t in cfg.templates]
    model = run.load_model()
    if cfg.isolate:  # the isolation variants instead of the search; results.json only
        results |= {"search_templates": list(cfg.templates), "layer_convention": LAYER_CONVENTION,
                    "isolation": isolate(model, cfg, config, templates, run.stage)}
        return

    runner, search_counts, hits, search = grid_search(model, cfg, config, templates, run.stage)
    held = held_out(runner, hits, cfg)
    paper = paper_cells(hits, model.cfg.n_layers)
    heatmap = faithfulness_heatmap(search.grid, f"AF1 faithfulness, {cfg.model}, {', '.join(cfg.templates)}",
                                   best=(search.l_wait, search.l_transfer))
    write_text_atomic(run.out / "heatmap.html", heatmap.to_html(include_plotlyjs=True, full_html=True))
    per_template = authors_formats(model, cfg, config, search, run.stage)

    counts = runner.cama_counts()
    results |= {
        "search_templates": list(cfg.templates),
        "config": config, "n_layers": model.cfg.n_layers, "n_heads": model.cfg.n_heads,
        "means": cfg.means, "n_folds": cfg.n_folds if cfg.means == "cross-fit" else None,
        "search": search.to_json(), "search_counts": search_counts, "cama_counts": counts,
        "cama_fallback_fraction": counts["fallback_fraction"],
        "in_sample_faithfulness": proportion(hits[(search.l_wait, search.l_transfer)].double()).to_dict(),
        "held_out_selection": held, "paper_cells": paper, "paper": PAPER_CELL,
        "layer_convention": LAYER_CONVENTION, "per_template": per_template, "wall_seconds": run.wall_seconds,
    }
    run.save()
    write_report(run.out, cfg, results, runner, search, heatmap, run.timer)
    print(f"wrote {run.out}/results.json, heatmap.html, report.html in {results['wall_seconds']:.0f} s")


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Parse ``argv`` (default: ``sys.argv``) and run."""
    return run(cli.parse_config(parser, AF1ExperimentConfig, argv), loader=loader)


if __name__ == "__main__":
    cli.run_cli(main, "af1")
