"""report.html of ``python -m experiments.merge``: the summary, the results table, key heads, α heatmaps and the
linearity figure."""

from __future__ import annotations

import dataclasses

from circuits.show.html_report import Report
from merging.submodule import alpha_heatmap

CIRCUIT_AWARE = "circuit-aware (head in key layers)"


def write_report(run, linearity_figure) -> None:
    """report.html of ``run`` (an ``experiments.merge.MergeRun``): summary, table, key heads, α heatmaps, the linearity
    figure, settings and stage times."""
    report = Report("Merging three experts", f"{run.cfg.model}: add_word, mul, en_fr")
    report.add_text("Test accuracy = teacher-forced exact answer (every answer token argmax). Baseline λ/density "
                    "chosen on the validation split. " + run.results["verdict"], heading="Summary")
    report.add_table(run.results["table"], heading="Test accuracy (exact); time per method (s, includes val tuning), "
                     "one merge's time (merge_seconds) and peak resident memory above the start (peak_mb, MB)")
    rule = run.results.get("key_heads_rule")
    if rule is not None:
        how = "given by --heads" if rule["source"] == "--heads" else \
            f"path patching on the base, the union of the top {rule['top_k']} of + and of *"
        report.add_text(f"Key heads ({how}): " + ", ".join(run.results["key_heads"]))
    for name in ("closed form (attn_mlp)", CIRCUIT_AWARE):
        if name in run.state.alpha_tables:
            report.add_figure(alpha_heatmap(run.state.alpha_tables[name], f"α: {name}"), heading=f"α ({name})")
    if linearity_figure is not None:
        report.add_figure(linearity_figure, heading="Non-linearity of attention/MLP vs the whole model")
    column = run.results.get("circuit_column")
    if column is not None:
        from experiments.merge.circuit_column import figure

        fig = figure(column)
        if fig is not None:
            report.add_figure(fig, heading="The experts' circuits inside the merges", caption=(
                f"Each arithmetic expert's EAP-IG circuit ({column['n_prompts']} prompts it answers, MIB's sizes) "
                "evaluated inside every merge of all three experts against that merge's own full and empty runs "
                "(CPR, 95% bootstrap over prompts), against the merge's test accuracy on the task (Wilson 95%). "
                "Dotted: the circuit's CPR in its expert. ρ: Spearman over merges; its interval, paired comparisons "
                "and every number in results.json, circuit_column."))
    report.add_settings(dataclasses.asdict(run.cfg))
    report.add_table(run.timer.seconds, heading="Stage times (s)")
    report.save(run.out / "report.html")
