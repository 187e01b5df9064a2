"""Do the key heads transfer across operations? (Zhang et al. 2024, §5.1)

    python -m experiments.transfer [--ops + - * /] [--top-k 8] [--out runs/transfer-<timestamp>]

1. for each operation: few-shot prompts, keep the correctly answered ones, path patching,
   the top-k key heads;
2. the overlap of the key-head sets (shared heads and Jaccard index) per pair of operations;
3. cross knockout: accuracy on operation Y with operation X's key heads mean-ablated,
   against k random heads, so a shared mechanism shows as a drop off the diagonal too;
4. results.json, figures/*.json and report.html in ``--out``.
"""

from __future__ import annotations

import argparse
import random
import time

import plotly.graph_objects as go
import torch

from circuits.loading import load_model
from circuits.nodes import all_heads
from circuits.report import Report
from circuits.runs import StageTimer, complete_run, default_run_dir, prepare_run_dir, save_results, write_text_atomic
from circuits.tasks import TaskConfig, filter_correct, make_dataset
from circuits.templates import resolve_operation
from patching.knockout import knockout
from patching.path_patching import path_patch
from patching.results import key_heads

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--model", default="gemma-3-270m", help="model name or saved model directory")
parser.add_argument("--device", default="auto", help="'auto', 'cpu' or 'cuda'")
parser.add_argument("--ops", nargs="+", default=["+", "-", "*", "/"], help="operations to compare")
parser.add_argument("--n-prompts", type=int, default=96, help="prompts per operation before filtering")
parser.add_argument("--knockout-prompts", type=int, default=48, help="prompts per operation for the cross knockout")
parser.add_argument("--top-k", type=int, default=8, help="key heads per operation")
parser.add_argument("--random-seeds", type=int, default=2, help="random head sets per operation (baseline)")
parser.add_argument("--seed", type=int, default=0, help="data and random-head seed")
parser.add_argument("--batch-size", type=int, default=32, help="prompts per forward pass")
parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
parser.add_argument("--out", default=None, help="output folder (default: runs/transfer-<timestamp>)")
parser.add_argument("--overwrite", action="store_true", help="write into an existing output folder")


def jaccard(a: set, b: set) -> float:
    """|a & b| / |a | b| (1.0 for two empty sets)."""
    return len(a & b) / len(a | b) if a | b else 1.0


@torch.no_grad()


def main(argv: list[str] | None = None) -> dict:
    """Run the comparison; return the results dict that is also written to results.json."""
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    out = prepare_run_dir(args.out or default_run_dir("transfer"), overwrite=args.overwrite)
    timer = StageTimer(run_dir=out, results={"settings": vars(args)})
    ops = [resolve_operation(op).symbol for op in args.ops]
    names = {op: resolve_operation(op).name for op in ops}

    with timer.stage("load model"):
        model = load_model(args.model, device=None if args.device == "auto" else args.device)

    # 1. key heads per operation
    data, heads, base = {}, {}, {}
    for op in ops:
        with timer.stage(f"identify {names[op]}"):
            dataset = make_dataset(model, TaskConfig(op=op, n_prompts=args.n_prompts, seed=args.seed))
            kept, base[op] = filter_correct(model, dataset, args.batch_size)
            scores = path_patch(model, kept, batch_size=args.batch_size)
            heads[op], _ = key_heads(scores, top_k=args.top_k)
            data[op] = kept.shuffle(seed=args.seed).select(range(min(args.knockout_prompts, len(kept))))
        print(f"{names[op]}: base accuracy {base[op]:.1%}, key heads {', '.join(map(str, heads[op]))}")

    # 2. overlap of the key-head sets
    overlap = [{"pair": f"{names[x]} / {names[y]}", "shared": sorted(str(h) for h in set(heads[x]) & set(heads[y])),
                "n_shared": len(set(heads[x]) & set(heads[y])), "jaccard": round(jaccard(set(heads[x]), set(heads[y])), 3)}
               for i, x in enumerate(ops) for y in ops[i + 1:]]

    # 3. cross knockout: rows = whose key heads are ablated, columns = evaluated operation
    rng = random.Random(args.seed)
    random_sets = [rng.sample(all_heads(model), args.top_k) for _ in range(args.random_seeds)]
    cross = {}
    with timer.stage("cross knockout"):
        for y in ops:
            cross[y] = {"base": knockout(model, data[y], [], batch_size=args.batch_size)}
            for x in ops:
                cross[y][x] = knockout(model, data[y], heads[x], batch_size=args.batch_size)
            cross[y]["random"] = sum(knockout(model, data[y], r, batch_size=args.batch_size) for r in random_sets) / len(random_sets)

    matrix = go.Figure(go.Heatmap(
        z=[[cross[y][x] for y in ops] for x in ops], x=[names[y] for y in ops], y=[names[x] for x in ops],
        text=[[f"{cross[y][x]:.0%}" for y in ops] for x in ops], texttemplate="%{text}", colorscale="RdBu", zmin=0, zmax=1))
    matrix.update_layout(title=f"Accuracy with the top-{args.top_k} heads of one operation (rows) knocked out, per operation (columns)",
                         xaxis_title="evaluated on", yaxis_title="key heads of")
    write_text_atomic(out / "figures" / "cross_knockout.json", matrix.to_json())

    results = {
        "model": args.model, "settings": vars(args), "base_accuracy": {names[o]: base[o] for o in ops},
        "key_heads": {names[o]: [str(h) for h in heads[o]] for o in ops}, "overlap": overlap,
        "cross_knockout": {names[y]: {"base": row["base"], "random": row["random"], **{names[x]: row[x] for x in ops}}
                           for y, row in cross.items()},
        "seconds": timer.seconds, "wall_seconds": round(time.perf_counter() - start, 1),
    }
    save_results(out, results)
    report = Report(f"Key heads across operations: {args.model}")
    report.add_table([{"operation": names[o], "base accuracy": f"{base[o]:.1%}", "key heads": ", ".join(map(str, heads[o]))}
                      for o in ops], heading="Key heads per operation")
    report.add_table([{**row, "shared": ", ".join(row["shared"])} for row in overlap], heading="Overlap")
    report.add_figure(matrix, heading="Cross knockout",
                      caption=f"Random baseline (top-{args.top_k} random heads, {args.random_seeds} seeds): "
                              + ", ".join(f"{names[y]} {cross[y]['random']:.0%}" for y in ops))
    report.add_table(timer.seconds, heading="Wall time per stage (s)")
    report.add_settings(vars(args))
    report.save(out / "report.html")
    complete_run(out, results)
    print(f"report: {out / 'report.html'}")
    return results


if __name__ == "__main__":
    main()
