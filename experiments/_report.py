"""The report of an arithmetic-circuit run (``experiments.addition`` and its siblings): its sections and captions.

:func:`run_report` lays out the standard sections (data, path patching, knockout, attention reads,
MLP probes, circuit) from whatever results it is given; a section whose inputs are ``None`` is
skipped; the caller appends the rest (transfer, AF1, fine-tuning, wall times, settings) with
:class:`circuits.report.Report`'s ``add_*`` methods. :data:`CAPTIONS` holds the default caption of
each figure; the pipeline adds its sample sizes to them.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

import plotly.graph_objects as go

from circuits.attention import classes_table
from circuits.probes import plot_logit_lens, plot_probe_cosines
from circuits.report import Report


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
) -> Report:
    """The standard sections of an arithmetic-circuit run; each is skipped when its inputs are ``None``/empty.

    ``probes`` is a :class:`circuits.probes.ProbeResults`; ``head_classes`` the output of
    :func:`circuits.attention.classify_heads`. Figures come from any package (patching, ...).
    Every figure gets a caption: ``captions[key]`` (keys of :data:`CAPTIONS`; ``attention_figures``
    take ``attention_roles`` then ``attention_all_heads``) or the default of :data:`CAPTIONS`.
    ``notices`` (e.g. a sample too small to read) are highlighted right under the summary.
    """
    caption = {**CAPTIONS, **(captions or {})}
    report = Report(title)
    if notes:
        report.add_text(notes)
    for notice in notices:
        report.add_notice(notice)
    if dataset is not None:
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
    if patching_figure is not None:
        report.add_heading("Path patching")
        report.add_figure(patching_figure, caption=caption["path_patching"])
    if knockout_figure is not None:
        report.add_heading("Knockout")
        report.add_figure(knockout_figure, caption=caption["knockout"])
    if head_classes or attention_figures or attention_views:
        report.add_heading("Attention reads")
        if head_classes:
            report.add_table(classes_table(head_classes, only_labelled=True) or [{"head": "(none)"}],
                             heading="Operand and operator heads",
                             caption="Mean attention from the END token on each role; rule in circuits.attention.")
        for key, fig in zip(("attention_roles", "attention_all_heads", *(f"attention_{i}" for i in range(2, 99))),
                            attention_figures):
            report.add_figure(fig, caption=caption.get(key, "Attention from the last token."))
        for view in attention_views:
            prompt = getattr(view, "prompt", "") or (view.get("prompt", "") if isinstance(view, Mapping) else "")
            heading = (getattr(view, "title", "") or "") if prompt else None
            names = getattr(view, "head_names", None) or []
            report.add_attention_view(view, heading=heading if heading != prompt else None, caption=(
                f"Attention pattern of {', '.join(names) or 'the heads'} over the whole prompt: row = query token, "
                f"column = the key token it reads, darker = more attention (each row sums to 1). Prompt:"))
    if probes is not None or top_tokens_figure is not None:
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
    if circuit_figure is not None:
        report.add_heading("Circuit")
        report.add_figure(circuit_figure, caption=caption["circuit"])
    return report
