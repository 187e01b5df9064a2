"""All for One: where does a model wait, transfer and compute alone? (Mamidanna et al. 2025)

    python -m experiments.af1 [--model gemma-3-270m] [--op +] [--templates af1-equation ...]
                              [--n-prompts 100] [--out runs/af1-<timestamp>] [--overwrite]

1. prompts: ``--n-prompts`` zero-shot prompts per search template (one-digit operands),
   (``--n-shots`` solved examples first, if asked), split into a CAMA fit half and a disjoint eval half; the eval half keeps the
   prompts the full model answers correctly;
2. grid: AF1 faithfulness for every (L_wait, L_transfer) (``patching.af1``);
3. selection: the largest L_wait reaching ``--min-faithfulness`` with the fewest
   transfer layers; greedy pruning of its transfer heads at ``--prune-keep``;
4. the authors' five formats (equation "A+B=", verbal, question, word problem,
   Python): faithfulness of the selected setting (all heads and pruned heads) per
   template, and faithfulness against L_wait at the selected L_transfer;
5. outputs in ``--out``: results.json, heatmap.html, report.html.

Template ids: ``af1-equation``, ``af1-verbal``, ``af1-question``, ``af1-word``,
``af1-python`` (``patching.af1_data.authors_templates``) or any id of ``circuits.templates``.
"""

from __future__ import annotations

import logging
import time

import torch

from circuits.loading import load_model
from circuits.report import Report
from circuits.runs import StageTimer, complete_run, default_run_dir, prepare_run_dir, save_results, write_text_atomic
from circuits.templates import template_by_id
from patching.af1 import AF1Config, AF1Runner, NoEvalPromptsError, faithfulness_heatmap, held_out_selection, search_af1
from patching.af1_data import authors_templates, make_template_dataset
from patching.cama import CamaConfig

from experiments import _cli as cli

# ---------------------------------------------------------------------------- configuration (CLI flags)

parser = cli.make_parser("af1", __doc__)
parser.add_argument("--model", default="gemma-3-270m", help="offline model name, TransformerLens model name, or a saved model directory")
parser.add_argument("--op", default="+", help="operation: +, -, * or / (or its name)")
parser.add_argument("--templates", nargs="+", default=["af1-equation", "af1-verbal", "af1-question"],
                    help="templates of the grid search")
parser.add_argument("--n-prompts", type=cli.positive_int, metavar="N", default=55, help="prompts per template (at most all operand pairs "
                    "with a one-token answer: 55 for + on 0..9)")
parser.add_argument("--operand-max", type=cli.nonnegative_int, metavar="N", default=9, help="operands are drawn from 0..operand-max")
parser.add_argument("--n-shots", type=cli.nonnegative_int, metavar="N", default=0, help="solved examples of the same template before each "
                    "prompt (the paper is zero-shot; gemma-3-270m answers few one-token sums zero-shot)")
parser.add_argument("--min-count", type=cli.positive_int, metavar="N", default=2, help="CAMA: prompts needed for a token-conditioned mean")
parser.add_argument("--min-faithfulness", type=cli.fraction, default=0.9,
                    help="faithfulness an (L_wait, L_transfer) setting must reach to be selected")
parser.add_argument("--prune-keep", type=cli.fraction, default=0.95,
                    help="pruning keeps removing transfer heads while faithfulness stays above this share of the unpruned one")
parser.add_argument("--no-authors", action="store_true", help="skip the authors' five formats")
parser.add_argument("--batch-size", type=cli.positive_int, default=32, metavar="N", help="prompts per forward pass")
parser.add_argument("--seed", type=int, default=0, help="seed of the prompts and of the fit/eval split")
cli.add_device_flags(parser)
parser.add_argument("--threads", type=cli.nonnegative_int, metavar="N", default=1, help="torch CPU threads (0: torch's default). One thread "
                    "is ~8x faster on shared, oversubscribed CPUs, where OpenMP threads spin-wait on each other")
