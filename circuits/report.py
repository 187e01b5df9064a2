"""One self-contained HTML report per run: opens offline, cites every number the toolkit produced.

:class:`Report` is a generic builder: ``add_text``, ``add_table``, ``add_figure``
(plotly), ``add_attention_view`` (circuitsvis), ``add_html`` and
``add_settings`` append blocks in order; ``save(path)`` writes one HTML file
(to a temporary file first, then ``os.replace``, so a crash never leaves half
a report).

**Offline.** Plotly's JavaScript (``plotly.offline.get_plotlyjs()``) is inlined
once in the page head and every figure is a ``<div>`` that calls
``Plotly.newPlot``. circuitsvis' own HTML imports its bundle from a CDN, so
instead we inline the bundle that ships inside the installed package
(``circuitsvis/dist/cdn/iife.js``, which defines the global ``CircuitsVis``)
once, and mount each view with ``CircuitsVis.render(id, CircuitsVis.AttentionHeads, props)``.
Neither is included when no block needs it.

:func:`run_report` lays out the standard sections of an arithmetic-circuit run
(data, path patching, knockout, attention reads, MLP probes, circuit, settings)
from whatever results it is given; sections whose inputs are ``None`` are
skipped. It takes plain figures and result objects, so this module never
imports the patching package.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import html
import json
import os
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

CIRCUITSVIS_BUNDLE = Path("dist") / "cdn" / "iife.js"

_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; max-width: 1200px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { border-bottom: 2px solid #ddd; padding-bottom: .3em; }
h2 { margin-top: 2em; border-bottom: 1px solid #eee; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f6f6f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.caption { color: #555; font-size: 0.9em; margin: .2em 0 1.2em; }
.figure { margin: 1em 0; }
figure.figure-block { margin: 1em 0 1.5em; }
td.text { white-space: pre-wrap; font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 0.95em; }
.notice { background: #fff6e0; border-left: 4px solid #e0a000; padding: .5em .8em; }
.meta { color: #777; font-size: 0.85em; }
pre { background: #f6f6f6; padding: .6em; overflow-x: auto; white-space: pre-wrap; }
"""


def circuitsvis_bundle() -> str:
    """The JavaScript bundle shipped inside the installed circuitsvis package (safe to inline in a <script>)."""
    import circuitsvis

    path = Path(circuitsvis.__file__).parent / CIRCUITSVIS_BUNDLE
    if not path.exists():
        raise FileNotFoundError(
            f"circuitsvis' bundled JavaScript is missing at {path}; reinstall circuitsvis (pip install circuitsvis) "
            f"or leave attention views out of the report."
        )
    # "</script" inside the bundle (a string literal) would end our inline tag early.
    return path.read_text(encoding="utf-8").replace("</script", "<\\/script")


def _json_for_script(value: Any) -> str:
    return json.dumps(value).replace("</", "<\\/")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        text = f"{value:.4g}"
        return f'<td class="num">{text}</td>'
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return f'<td class="num">{value}</td>'
    text = str(value)
    if "\n" in text:  # few-shot prompts: keep their line breaks
        return f'<td class="text">{html.escape(text)}</td>'
    return f"<td>{html.escape(text)}</td>"


