"""The report of an arithmetic-circuit run (``experiments.addition`` and its siblings): its sections and captions.

:func:`run_report` lays out the standard sections (data, path patching, knockout, attention reads,
MLP probes, circuit) from whatever results it is given; a section whose inputs are ``None`` is
skipped; the caller appends the rest (transfer, AF1, fine-tuning, wall times, settings) with
:class:`circuits.show.html_report.Report`'s ``add_*`` methods. :data:`CAPTIONS` holds the default caption of
each figure; the pipeline adds its sample sizes to them.

:func:`write_run_report` is that caller for ``experiments.arithmetic``: the standard sections with
this run's captions, a notice for each stage whose sample is too small to read
(:data:`MIN_READABLE`), then the sections of the optional stages, the wall times and the settings.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections import Counter
from typing import TYPE_CHECKING, Mapping, Sequence

import plotly.graph_objects as go

from circuits.analyze.attention import classes_table
from circuits.analyze.probes import plot_logit_lens, plot_probe_cosines
from circuits.show.html_report import Report
from experiments.arithmetic.config import MIN_READABLE
from experiments.runtime.edge_circuit import add_report_section, two_decimals

if TYPE_CHECKING:
    from experiments.arithmetic.config import PipelineConfig
    from experiments.arithmetic.stages import HeadRoles, PipelineRun, Prompts


def data_summary(dataset, base_accuracy: float | None = None, n_examples: int = 5) -> tuple[list[dict], list[dict]]:
    """Per-template counts and a few example rows of a :func:`circuits.tasks.make_dataset` dataset."""
    counts = Counter(zip(dataset["template_id"], dataset["style"]))
    templates = [{"template": t, "style": s, "prompts": n} for (t, s), n in sorted(counts.items())]
    examples = [
        {"prompt": r["prompt"], "counterfactual": r["counterfactual"].splitlines()[-1], "answer": r["answer"]}
        for r in dataset.select(range(min(n_examples, len(dataset)))).to_list()
    ]
    return templates, examples


CAPTIONS = {
    "path_patching": "Path patching: the change of the answer logit at the last token when one node's path to the "
                     "logits is patched with its counterfactual activation, in % of the unpatched logit (mean over "
                     "the prompts; point estimates, no interval drawn). Red: the logit drops (the node carries the "
                     "answer); blue: it rises. Heads and MLPs have separate colour scales; outlined squares are the "
                     "key heads, numbered by rank.",
    "knockout": "Accuracy (first answer token, top-1) as the k heads with the largest path-patching drop are "
                "mean-ablated, against k random heads; k = 0 is the unablated model on prompts it answers correctly.",
    "attention_roles": "Attention of the key heads from the last token on each role (operands, operator, BOS, the "
                       "rest): one box per head and role over the prompts (box: quartiles, whiskers: 1.5 IQR).",
    "attention_all_heads": "Mean attention from the last token on the operands, the operator and BOS, for every "
                           "head (0 to 1; averaged over the prompts).",
    "probe_cosines": "Cosine similarity of each MLP's input and output with the unembedding of the operands A, B, "
                     "the answer C and the other numbers, at the last token, averaged over the prompts (no interval).",
    "top_tokens": "The number tokens whose unembedding is closest (cosine) to each layer's MLP output at the last "
                  "token, for one prompt; rank 1 on the left; the answer in bold.",
    "logit_lens": "Logit lens at the last token: after each block, the share of prompts whose answer is the top "
                  "token, its mean probability (left axis) and its median rank (right axis, log; rank 1 = the "
                  "answer is the top token).",
    "circuit": "The key heads (coloured by their attention role), the key MLPs and the logits; marker size grows "
               "with |path-patching effect|. Edges only show which later nodes a node can reach.",
}


def run_report(
    title: str,
    *,
    dataset=None,
    base_accuracy: float | None = None,
    n_kept: int | None = None,
    patching_figure: go.Figure | None = None,
    knockout_figure: go.Figure | None = None,
    head_classes: Sequence | None = None,
    attention_figures: Sequence[go.Figure] = (),
    attention_views: Sequence = (),
    probes=None,
    top_tokens_figure: go.Figure | None = None,
    circuit_figure: go.Figure | None = None,
    notes: str | None = None,
    captions: Mapping[str, str] | None = None,
    notices: Sequence[str] = (),
    found: Sequence[str] = (),
    lead=None,
) -> Report:
    """The standard sections of an arithmetic-circuit run; each is skipped when its inputs are ``None``/empty.

    ``probes`` is a :class:`circuits.analyze.probes.ProbeResults`; ``head_classes`` the output of
    :func:`circuits.analyze.attention.classify_heads`. Figures come from any package (patching, ...).
    Every figure gets a caption: ``captions[key]`` (keys of :data:`CAPTIONS`; ``attention_figures``
    take ``attention_roles`` then ``attention_all_heads``) or the default of :data:`CAPTIONS`.
    ``notices`` (e.g. a sample too small to read) are highlighted right under the summary; ``found``
    (:func:`findings`) opens the page as a list under "What this run found", in place of ``notes``.
    ``lead(report)``: adds the sections that come right after it, before the standard ones (the circuit).
    """
    caption = {**CAPTIONS, **(captions or {})}
    report = Report(title)
    for notice in notices:
        report.add_notice(notice)
    if found:
        report.add_html("<ul class=\"findings\">" + "".join(f"<li>{html.escape(line)}</li>" for line in found) + "</ul>",
                        heading="What this run found")
    elif notes:
        report.add_text(notes)
    if lead is not None:
        lead(report)
    if dataset is not None:
        _data_section(report, dataset, base_accuracy, n_kept)
    if patching_figure is not None:
        report.add_heading("Path patching")
        report.add_figure(patching_figure, caption=caption["path_patching"])
    if knockout_figure is not None:
        report.add_heading("Knockout")
        report.add_figure(knockout_figure, caption=caption["knockout"])
    if head_classes or attention_figures or attention_views:
        _attention_section(report, head_classes, attention_figures, attention_views, caption)
    if probes is not None or top_tokens_figure is not None:
        _probes_section(report, probes, top_tokens_figure, caption)
    if circuit_figure is not None:
        report.add_heading("Circuit")
        report.add_figure(circuit_figure, caption=caption["circuit"])
    return report


def _data_section(report: Report, dataset, base_accuracy: float | None, n_kept: int | None) -> None:
    """How many prompts, the base accuracy, the templates and a few examples."""
    report.add_heading("Data")
    templates, examples = data_summary(dataset)
    lines = [f"{len(dataset)} prompts."]
    if base_accuracy is not None:
        lines.append(f"Base accuracy (top-1 first answer token): {100 * base_accuracy:.1f}%.")
    if n_kept is not None:
        lines.append(f"{n_kept} prompts answered correctly are analysed below.")
    report.add_text(" ".join(lines))
    report.add_table(templates, heading="Templates")
    report.add_table(examples, heading="Examples", caption="Counterfactual: the queried line with the operator replaced.")


def _attention_section(report: Report, head_classes, attention_figures, attention_views, caption: Mapping[str, str]) -> None:
    """Operand / operator heads, the attention figures and one attention view per head."""
    report.add_heading("Attention reads")
    if head_classes:
        report.add_table(classes_table(head_classes, only_labelled=True) or [{"head": "(none)"}],
                         heading="Operand and operator heads",
                         caption="Mean attention from the END token on each role; rule in circuits.analyze.attention.")
    for key, fig in zip(("attention_roles", "attention_all_heads", *(f"attention_{i}" for i in range(2, 99))),
                        attention_figures):
        report.add_figure(fig, caption=caption.get(key, "Attention from the last token."))
    if not attention_views:
        return
    # folded: the views are most of the page's height, and the circuit sections come after them
    report.add_html(f'<details class="fold"><summary>Attention views of the key heads ({len(attention_views)} views, '
                    f'one per head and prompt; click to open)</summary>')
    for view in attention_views:
        prompt = getattr(view, "prompt", "") or (view.get("prompt", "") if isinstance(view, Mapping) else "")
        title = (getattr(view, "title", "") or "") if prompt else ""
        names = getattr(view, "head_names", None) or []
        report.add_attention_view(view, heading=None, caption=(
            (f"{title}. " if title and title != prompt else "")
            + f"Attention pattern of {', '.join(names) or 'the heads'} over the whole prompt: row = query token, "
            f"column = the key token it reads, darker = more attention (each row sums to 1). Prompt:"))
    report.add_html("</details>")


def _probes_section(report: Report, probes, top_tokens_figure: go.Figure | None, caption: Mapping[str, str]) -> None:
    """Where the answer rises in the MLP outputs, the probe cosines, the top tokens, the logit lens."""
    report.add_heading("MLP probes and logit lens")
    if probes is not None:
        start, peak = probes.rise_range("mlp_out", "C")
        text = (f"MLP output similarity to the answer C (minus its similarity to the other numbers) rises from "
                f"layer {start} to its peak at layer {peak}.")
        if probes.rank is not None:
            first = probes.first_top1_layer()
            text += (f" The answer is logit-lens top-1 for most prompts from layer {first} on." if first is not None
                     else " The answer never becomes logit-lens top-1 for most prompts before the end.")
        report.add_text(text + f" n = {next(iter(probes.cos.values())).shape[0]} prompts.")
        report.add_figure(plot_probe_cosines(probes), caption=caption["probe_cosines"])
    if top_tokens_figure is not None:
        report.add_figure(top_tokens_figure, caption=caption["top_tokens"])
    if probes is not None and probes.rank is not None:
        report.add_figure(plot_logit_lens(probes), caption=caption["logit_lens"] + f" n = {probes.rank.shape[0]} prompts.")


# ---------------------------------------------------------------------------- the pipeline's report

def write_run_report(run: PipelineRun, prompts: Prompts, roles: HeadRoles, probes) -> None:
    """report.html of an arithmetic pipeline run: the findings and the edge circuit first, the standard sections,
    then transfer, AF1, SFT, times."""
    cfg, results, figures = run.cfg, run.results, run.state.figures
    report = run_report(
        f"The {run.name} circuit of {cfg.model}",
        dataset=prompts.dataset, base_accuracy=prompts.base_accuracy, n_kept=len(prompts.kept),
        patching_figure=figures["path_patching"], knockout_figure=figures["knockout"], head_classes=roles.classes,
        attention_figures=[figures["attention_roles"], figures["attention_all_heads"]], attention_views=roles.views,
        probes=probes, top_tokens_figure=figures["top_tokens"], circuit_figure=figures["circuit"],
        notes=summary(results), captions=_captions(results, cfg), notices=_small_samples(results, cfg),
        found=findings(results, cfg), lead=lambda r: _edge_circuit_section(r, results, figures),
    )
    if cfg.quick:  # at the top: a preview must not be read as a result
        report.blocks.insert(0, '<p class="notice">Quick preview (--quick): every stage ran on few prompts, so these '
                                'numbers are a preview of the run, not results; rerun without --quick to report them.</p>')
    report.add_figure(figures["knockout_transfer"], heading="Do the key heads transfer?", caption=(
        f"Accuracy (first answer token, top-1) of the full model and with the {len(results['key_heads'])} key heads "
        f"mean-ablated, per data format (Zhang et al. Figure 4); {cfg.transfer_prompts} prompts per format, all prompts "
        f"(not only correctly answered ones); error bars: 95% Wilson intervals over prompts (the drop's paired "
        f"interval is on the first screen and in results.json)."))
    _optional_sections(report, results, figures, cfg)
    report.add_table(run.timer.seconds | {"total": results["wall_seconds"]}, heading="Wall time per stage",
                     columns=("stage", "seconds"))
    report.add_settings(dataclasses.asdict(cfg))
    report.save(run.out / "report.html")


def _edge_circuit_section(report: Report, results: dict, figures: dict) -> None:
    """The edge circuit on the first screen: its graph, its stability, its curve (or why the stage drew nothing)."""
    if "edge_circuit" not in results:
        return
    if "skipped" in results["edge_circuit"]:
        report.add_notice(results["edge_circuit"]["skipped"], heading="Edge circuit")
    else:
        add_report_section(report, results["edge_circuit"], figures)


def _optional_sections(report: Report, results: dict, figures: dict, cfg: PipelineConfig) -> None:
    """AF1 and precise SFT, each when its stage ran (or the reason it drew nothing)."""
    if "af1" in figures:
        af1 = results["af1"]
        report.add_figure(figures["af1"], heading="All for One", caption=(
            f"AF1 faithfulness per (L_wait, L_transfer) on a coarse grid (every {cfg.af1_stride} L_wait; Mamidanna et "
            f"al. 2025): the share of the {af1['n_eval']} evaluation prompts (zero-shot, one-token answers, templates "
            f"{', '.join(af1['templates'])}; the full model answers {percent(af1['base_accuracy'])}) that the AF1 model still "
            f"answers correctly; 1 = as the full model. Rows: the L_wait values evaluated; each cell's 95% Wilson interval over "
            f"the {af1['n_eval']} prompts is in its hover (a cell's interval is about +-{_af1_halfwidth(af1['n_eval'])} "
            f"at f = 0.5)."))
    elif "af1" in results:
        report.add_notice(f"All for One: {results['af1']['skipped']}", heading="All for One")
    if "finetune" in results:
        report.add_table(results["finetune"]["table"], heading="Precise SFT of the key heads")


def _af1_halfwidth(n: int) -> str:
    """Half the width of a 95% Wilson interval at p = 0.5 for ``n`` prompts, e.g. ``0.19``."""
    z = 1.959964
    return f"{z * math.sqrt(0.25 / n + z * z / (4 * n * n)) / (1 + z * z / n):.2f}" if n else "n/a"


def percent(value, digits: int = 0) -> str:
    """``value`` as a percentage, or ``n/a`` where results.json holds none (null: an interval of one prompt)."""
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}%}"


def summary(results: dict) -> str:
    """One paragraph: base accuracy, the key heads, and what knocking them out does against random heads.

    Any number may be missing (``None``: e.g. no interval from a single prompt and a single seed); it reads
    ``n/a`` then, so a run on very few prompts still gets its summary and report.
    """
    knock = results.get("knockout") or {}
    last = lambda key: (knock.get(key) or [None])[-1]
    k = last("ks")
    lo, hi = last("random_ci") or (None, None)
    interval = f" [{percent(lo)}, {percent(hi)}]" if lo is not None and hi is not None else " (no interval)"
    drop = (f"knocking out the top-{k} heads: accuracy {percent(last('effect_rank'))} "
            f"vs {percent(last('random_rank'))}{interval} for {k} random heads over {knock.get('n_seeds')} seeds, "
            f"on {knock.get('n_prompts')} prompts the full model answers correctly (there "
            f"{percent(knock.get('base_accuracy'))}; ablation means over {knock.get('n_pool')} other prompts)"
            if knock else "no knockout curve")
    return (f"{results['experiment']}: base accuracy {percent(results.get('base_accuracy'), 1)} of "
            f"{results.get('n_prompts')} prompts ({results.get('n_kept')} answered correctly); key heads "
            f"{', '.join(results.get('key_heads') or []) or 'none'} ({percent(results.get('key_head_fraction'), 1)} of "
            f"heads); {drop}.")


def _interval(estimate: dict | None, digits: int = 0) -> str:
    """``55% [43%, 66%]`` from a results.json estimate (``value``, ``low``, ``high``), ``n/a`` where missing."""
    if not estimate:
        return "n/a"
    low, high = estimate.get("low"), estimate.get("high")
    if low is None or high is None:  # results.json holds null: an interval of one prompt or one draw
        return f"{percent(estimate.get('value'), digits)} (no interval)"
    return f"{percent(estimate.get('value'), digits)} [{percent(low, digits)}, {percent(high, digits)}]"


def _number(estimate: dict | None) -> str:
    num = lambda v: f"{v:.2f}" if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"
    return f"{num((estimate or {}).get('value'))} [{num((estimate or {}).get('low'))}, {num((estimate or {}).get('high'))}]"


#: a circuit holding more than this share of all edges is not called small on the report's first screen
LARGE_CIRCUIT = 0.2


def findings(results: dict, cfg: PipelineConfig | None = None) -> list[str]:
    """The report's first screen: what the run found, each with its sample size and 95% interval, and plain
    sentences where a result is weak (a circuit too large to say much, a sample too small)."""
    out = []
    accuracy = results.get("accuracy") or {}
    if accuracy:
        out.append(f"The model answers {_interval(accuracy.get('first_token'), 1)} of {results.get('n_prompts')} "
                   f"{results.get('experiment')} prompts on the first answer token and "
                   f"{_interval(accuracy.get('whole_answer'), 1)} on the whole answer (95% Wilson intervals); the "
                   f"{results.get('n_kept')} answered correctly are analysed.")
    knock = results.get("knockout") or {}
    heads = results.get("key_heads") or []
    if knock and heads:
        k = knock["ks"][-1]
        drop = (knock.get("effect_drop") or [None])[-1]
        lo, hi = (knock.get("random_ci") or [[None, None]])[-1]
        out.append(f"Key heads (top {len(heads)} by path patching): {', '.join(heads)}. Knocking out the top {k} "
                   f"leaves {_interval({'value': knock['effect_rank'][-1], 'low': knock['effect_ci'][-1][0], 'high': knock['effect_ci'][-1][1]})} "
                   f"accuracy against {_interval({'value': knock['random_rank'][-1], 'low': lo, 'high': hi})} for {k} "
                   f"random heads ({knock['n_seeds']} draw{'s' if knock['n_seeds'] != 1 else ''}); the drop is {_interval(drop)} (paired bootstrap, "
                   f"n = {knock['n_prompts']} prompts answered correctly).")
    circuit = results.get("edge_circuit") or {}
    if circuit and "skipped" not in circuit:
        smallest = circuit.get("smallest")
        base = (f"Edge circuit ({circuit['method']}, {circuit['ablation']} ablation): held-out CPR "
                f"{_number(circuit.get('cpr'))}, CMD {_number(circuit.get('cmd'))} (n = {circuit['n_heldout']} "
                f"held-out prompts).")
        if smallest is None:
            out.append(base + f" No size reaches f >= {circuit['threshold']:g} on the selection prompts.")
        else:
            relation = circuit.get("key_heads") or {}
            line = (base + f" The smallest circuit with f >= {smallest['threshold']:g} (chosen on "
                    f"{circuit['n_selection']} other prompts) has {smallest['n_edges']:,} of {circuit['n_total_edges']:,} "
                    f"edges ({100 * smallest['fraction']:g}%), f = {_number(smallest.get('f_heldout'))} held out")
            if relation.get("key_heads"):
                line += f"; it holds {relation['n_key_heads_in_circuit']} of the {len(relation['key_heads'])} key heads"
            out.append(line + ".")
            if smallest["fraction"] > LARGE_CIRCUIT:
                n_heads = results.get("n_layers", 0) * results.get("n_heads", 0)
                out.append(f"This circuit is not small: it keeps {100 * smallest['fraction']:g}% of all edges "
                           f"({circuit.get('n_circuit_nodes')} nodes; the model has {n_heads} heads), so which heads "
                           f"it holds says little about the mechanism. `--circuit-method top-n` (the default) learns a "
                           f"smaller one; `python -m experiments.learned_circuit` tunes it on validation prompts.")
        stability = circuit.get("stability")
        if stability:
            parts = [f"{100 * j['fraction']:g}% {two_decimals(j['mean'])}" for j in stability["jaccard"]]
            core = [c for c in stability["core"] if abs(c["fraction"] - 0.05) < 1e-9]
            nodes = [f"{100 * j['fraction']:g}% {two_decimals(j['mean'])}" for j in stability.get("node_jaccard", [])]
            out.append(f"Is it the same circuit on other prompts? The same method on {stability['n_sets']} disjoint sets "
                       f"of {stability['n_per_set']} prompts keeps edge sets with Jaccard {', '.join(parts)} (1: the "
                       f"same edges)" + (f", node sets (the heads and MLPs its edges touch) {', '.join(nodes)}"
                                         if nodes else "") + (f"; the {core[0]['n_edges']} edges every set keeps at 5% reach f = "
                                         f"{_number(core[0]['f'])} on {stability['n_heldout']} prompts none trained on"
                                         if core else "") + ".")
        elif circuit.get("stability_skipped"):
            out.append(circuit["stability_skipped"])
    transfer = (knock or {}).get("transfer") or {}
    moved = [f"{name.replace('_', ' ')} {_interval(v['drop'])}" for name, v in transfer.items() if "drop" in v]
    if moved:
        out.append(f"Knocking the key heads out on other formats drops accuracy by: {'; '.join(moved)} "
                   f"(paired bootstrap, {cfg.transfer_prompts if cfg else 'n'} prompts each, answered or not).")
    return out


def _captions(results: dict, cfg: PipelineConfig) -> dict[str, str]:
    """Captions that name this run's sample sizes (the rest of the wording is :data:`CAPTIONS`)."""
    knock, n = results["knockout"], results["n_kept"]
    n_knock = min(cfg.knockout_prompts, n)
    return {
        "path_patching": CAPTIONS["path_patching"] + f" n = {n} prompts the model answers correctly.",
        "knockout": CAPTIONS["knockout"] + (
            f" n = {knock.get('n_prompts', n_knock)} prompts, ablation means over {knock.get('n_pool')} other prompts; "
            f"effect-rank: one ablation per k, error bars a 95% Wilson interval over prompts; random-rank: mean over "
            f"{knock['n_seeds']} random head sets, error bars a 95% bootstrap interval over prompts and head sets."),
        "attention_roles": CAPTIONS["attention_roles"] + f" n = {n} prompts.",
        "attention_all_heads": CAPTIONS["attention_all_heads"] + f" n = {n} prompts.",
    }


