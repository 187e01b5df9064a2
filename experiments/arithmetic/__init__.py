"""The identify -> validate -> analyze pipeline for one operation, shared by
``experiments.addition``, ``.subtraction``, ``.multiplication`` and ``.division``. Its settings are
:class:`experiments.arithmetic.config.PipelineConfig` (one flag per field); :func:`run` reads as the list
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
import sys

# only light imports here: the parser answers --help and flag errors before torch or TransformerLens load
from circuits.templates import resolve_operation
from experiments.arithmetic.config import MIN_READABLE, QUICK, PipelineConfig  # noqa: F401  (MIN_READABLE: the tests' threshold)
from experiments.runtime import ModelLoader, Run, cli, run_experiment

logger = logging.getLogger("experiments")


def build_parser(op: str) -> argparse.ArgumentParser:
    """The parser of ``python -m experiments.<operation>``: one flag per :class:`PipelineConfig` field but ``op``."""
    name = resolve_operation(op).name
    return cli.config_parser(PipelineConfig, name, f"Identify, validate and analyze the {name} circuit of a model.\n\n"
                             + __doc__.split("\n\n", 1)[1])


def parse_config(op: str, argv: list[str] | None = None) -> PipelineConfig:
    """CLI flags for every field of :class:`PipelineConfig` (``--help`` lists the defaults).

    ``--quick`` swaps in the defaults of :data:`experiments.arithmetic.config.QUICK`; flags given beside it win.
    """
    parser = build_parser(op)
    if "--quick" in (sys.argv[1:] if argv is None else argv):
        parser.set_defaults(**QUICK)
    return cli.parse_config(parser, PipelineConfig, argv, op=op)


def run(cfg: PipelineConfig, *, loader: ModelLoader | None = None) -> dict:
    """Run the pipeline; return the results dict that is also written to results.json."""
    name = resolve_operation(cfg.op).name
    return run_experiment(name, cfg, _stages, loader=loader, plan=plan(cfg),
                          results={"experiment": name, "settings": dataclasses.asdict(cfg)})


def _stages(run: Run) -> None:
    import torch

    with torch.no_grad():
        _run_stages(run)


def _run_stages(run: Run) -> None:
    from experiments.arithmetic import stages
    from experiments.arithmetic.report import summary, write_run_report

    cfg = run.cfg
    model = run.load_model()
    stages.check_settings_against_model(cfg, model)                   # 0. flags only the model can check
    run.state = stages.PipelineState(model)

    prompts = stages.prepare_prompts(run)                             # 1. data
    chosen = stages.identify_key_heads(run, prompts)                  # 2. identify
    curve = stages.knock_out(run, prompts, chosen)                    # 3. validate
    formats = stages.knock_out_on_transfer_formats(run, chosen, curve)
    roles = stages.read_attention(run, prompts, chosen, formats)      # 4. analyze
    probes = stages.probe_mlps_and_lens(run, prompts)
    stages.draw_node_circuit(run, chosen, roles)
    if cfg.circuit_prompts > 0:                                       # 4b. edge circuit
        stages.find_edge_circuit(run, prompts, chosen, roles)
    if cfg.af1_stride > 0:                                            # 5. AF1
        stages.af1_grid(run)
    if cfg.finetune:                                                  # 6. precise SFT
        stages.tune_key_heads(run, chosen.heads)

    stages.write_figures(run)                                         # 7. outputs
    run.results["wall_seconds"] = run.wall_seconds
    with run.stage("report"):  # a failure here is recorded as failed: report: <why>, the stages' results kept
        write_run_report(run, prompts, roles, probes)
    print(summary(run.results))
    print(f"stage times:\n{run.timer.table()}", file=sys.stderr)
    print(f"report: {run.out / 'report.html'}")


def plan(cfg: PipelineConfig) -> list[str]:
    """The stages a run with these settings goes through, in order (their names as in results.json ``seconds``)."""
    return ["load model", "data", "path patching", "knockout", "knockout on transfer formats", "attention reads",
            "MLP probes and logit lens", *(circuit_stages(cfg) if cfg.circuit_prompts else []),
            *(["AF1 grid"] if cfg.af1_stride else []), *(["precise SFT"] if cfg.finetune else []),
            *(["static figures"] if cfg.figures else []), "report"]


def circuit_stages(cfg: PipelineConfig) -> list[str]:
    """The edge circuit's stages, named as :func:`patching.edges.faithful_circuit.find_faithful_circuit` and
    :func:`experiments.runtime.edge_circuit.edge_circuit_stage` time them."""
    stability = cfg.circuit_stability_sets
    return [f"edge scores ({cfg.circuit_method})", "faithfulness curves",
            *([f"stability ({cfg.circuit_method} on {stability} sets)"] if stability >= 2 else [])]


def main(op: str, argv: list[str] | None = None, *, loader: ModelLoader | None = None) -> dict:
    """Parse ``argv`` (default: ``sys.argv``), run, return the results; errors propagate (see :func:`cli_main`)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    return run(parse_config(op, argv), loader=loader)


def cli_main(op: str) -> None:
    """``python -m experiments.<operation>``: bad input is one line on stderr and exit status 2 (``--debug``: traceback)."""
    cli.run_cli(lambda argv: main(op, argv), resolve_operation(op).name)