class Report:
    """An HTML report built block by block; ``save`` writes it as one offline file."""

    def __init__(self, title: str, subtitle: str | None = None):
        self.title = title
        self.subtitle = subtitle
        self.blocks: list[str] = []
        self.n_figures = 0
        self.n_attention_views = 0

    # ------------------------------------------------------------------ blocks

    def add_heading(self, text: str, level: int = 2) -> "Report":
        """A section heading (``level`` 2 for sections, 3 for subsections)."""
        if level not in (2, 3, 4):
            raise ValueError(f"Heading level must be 2, 3 or 4, got {level}.")
        self.blocks.append(f"<h{level}>{html.escape(text)}</h{level}>")
        return self

    def _maybe_heading(self, heading: str | None) -> None:
        if heading:
            self.add_heading(heading, 3)

    def add_text(self, text: str, *, heading: str | None = None) -> "Report":
        """Plain text, HTML-escaped; blank lines separate paragraphs."""
        self._maybe_heading(heading)
        for para in str(text).strip().split("\n\n"):
            self.blocks.append(f"<p>{html.escape(para).replace(chr(10), '<br>')}</p>")
        return self

    def add_table(
        self, rows: Sequence[Mapping[str, Any]] | Mapping[str, Any], *, heading: str | None = None,
        caption: str | None = None, max_rows: int = 200, columns: tuple[str, str] = ("setting", "value"),
    ) -> "Report":
        """A table from a list of dicts (one per row) or one dict (key/value rows headed by ``columns``)."""
        if isinstance(rows, Mapping):
            rows = [{columns[0]: k, columns[1]: v} for k, v in rows.items()]
        rows = list(rows)
        self._maybe_heading(heading)
        if not rows:
            self.blocks.append("<p><em>(empty table)</em></p>")
            return self
        columns = list(dict.fromkeys(k for r in rows for k in r))
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
        body = "".join("<tr>" + "".join(_cell(r.get(c, "")) for c in columns) + "</tr>" for r in rows[:max_rows])
        more = f'<p class="caption">... {len(rows) - max_rows} more rows not shown.</p>' if len(rows) > max_rows else ""
        cap = f'<p class="caption">{html.escape(caption)}</p>' if caption else ""
        self.blocks.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}{cap}")
        return self

    def add_figure(self, fig: go.Figure, *, heading: str | None = None, caption: str | None = None) -> "Report":
        """A plotly figure, drawn by the inlined plotly.js."""
        if not isinstance(fig, go.Figure):
            raise TypeError(f"add_figure expects a plotly.graph_objects.Figure, got {type(fig).__name__}.")
        self._maybe_heading(heading)
        div = pio.to_html(fig, full_html=False, include_plotlyjs=False, include_mathjax=False,
                          div_id=f"fig-{uuid.uuid4().hex[:12]}", config={"displaylogo": False, "responsive": True})
        cap = f'<figcaption class="caption">{html.escape(caption)}</figcaption>' if caption else ""
        self.blocks.append(f'<figure class="figure-block"><div class="figure plotly-figure">{div}</div>{cap}</figure>')
        self.n_figures += 1
        return self

    def add_notice(self, text: str, *, heading: str | None = None) -> "Report":
        """A highlighted note (e.g. a stage whose sample is too small to read), HTML-escaped."""
        self._maybe_heading(heading)
        self.blocks.append(f'<p class="notice">{html.escape(text)}</p>')
        return self

    def add_html(self, fragment: str, *, heading: str | None = None) -> "Report":
        """Raw HTML (trusted: it is inserted as is; it must not load anything from the network)."""
        self._maybe_heading(heading)
        self.blocks.append(str(fragment))
        return self

    def add_attention_view(
        self, view, *, heading: str | None = None, caption: str | None = None, kind: str = "heads",
    ) -> "Report":
        """A circuitsvis attention view, rendered offline from the package's bundle.

        ``view`` is a :class:`circuits.attention.AttentionView` or a dict with ``tokens``,
        ``attention`` (``[head, query_pos, key_pos]``) and optional ``head_names``.
        ``kind``: ``"heads"`` (circuitsvis ``AttentionHeads``) or ``"patterns"`` (``AttentionPatterns``).
        """
        from circuitsvis.utils.convert_props import convert_prop_type

        if isinstance(view, Mapping):
            tokens, attention, names = view["tokens"], view["attention"], view.get("head_names")
            title, prompt = view.get("title", ""), view.get("prompt", "")
        else:
            tokens, attention, names, title = view.tokens, view.attention, view.head_names, view.title
            prompt = getattr(view, "prompt", "")
        attention = np.asarray(attention.detach().cpu() if hasattr(attention, "detach") else attention, dtype=float)
        if attention.ndim != 3 or attention.shape[1:] != (len(tokens), len(tokens)):
            raise ValueError(f"attention must be [head, {len(tokens)}, {len(tokens)}] for {len(tokens)} tokens, "
                             f"got shape {attention.shape}.")
        component = {"heads": "AttentionHeads", "patterns": "AttentionPatterns"}.get(kind)
        if component is None:
            raise ValueError(f"kind must be 'heads' or 'patterns', got {kind!r}.")
        # 4 decimals keep the inlined JSON small without visible change.
        props = {"attention": convert_prop_type(np.round(attention, 4)), "tokens": list(tokens)}
        if kind == "heads" and names is not None:
            props["attentionHeadNames"] = list(names)
        self._maybe_heading(heading)
        div_id = f"cv-{uuid.uuid4().hex[:12]}"
        cap = html.escape(caption or (f"Prompt: {title!r}" if title and not prompt else ""))
        if prompt:  # the whole prompt, its line breaks kept
            cap += f'<pre class="prompt">{html.escape(prompt)}</pre>'
        self.blocks.append(
            f'<figure class="figure-block"><div class="attention-view" id="{div_id}"></div>'
            f'<script>CircuitsVis.render("{div_id}", CircuitsVis.{component}, {_json_for_script(props)});</script>'
            + (f'<figcaption class="caption">{cap}</figcaption>' if cap else "") + "</figure>"
        )
        self.n_attention_views += 1
        return self

    def add_settings(self, settings: Mapping[str, Any] | Any, *, heading: str | None = "Settings") -> "Report":
        """The run's settings (a dict or a dataclass) as a key/value table."""
        if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
            settings = dataclasses.asdict(settings)
        flat = {k: (json.dumps(v, default=str) if isinstance(v, (dict, list, tuple)) else v) for k, v in settings.items()}
        return self.add_table(flat, heading=heading)

    # ------------------------------------------------------------------ output

    def to_html(self) -> str:
        """The whole page as one string."""
        scripts = []
        if self.n_figures:
            from plotly.offline import get_plotlyjs

            scripts.append(f"<script>{get_plotlyjs()}</script>")
        if self.n_attention_views:
            scripts.append(f"<script>{circuitsvis_bundle()}</script>")
        stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
        sub = f"<p>{html.escape(self.subtitle)}</p>" if self.subtitle else ""
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(self.title)}</title><style>{_CSS}</style>{''.join(scripts)}</head>\n<body>"
            f"<h1>{html.escape(self.title)}</h1>{sub}<p class=\"meta\">Generated {stamp} by arith-circuits.</p>\n"
            + "\n".join(self.blocks) + "\n</body></html>\n"
        )

    def save(self, path: str | os.PathLike) -> Path:
        """Write the report atomically to ``path`` (parent folders are created); return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = self.to_html()
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o644)  # mkstemp makes 0600; a report is meant to be shared
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def _repr_html_(self) -> str:  # a quick look inside Jupyter
        return "\n".join(self.blocks)


# ---------------------------------------------------------------------------- standard run report


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
    patching_table: Sequence[Mapping[str, Any]] | None = None,
    knockout_figure: go.Figure | None = None,
    head_classes: Sequence | None = None,
    attention_figures: Sequence[go.Figure] = (),
    attention_views: Sequence = (),
    probes=None,
    top_tokens_figure: go.Figure | None = None,
    circuit_figure: go.Figure | None = None,
    settings: Mapping[str, Any] | None = None,
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
    if patching_figure is not None or patching_table:
        report.add_heading("Path patching")
        if patching_figure is not None:
            report.add_figure(patching_figure, caption=caption["path_patching"])
        if patching_table:
            report.add_table(patching_table, heading="Strongest nodes")
    if knockout_figure is not None:
        report.add_heading("Knockout")
        report.add_figure(knockout_figure, caption=caption["knockout"])
    if head_classes or attention_figures or attention_views:
        from circuits.attention import classes_table

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
        from circuits.probes import plot_logit_lens, plot_probe_cosines

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
    if settings:
        report.add_heading("Settings")
        report.add_settings(settings, heading=None)
    return report