parser.add_argument("--out", default=None, help="output folder (default: runs/af1-<timestamp>)")
parser.add_argument("--overwrite", action="store_true", help="write into an existing output folder")


def main(argv: list[str] | None = None) -> dict:
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    start = time.perf_counter()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    out = prepare_run_dir(args.out or default_run_dir("af1"), overwrite=args.overwrite)
    timer = StageTimer(run_dir=out, results={"model": args.model, "op": args.op, "settings": vars(args)})
    config = AF1Config(cama=CamaConfig(min_count=args.min_count), batch_size=args.batch_size,
                       min_faithfulness=args.min_faithfulness, prune_keep=args.prune_keep, seed=args.seed)
    authors = {t.id: t for t in authors_templates(args.op)}
    search_templates = [authors[t] if t in authors else template_by_id(t) for t in args.templates]
    operand_range = (0, args.operand_max)

    with timer.stage("load model"):
        model = load_model(args.model, device=args.device, dtype=args.dtype)
    n_layers = model.cfg.n_layers

    # ------------------------------------------------------------------------ grid search and pruning
    with timer.stage("data"):
        data = make_template_dataset(model, search_templates, args.n_prompts, operand_range=operand_range,
                                     n_shots=args.n_shots, seed=args.seed)
    with timer.stage("fit CAMA means and cache residuals"):
        runner = AF1Runner.from_dataset(model, data, config)
    print(f"search data: {len(data)} prompts, eval {runner.n_eval_total}, full-model accuracy "
          f"{runner.base_accuracy:.1%}, {runner.n_eval} correct prompts kept; always answering the most "
          f"common answer would score {runner.constant_baseline:.1%}")
    with timer.stage("grid search and pruning"):
        search = search_af1(model, data, config, runner=runner)
    print(f"selected L_wait={search.l_wait} L_transfer={search.l_transfer}: faithfulness {search.faithfulness:.1%}"
          f"{'' if search.meets_threshold else ' (below the threshold: best cell)'}; "
          f"{len(search.kept_heads)}/{search.n_transfer_heads} transfer heads kept "
          f"({search.pruned_faithfulness:.1%}): {[str(h) for h in search.kept_heads]}")
    with timer.stage("held-out selection"):
        # the winner's curse: choose the cell on half of the eval prompts, report it on the other half
        held_out = held_out_selection(runner, min_faithfulness=config.min_faithfulness, seed=args.seed, progress=False) \
            if runner.n_eval >= 2 else {"skipped": f"{runner.n_eval} evaluation prompt(s): nothing to hold out"}
    if "l_wait" in held_out:
        print(f"held out: cell ({held_out['l_wait']}, {held_out['l_transfer']}) chosen on "
              f"{len(held_out['selection_prompts'])} prompts scores {held_out['held_out_faithfulness']['value']:.1%} "
              f"on the other {len(held_out['report_prompts'])}")
    heatmap = faithfulness_heatmap(search.grid, f"AF1 faithfulness, {args.model}, {', '.join(args.templates)}",
                                   best=(search.l_wait, search.l_transfer))
    write_text_atomic(out / "heatmap.html", heatmap.to_html(include_plotlyjs=True, full_html=True))

    # ------------------------------------------------------------------------ the authors' formats
    per_template = []
    if not args.no_authors:
        with timer.stage("authors' templates"):
            for template in authors.values():
                t_data = make_template_dataset(model, [template], args.n_prompts, operand_range=operand_range,
                                               n_shots=args.n_shots, seed=args.seed)
                try:
                    t_runner = AF1Runner.from_dataset(model, t_data, config)
                except NoEvalPromptsError as err:  # e.g. a format the model never answers: report it, go on
                    per_template.append({"template": template.id, "text": template.text, "n_eval": 0,
                                         "skipped": str(err)})
                    print(f"{template.id:14s} skipped: {err}")
                    continue
                along_wait = [t_runner.faithfulness(w, search.l_transfer) for w in range(n_layers - search.l_transfer + 1)]
                row = {
                    "template": template.id, "text": template.text, "n_eval": t_runner.n_eval,
                    "base_accuracy": t_runner.base_accuracy, "constant_baseline": t_runner.constant_baseline,
                    "faithfulness": along_wait[search.l_wait],
                    "faithfulness_pruned": t_runner.faithfulness(search.l_wait, search.l_transfer, search.kept_heads),
                    "faithfulness_by_l_wait": along_wait,
                }
                per_template.append(row)
                print(f"{template.id:14s} full acc {row['base_accuracy']:.0%}  n={row['n_eval']:3d}  "
                      f"AF1 {row['faithfulness']:.0%}  pruned {row['faithfulness_pruned']:.0%}")

    # ------------------------------------------------------------------------ outputs
    import plotly.graph_objects as go

    by_wait = go.Figure([go.Scatter(x=list(range(len(r["faithfulness_by_l_wait"]))), y=r["faithfulness_by_l_wait"],
                                    mode="lines+markers", name=r["template"]) for r in per_template if r["n_eval"]])
    by_wait.update_layout(title=f"Faithfulness against L_wait at L_transfer={search.l_transfer}, per template",
                          xaxis_title="L_wait", yaxis_title="faithfulness", yaxis_range=[0, 1.05])
    wall = time.perf_counter() - start
    results = {
        "model": args.model, "op": args.op, "search_templates": args.templates, "settings": vars(args),
        "config": config, "n_layers": n_layers, "n_heads": model.cfg.n_heads,
        "search": search.to_json(), "cama_counts_at_selected_l_wait": runner.cama_counts(search.l_wait),
        "held_out_selection": held_out,
        "layer_convention": "CAMA replaces hook_resid_pre of layer L_wait (the authors' demo: hook_resid_post of "
                            "L_wait - 1, the same tensor); the paper's Llama-3-8B cell is (14, 2)",
        "per_template": per_template,
        "seconds": timer.seconds, "wall_seconds": round(wall, 1),
    }
    save_results(out, results)

    report = Report("All for One: wait, transfer, compute alone",
                    f"{args.model}, operation {args.op}; CAMA + ABP (Mamidanna et al. 2025)")
    report.add_text(
        f"Grid search on {', '.join(args.templates)}: {runner.n_eval} eval prompts that the full model answers "
        f"correctly (full-model accuracy {runner.base_accuracy:.1%}); CAMA means from a disjoint fit split. "
        f"Answers are one token (sums up to 9), so the first-token metric scores the whole answer; a model "
        f"that always gave the most common answer would reach {runner.constant_baseline:.1%}. "
        f"Selected L_wait={search.l_wait}, L_transfer={search.l_transfer} with faithfulness "
        f"{search.faithfulness:.1%} (threshold {args.min_faithfulness:.0%}"
        f"{'' if search.meets_threshold else ', not reached: most faithful cell shown'}). "
        f"Pruning kept {len(search.kept_heads)} of {search.n_transfer_heads} transfer heads "
        f"({', '.join(map(str, search.kept_heads)) or 'none'}) at faithfulness {search.pruned_faithfulness:.1%}.",
        heading="Summary")
    report.add_figure(heatmap, heading="Grid", caption="Faithfulness of the AF1 model for each (L_wait, L_transfer); "
                      "x marks the selected setting.")
    report.add_table(search.prune_trace, heading="Pruning trace")
    if per_template:
        report.add_table([{k: v for k, v in r.items() if k != "faithfulness_by_l_wait"} for r in per_template],
                         heading="The authors' formats at the selected setting")
        report.add_figure(by_wait, caption="Where AF1 holds and where it breaks, per prompt format.")
    report.add_table({k: v for k, v in timer.seconds.items()} | {"wall": round(wall, 1)}, heading="Wall time (s)")
    report.add_settings(vars(args))
    report.save(out / "report.html")
    complete_run(out, results)
    print(f"wrote {out}/results.json, heatmap.html, report.html in {wall:.0f} s")
    return results


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    cli.run_cli(main, "af1")
