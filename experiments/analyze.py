"""Analyze one operation end to end: model -> data -> (path patching) -> attention reads -> probes -> report.

    python -m experiments.analyze --op + --n-prompts 48 --out runs/analyze

Writes ``<out>/report.html`` (self-contained, opens offline) and ``<out>/results.json``:
``base_accuracy``, ``n_kept``, ``head_classes`` (every head read, with its mean
attention on operands / operator / BOS / other and its label), ``operand_heads``,
``operator_heads``, ``logit_lens`` (per layer: top-1 rate, median rank, mean
probability of the answer), ``first_top1_layer``, ``c_rise_range`` (layers over
which the MLP output's cosine with the answer climbs to its peak), ``probe_means``
(per stream, per layer, cosines with A, B, C, others) and, with ``--patching``,
``path_patching`` (the patching package's NodeScores).

Without ``--patching`` attention is read from all heads; with it, path patching
runs first and the ``--top-heads`` strongest heads are read and drawn as a circuit;
``--knockout`` adds the knockout curve (slow on CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from circuits.attention import (
    HeadClassConfig, attention_reads, attention_views, classify_heads, plot_role_distribution, plot_role_heatmap,
)
from circuits.circuit_figure import circuit_figure
from circuits.loading import load_model
from circuits.probes import ProbeConfig, plot_top_tokens, probe_mlps, top_number_tokens
from circuits.report import run_report
from circuits.tasks import TaskConfig, filter_correct, make_dataset, transfer_datasets


@dataclass(frozen=True)
class AnalyzeConfig:
    model: str = "gemma-3-270m"
    op: str = "+"
    n_prompts: int = 48
    styles: tuple[str, ...] = ("equation",)
    n_shots: int = 2
    seed: int = 0
    patching: bool = False
    knockout: bool = False  # the knockout curve is slow on CPU (many full forwards); opt in
    top_heads: int = 12
    top_mlps: int = 3
    operand_threshold: float = 0.3
    operator_threshold: float = 0.2
    n_views: int = 2
    case_problem: str = "4 + 3 = "
    batch_size: int = 16
    device: str | None = None
    out: str = "runs/analyze"


def parse_args() -> AnalyzeConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for f in dataclasses.fields(AnalyzeConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            parser.add_argument(flag, action="store_true", default=f.default)
        elif f.name == "styles":
            parser.add_argument(flag, nargs="+", default=list(f.default))
        else:
            kind = {"int": int, "float": float}.get(f.type, str)
            parser.add_argument(flag, type=kind, default=f.default)
    args = vars(parser.parse_args())
    args["styles"] = tuple(args["styles"])
    return AnalyzeConfig(**args)


def write_json(obj, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(cfg: AnalyzeConfig) -> dict:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"settings": dataclasses.asdict(cfg)}

    # 1. model and data: keep the prompts the model answers correctly
    model = load_model(cfg.model, device=cfg.device)
    task = TaskConfig(op=cfg.op, n_prompts=cfg.n_prompts, styles=cfg.styles, n_shots=cfg.n_shots, seed=cfg.seed)
    dataset = make_dataset(model, task)
    kept, base_accuracy = filter_correct(model, dataset, batch_size=cfg.batch_size)
    results |= {"base_accuracy": base_accuracy, "n_prompts": len(dataset), "n_kept": len(kept)}

    # 2. optional path patching (patching package): which heads to read and draw
    scores = knockout = None
    heads = None
    if cfg.patching:
        from patching.knockout import knockout_curve
        from patching.path_patching import path_patch

        scores = path_patch(model, kept, batch_size=cfg.batch_size)
        heads = [n for n, _ in scores.ranked("heads", by="neg")[: cfg.top_heads]]
        results["path_patching"] = scores.to_dict()
        if cfg.knockout:
            knockout = knockout_curve(model, kept, scores, ks=(1, 2, 4, 8), n_seeds=3, batch_size=cfg.batch_size)
            results["knockout"] = knockout.to_dict()

    # 3. attention reads and head classes
    reads = attention_reads(model, kept, heads, batch_size=cfg.batch_size)
    classes = classify_heads(reads, HeadClassConfig(cfg.operand_threshold, cfg.operator_threshold))
    results["head_classes"] = [dataclasses.asdict(c) | {"head": str(c.head)} for c in classes]
    results["operand_heads"] = [str(c.head) for c in classes if c.label == "operand"]
    results["operator_heads"] = [str(c.head) for c in classes if c.label == "operator"]
    ranked = sorted(classes, key=lambda c: -max(c.operand, c.operator))
    key = [c.head for c in ranked if c.label != "other"][:6] or [c.head for c in ranked[:4]]
    show = sorted(key, key=lambda h: (h.layer, h.head))
    views = attention_views(model, kept, show, max_prompts=cfg.n_views, last_tokens=12)
    transfer = transfer_datasets(model, cfg.op, n_prompts=1, seed=cfg.seed, n_shots=cfg.n_shots)
    for name in ("multi_digit", "word_problem"):
        view = attention_views(model, transfer[name], show, max_prompts=1)[0]
        view.title = f"[{name}] {view.title}"
        views.append(view)

    # 4. MLP probes and logit lens; the single-prompt case keeps the data's few-shot prefix
    probes = probe_mlps(model, kept, ProbeConfig(batch_size=cfg.batch_size))
    prefix = kept[0]["prompt"].rsplit("\n", 1)[0] + "\n" if cfg.n_shots else ""
    case = prefix + cfg.case_problem
    top = top_number_tokens(model, case)
    results |= {
        "logit_lens": probes.lens_table(),
        "first_top1_layer": probes.first_top1_layer(),
        "c_rise_range": probes.rise_range("mlp_out", "C"),
        "probe_means": {s: probes.mean_cos(s).tolist() for s in probes.cos},
        "case_top_tokens": {"prompt": case, "per_layer": top},
    }

    # 5. the report (circuit figure only when node effects exist)
    circuit = None
    if scores is not None:
        circuit = circuit_figure(scores.heads, scores.mlps, {c.head: c.label for c in classes},
                                 top_heads=cfg.top_heads, top_mlps=cfg.top_mlps, rank_by="negative")
    figures = [plot_role_distribution(reads, key, classes)]
    if heads is None:
        figures.append(plot_role_heatmap(reads, model.cfg.n_layers, model.cfg.n_heads))
    report = run_report(
        f"Arithmetic circuit analysis: {cfg.model}, operation {cfg.op}",
        dataset=dataset, base_accuracy=base_accuracy, n_kept=len(kept),
        patching_figure=scores.figure() if scores is not None else None,
        knockout_figure=knockout.figure() if knockout is not None else None,
        head_classes=classes, attention_figures=figures, attention_views=views, probes=probes,
        top_tokens_figure=plot_top_tokens(top, case.splitlines()[-1], None),
        circuit_figure=circuit, settings=dataclasses.asdict(cfg),
    )
    report.save(out / "report.html")
    write_json(results, out / "results.json")
    return results


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_grad_enabled(False)
    summary = main(parse_args())
    print(json.dumps({k: summary[k] for k in ("base_accuracy", "n_kept", "operand_heads", "operator_heads",
                                              "first_top1_layer", "c_rise_range")}, indent=1))
