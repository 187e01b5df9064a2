"""The identify -> validate -> analyze pipeline for one operation, shared by
``experiments.addition``, ``.subtraction``, ``.multiplication`` and ``.division``. This module holds
its settings (:class:`PipelineConfig`, one flag per field) and :func:`run`, which reads as the list
of stages; the stages are functions in ``experiments.arithmetic.stages``, the report is written by
``experiments.arithmetic.report.write_run_report``.

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
import dataclasses
import logging
import time
from dataclasses import dataclass

import torch

from circuits.errors import InputError
from circuits.loading import load_model
from experiments.runtime.run_folder import StageTimer, complete_run, default_run_dir, prepare_run_dir
from circuits.tasks import CORRUPTIONS
from circuits.templates import resolve_operation

from experiments.arithmetic import stages
from experiments.runtime import cli
from experiments.runtime.cli import option
from experiments.arithmetic.report import MIN_READABLE, summary, write_run_report  # noqa: F401  (MIN_READABLE: the tests' threshold)

logger = logging.getLogger("experiments")


@dataclass(frozen=True)
class PipelineConfig:
    """Every flag of the experiment, with its default (``op`` is fixed by the command: addition, ...)."""

    model: str = option("gemma-3-270m", "offline model name, TransformerLens model name, or a saved model directory")
    device: str = "auto"
    dtype: str | None = None
    op: str = "+"
    n_prompts: int = option(200, "prompts sampled before keeping the correctly answered ones", type=cli.positive_int)
    n_shots: int = option(3, "solved examples before each prompt", type=cli.nonnegative_int)
    seed: int = option(0, "seed of the data, the random-rank knockouts and training", type=int)
    top_k: int = option(8, "number of key heads (by path-patching effect)", type=cli.positive_int)
    knockout_prompts: int = option(64, "prompts for the knockout curves", type=cli.positive_int)
    knockout_ks: str = option("1,2,4,8", "comma-separated numbers of heads to knock out", type=cli.int_list)
    knockout_seeds: int = option(10, "random-rank repeats per k", type=cli.positive_int)
    knockout_pool: int = option(512, "prompts (none of them evaluated) the ablation means are averaged over, per format",
                                type=cli.positive_int)
    corrupt: str = option("query", "counterfactual twins of the key-head ranking: 'query' (the queried operator) or "
                                   "'all' (every operator, shots too); both are reported", choices=CORRUPTIONS)
    transfer_prompts: int = option(32, "prompts per transfer format", type=cli.positive_int)
    af1_stride: int = option(3, "L_wait step of the coarse AF1 grid on zero-shot one-token prompts (0: skip AF1)",
                             type=cli.nonnegative_int)
    af1_prompts: int = option(55, "prompts for the AF1 grid (55 = every one-digit sum below 10)", type=cli.positive_int)
    circuit_prompts: int = option(40, "correct prompts for the EAP-IG edge circuit, half to score and choose, half to "
                                      "report (0: skip)", type=cli.nonnegative_int)
    finetune: bool = option(False, "also tune the key heads with precise SFT and report accuracy before/after")
    finetune_steps: int = option(30, "optimizer steps of that precise SFT run", type=cli.positive_int)
    batch_size: int = option(32, "prompts per forward pass", type=cli.positive_int)
    threads: int = option(0, "torch CPU threads (0: torch's default)", type=cli.nonnegative_int)
    out: str | None = option(None, "output folder (default: runs/<operation>-<timestamp>)")
    overwrite: bool = option(False, "write into an existing output folder")
    figures: str = option("", "also write each figure as static files next to its JSON, sized for a two-column paper: a "
                              "comma-separated subset of svg,pdf,png; needs kaleido and Chrome/Chromium (default: none)",
                          type=cli.figure_formats)


def build_parser(op: str) -> argparse.ArgumentParser:
    """The parser of ``python -m experiments.<operation>``: one flag per :class:`PipelineConfig` field but ``op``."""
    name = resolve_operation(op).name
    return cli.config_parser(PipelineConfig, name, f"Identify, validate and analyze the {name} circuit of a model.\n\n"
                             + __doc__.split("\n\n", 1)[1])


def parse_config(op: str, argv: list[str] | None = None) -> PipelineConfig:
    """CLI flags for every field of :class:`PipelineConfig` (``--help`` lists the defaults)."""
    return cli.parse_config(build_parser(op), PipelineConfig, argv, op=op)


@torch.no_grad()
def run(cfg: PipelineConfig) -> dict:
    """Run the pipeline; return the results dict that is also written to results.json."""
    start = time.perf_counter()
    if cfg.corrupt not in CORRUPTIONS:
        raise InputError(f"--corrupt must be one of {CORRUPTIONS}, got {cfg.corrupt!r}.")
    cli.set_threads(cfg.threads)
    name = resolve_operation(cfg.op).name
    out = prepare_run_dir(cfg.out or default_run_dir(name), overwrite=cfg.overwrite)
    results: dict = {"experiment": name, "settings": dataclasses.asdict(cfg)}
    timer = StageTimer(run_dir=out, results=results)  # saves results.json (status running) stage by stage
    with timer.stage("load model"), cli.progress(f"loading {cfg.model} (a first run builds the model cache: ~1 min)"):
        model = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)
    pipeline = stages.PipelineRun(cfg, model, out, timer, results)

    prompts = stages.prepare_prompts(pipeline)                        # 1. data
    chosen = stages.identify_key_heads(pipeline, prompts)             # 2. identify
    curve = stages.knock_out(pipeline, prompts, chosen)               # 3. validate
    formats = stages.knock_out_on_transfer_formats(pipeline, chosen, curve)
    roles = stages.read_attention(pipeline, prompts, chosen, formats)  # 4. analyze
    probes = stages.probe_mlps_and_lens(pipeline, prompts)
    stages.draw_node_circuit(pipeline, chosen, roles)
    if cfg.circuit_prompts > 0:                                       # 4b. edge circuit
        stages.find_edge_circuit(pipeline, prompts, chosen, roles)
    if cfg.af1_stride > 0:                                            # 5. AF1
        stages.af1_grid(pipeline)
    if cfg.finetune:                                                  # 6. precise SFT
        stages.tune_key_heads(pipeline, chosen.heads)

    stages.write_figures(pipeline)                                    # 7. outputs
    results["seconds"] = timer.seconds
    results["wall_seconds"] = round(time.perf_counter() - start, 1)
    write_run_report(pipeline, prompts, roles, probes)
    complete_run(out, results)
    print(summary(results))
    print(f"report: {out / 'report.html'}")
    return results


def main(op: str, argv: list[str] | None = None) -> dict:
    """Parse ``argv`` (default: ``sys.argv``), run, return the results; errors propagate (see :func:`cli_main`)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    return run(parse_config(op, argv))


def cli_main(op: str) -> None:
    """``python -m experiments.<operation>``: bad input is one line on stderr and exit status 2 (``--debug``: traceback)."""
    cli.run_cli(lambda argv: main(op, argv), resolve_operation(op).name)
