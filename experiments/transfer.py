"""Do the key heads transfer across operations? (Zhang et al. 2024, §5.1)

    python -m experiments.transfer [--ops + - * /] [--top-k 8] [--out runs/transfer-<timestamp>]

1. for each operation: few-shot prompts, keep the correctly answered ones, path patching,
   the top-k key heads (patching.node_level.head_ranking.rank_key_heads, combine="per-op");
2. the overlap of the key-head sets (shared heads and Jaccard index) per pair of operations;
3. cross knockout: accuracy on operation Y with operation X's key heads mean-ablated,
   against k random heads, so a shared mechanism shows as a drop off the diagonal too;
4. results.json, figures/*.json and report.html in ``--out``.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from circuits.show.html_report import Report
from experiments.runtime.run_folder import StageTimer
from circuits.atomic_files import write_text_atomic
from circuits.templates import resolve_operation

from experiments.runtime import ModelLoader, Run, RunSettings, cli, option, run_experiment
from experiments.runtime.cli import override
from experiments.runtime.settings import BatchSettings, PromptSettings

if TYPE_CHECKING:  # the library loads torch: imported where used, so --help answers before it loads
    import plotly.graph_objects as go

    from patching.node_level.head_ranking import KeyHeads


@dataclass(frozen=True)
class TransferConfig(BatchSettings, PromptSettings, RunSettings):
    """Every flag of ``python -m experiments.transfer``, with its default (model, device, dtype, threads, seed,
    out and overwrite: :class:`experiments.runtime.RunSettings`; the seed draws the data and the random heads)."""

    ops: tuple[str, ...] = option(("+", "-", "*", "/"), "operations to compare")
    n_prompts: int = override(PromptSettings, "n_prompts", 96, "prompts per operation before filtering")
    knockout_prompts: int = option(48, "prompts per operation for the cross knockout", type=cli.positive_int)
    top_k: int = option(8, "key heads per operation", type=cli.positive_int)
    random_seeds: int = option(2, "random head sets per operation (baseline)", type=cli.positive_int)


parser = cli.config_parser(TransferConfig, "transfer", __doc__)


def jaccard(a: set, b: set) -> float:
    """|a & b| / |a | b| (1.0 for two empty sets)."""
    return len(a & b) / len(a | b) if a | b else 1.0


def identify(model, cfg: TransferConfig, ops: list[str], stage) -> tuple[KeyHeads, dict, dict]:
    """Per operation: correctly answered prompts, their path-patching key heads, a knockout sample, base accuracy
    (timed as the run's stage ``identify``; ``stage``: its ``Run.stage``)."""
    from patching import SweepOptions
    from circuits.tasks import filter_correct, make_dataset
    from patching.node_level.head_ranking import rank_key_heads

    kept, base = {}, {}
    with stage("identify"):
        for op in ops:
            dataset = make_dataset(model, cfg.task_config(op=op))
            kept[op], base[op] = filter_correct(model, dataset, cfg.batch_size)
        chosen = rank_key_heads(model, kept, top_k=cfg.top_k, combine="per-op",
                                options=SweepOptions(batch_size=cfg.batch_size))
    samples = {op: data.shuffle(seed=cfg.seed).select(range(min(cfg.knockout_prompts, len(data))))
               for op, data in kept.items()}
    for op in ops:
        print(f"{_name(op)}: base accuracy {base[op]:.1%}, key heads {', '.join(map(str, chosen.by_op[op]))}")
    return chosen, samples, base


def overlaps(by_op: dict) -> list[dict]:
    """Shared heads and Jaccard index of every pair of operations' key-head sets."""
    ops = list(by_op)
    return [{"pair": f"{_name(x)} / {_name(y)}", "shared": sorted(str(h) for h in set(by_op[x]) & set(by_op[y])),
             "n_shared": len(set(by_op[x]) & set(by_op[y])), "jaccard": round(jaccard(set(by_op[x]), set(by_op[y])), 3)}
            for i, x in enumerate(ops) for y in ops[i + 1:]]


def cross_knockout(model, cfg: TransferConfig, by_op: dict, samples: dict) -> dict:
    """``cross[y][x]``: accuracy on ``y`` with ``x``'s key heads ablated; also the base and random-head rows."""
    from circuits.nodes import all_heads
    from patching import SweepOptions, knockout

    rng = random.Random(cfg.seed)
    random_sets = [rng.sample(all_heads(model), cfg.top_k) for _ in range(cfg.random_seeds)]
    cross, options = {}, SweepOptions(batch_size=cfg.batch_size)
    for y, data in samples.items():
        cross[y] = {"base": knockout(model, data, [], options=options)}
        for x, heads in by_op.items():
            cross[y][x] = knockout(model, data, heads, options=options)
        cross[y]["random"] = sum(knockout(model, data, r, options=options) for r in random_sets) / len(random_sets)
    return cross


def cross_figure(cross: dict, ops: list[str], top_k: int) -> go.Figure:
    """Heatmap: rows = whose key heads are ablated, columns = evaluated operation."""
    import plotly.graph_objects as go

    matrix = go.Figure(go.Heatmap(
        z=[[cross[y][x] for y in ops] for x in ops], x=[_name(y) for y in ops], y=[_name(x) for x in ops],
        text=[[f"{cross[y][x]:.0%}" for y in ops] for x in ops], texttemplate="%{text}", colorscale="RdBu", zmin=0, zmax=1))
    matrix.update_layout(title=f"Accuracy with the top-{top_k} heads of one operation (rows) knocked out, per operation (columns)",
                         xaxis_title="evaluated on", yaxis_title="key heads of")
    return matrix


def write_report(out, cfg: TransferConfig, results: dict, matrix: go.Figure, timer: StageTimer) -> None:
    """report.html: key heads per operation, their overlap, the cross-knockout matrix, wall times, settings."""
    ops, cross = list(results["key_heads"]), results["cross_knockout"]
    report = Report(f"Key heads across operations: {cfg.model}")
    report.add_table([{"operation": o, "base accuracy": f"{results['base_accuracy'][o]:.1%}",
                       "key heads": ", ".join(results["key_heads"][o])} for o in ops], heading="Key heads per operation")
    report.add_table([{**row, "shared": ", ".join(row["shared"])} for row in results["overlap"]], heading="Overlap")
    report.add_figure(matrix, heading="Cross knockout",
                      caption=f"Random baseline (top-{cfg.top_k} random heads, {cfg.random_seeds} seeds): "
                              + ", ".join(f"{o} {cross[o]['random']:.0%}" for o in ops))
    report.add_table(timer.seconds, heading="Wall time per stage (s)")
    report.add_settings(dataclasses.asdict(cfg))
    report.save(out / "report.html")


def run(cfg: TransferConfig, *, loader: ModelLoader | None = None) -> dict:
    """Run the comparison; return the results dict that is also written to results.json."""
    return run_experiment("transfer", cfg, _stages, loader=loader, plan=plan(cfg),
                          results={"settings": dataclasses.asdict(cfg)})


def plan(cfg: TransferConfig) -> list[str]:
    """The stages every run goes through, in order (their names as in results.json ``seconds``)."""
    return ["load model", "identify", "cross knockout"]


@cli.no_grad
def _stages(run: Run) -> None:
    cfg, out, timer = run.cfg, run.out, run.timer
    ops = [resolve_operation(op).symbol for op in cfg.ops]
    model = run.load_model()
    chosen, samples, base = identify(model, cfg, ops, run.stage)
    with run.stage("cross knockout"):
        cross = cross_knockout(model, cfg, chosen.by_op, samples)
    matrix = cross_figure(cross, ops, cfg.top_k)
    write_text_atomic(out / "figures" / "cross_knockout.json", matrix.to_json())
    run.results |= {
        "model": cfg.model, "settings": dataclasses.asdict(cfg), "base_accuracy": {_name(o): base[o] for o in ops},
        "key_heads": {_name(o): [str(h) for h in chosen.by_op[o]] for o in ops}, "key_heads_rule": chosen.rule,
        "overlap": overlaps(chosen.by_op),
        "cross_knockout": {_name(y): {"base": row["base"], "random": row["random"], **{_name(x): row[x] for x in ops}}
                           for y, row in cross.items()},
        "seconds": timer.seconds, "wall_seconds": run.wall_seconds,
    }
    run.save()
    write_report(out, cfg, run.results, matrix, timer)
    print(f"report: {out / 'report.html'}")


def _name(op: str) -> str:
    return resolve_operation(op).name


def main(argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Parse ``argv`` (default: ``sys.argv``) and run."""
    return run(cli.parse_config(parser, TransferConfig, argv), loader=loader)


if __name__ == "__main__":
    cli.run_cli(main, "transfer")
