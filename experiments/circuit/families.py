"""``python -m experiments.circuit --templates A B ...``: the --method circuit found on each prompt family and
evaluated on every other (``patching.edges.families.family_circuits``), its stage, report section and summary line."""

from __future__ import annotations

from circuits.show.html_report import Report
from experiments.circuit.config import CircuitConfig


def templates_stage(model, cfg: CircuitConfig):
    """``(results["templates"], figure or None)``: each family's correctly answered prompts, then every family's
    circuit on every family; a family with too few correct prompts is left out (``skipped_families``), and with
    fewer than two left the entry says why (``skipped``) instead."""
    from circuits.tasks import filter_correct
    from patching.edges.faithful_circuit import MIN_PROMPTS
    from patching.edges.families import family_circuits, family_prompts

    prompts = family_prompts(model, cfg.templates, cfg.task_config())
    kept, accuracy, skipped = {}, {}, {}
    for name, data in prompts.items():
        correct, accuracy[name] = filter_correct(model, data, cfg.batch_size)
        if len(correct) < MIN_PROMPTS:
            skipped[name] = (f"{len(correct)} of {len(data)} prompts answered correctly, fewer than the {MIN_PROMPTS} a "
                             "circuit needs: raise --n-prompts")
        else:
            kept[name] = correct
    about = {"families": list(cfg.templates), "base_accuracy": accuracy, "n_kept": {n: len(d) for n, d in kept.items()},
             "skipped_families": skipped}
    if len(kept) < 2:
        return about | {"skipped": f"fewer than two families with {MIN_PROMPTS} correct prompts"}, None
    warm_start = None if cfg.warm_start == "none" else cfg.warm_start
    found = family_circuits(model, kept, cfg.method, cfg.search(), fraction=cfg.templates_size, learn=cfg.learn(),
                            warm_start=warm_start, bootstrap_resamples=cfg.bootstrap_resamples)
    return found.to_dict() | about | {"families": found.families}, found.figure()


def _fmt(estimate: dict) -> str:
    return f"{estimate['value']:.2f} [{estimate['low']:.2f}, {estimate['high']:.2f}]"


def templates_summary(entry: dict) -> str:
    """One line: each family's circuit on its own prompts against the others' circuits on them."""
    if "skipped" in entry:
        return f"circuits across prompt families skipped: {entry['skipped']}"
    names = entry["families"]
    parts = []
    for b in names:
        others = [entry["f"][a][b]["value"] for a in names if a != b]
        parts.append(f"{b} own {entry['f'][b][b]['value']:.2f}, others' {min(others):.2f}-{max(others):.2f}")
    return f"circuits across prompt families (f at {100 * entry['fraction']:g}% of the edges): " + "; ".join(parts)


def add_templates_section(report: Report, entry: dict, figure=None) -> Report:
    """The f matrix (rows: whose circuit; columns: whose prompts) and the Jaccard matrix, as tables and a figure."""
    report.add_heading("Circuits across prompt families")
    if "skipped" in entry:
        report.add_notice(f"Skipped: {entry['skipped']} (correct prompts per family: {entry['n_kept']}; "
                          f"left out: {entry['skipped_families']}).")
        return report
    names = entry["families"]
    size = f"{100 * entry['fraction']:g}%"
    if figure is not None:
        report.add_figure(figure, caption=(
            f"The {entry['method']} circuit at {size} of the edges, scored on each family's selection prompts, "
            f"evaluated ({entry['ablation']} ablation) on each family's held-out prompts; right: the edge Jaccard of "
            "the families' own circuits."))
    sizes = ", ".join(f"{b} {entry['n_heldout'][b]}" for b in names)
    rows = [{"circuit of": a, **{f"f on {b}": _fmt(entry["f"][a][b]) for b in names},
             **{f"Jaccard with {b}": f"{entry['jaccard'][a][b]:.2f}" for b in names if b != a},
             "edges": entry["circuit_edges"][a]} for a in names]
    report.add_table(rows, caption=(
        f"f = (m(C) − m(∅)) / (m(full) − m(∅)) of each family's circuit at {size} of the edges on each family's "
        f"held-out prompts (n = {sizes}), 95% bootstrap "
        "intervals over prompts; the diagonal is each circuit on its own family."))
    if entry["skipped_families"]:
        report.add_notice(f"Families left out: {entry['skipped_families']}.")
    return report