def _small_samples(results: dict, cfg: PipelineConfig) -> list[str]:
    """One notice per stage whose sample is too small to read (fewer than MIN_READABLE prompts)."""
    notes, n = [], results["n_kept"]
    if n < MIN_READABLE:
        notes.append(f"Only {n} of {results['n_prompts']} prompts are answered correctly: path patching, knockout, "
                     f"attention reads and probes below rest on them and are too noisy to read (need >= "
                     f"{MIN_READABLE}; raise --n-prompts or use a stronger model).")
    elif min(cfg.knockout_prompts, n) < MIN_READABLE:
        notes.append(f"The knockout curve uses {min(cfg.knockout_prompts, n)} prompts (< {MIN_READABLE}): one prompt "
                     f"moves accuracy by {1 / min(cfg.knockout_prompts, n):.0%}; raise --knockout-prompts.")
    if "edge_circuit" in results and "skipped" not in results["edge_circuit"] \
            and results["edge_circuit"]["n_heldout"] < MIN_READABLE:
        notes.append(f"The edge circuit is reported on {results['edge_circuit']['n_heldout']} held-out prompts "
                     f"(< {MIN_READABLE}); raise --circuit-prompts (half score and choose, half report).")
    if cfg.transfer_prompts < MIN_READABLE:
        notes.append(f"Transfer formats use {cfg.transfer_prompts} prompts each (< {MIN_READABLE}); raise --transfer-prompts.")
    return notes
