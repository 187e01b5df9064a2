"""One self-contained HTML report per run: opens offline, cites every number the toolkit produced.

:class:`Report` is a generic builder: ``add_text``, ``add_table``, ``add_figure``
(plotly), ``add_explorer`` (the interactive edge circuit of :mod:`circuits.show.explorer`),
``add_attention_view`` (circuitsvis), ``add_html`` and ``add_settings`` append blocks in order; ``save(path)`` writes one HTML file
(to a temporary file first, then ``os.replace``, so a crash never leaves half
a report).

**Offline.** Plotly's JavaScript (``plotly.offline.get_plotlyjs()``) is inlined
once in the page head and every figure is a ``<div>`` that calls
``Plotly.newPlot``. circuitsvis' own HTML imports its bundle from a CDN, so
instead we inline the bundle that ships inside the installed package
(``circuitsvis/dist/cdn/iife.js``, which defines the global ``CircuitsVis``)
once, and mount each view with ``CircuitsVis.render(id, CircuitsVis.AttentionHeads, props)``.
Neither is included when no block needs it.

The layout of the arithmetic experiments' report (which sections, which captions) is not here:
it is ``experiments.arithmetic.report.run_report``. This module only builds pages, so it never imports the
patching package.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import html
import json
import os
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from circuits.atomic_files import write_text_atomic
from circuits.errors import InputError

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


def json_for_script(value: Any, *, compact: bool = False) -> str:
    """JSON that cannot end the ``<script>`` it sits in; ``compact`` drops the spaces (large payloads)."""
    separators = (",", ":") if compact else None
    return json.dumps(value, separators=separators).replace("</", "<\\/")


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
        self.n_explorers = 0

    # ------------------------------------------------------------------ blocks

    def add_heading(self, text: str, level: int = 2) -> "Report":
        """A section heading (``level`` 2 for sections, 3 for subsections)."""
        if level not in (2, 3, 4):
            raise InputError(f"Heading level must be 2, 3 or 4, got {level}.")
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

    def add_explorer(self, explorer, *, heading: str | None = None, caption: str | None = None) -> "Report":
        """An edge-circuit explorer (:func:`circuits.show.explorer.circuit_explorer`), drawn by the inlined plotly.js."""
        if not callable(getattr(explorer, "html_fragment", None)):
            raise InputError(f"add_explorer expects what circuits.show.explorer.circuit_explorer returns, got "
                             f"{type(explorer).__name__}; add a plain plotly figure with add_figure.")
        self._maybe_heading(heading)
        cap = f'<figcaption class="caption">{html.escape(caption)}</figcaption>' if caption else ""
        self.blocks.append(f'<figure class="figure-block">{explorer.html_fragment()}{cap}</figure>')
        self.n_explorers += 1
        return self

    def add_attention_view(
        self, view, *, heading: str | None = None, caption: str | None = None, kind: str = "heads",
    ) -> "Report":
        """A circuitsvis attention view, rendered offline from the package's bundle.

        ``view`` is a :class:`circuits.analyze.attention.AttentionView` or a dict with ``tokens``,
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
            raise InputError(f"attention must be [head, {len(tokens)}, {len(tokens)}] for {len(tokens)} tokens, "
                             f"got shape {attention.shape}.")
        component = {"heads": "AttentionHeads", "patterns": "AttentionPatterns"}.get(kind)
        if component is None:
            raise InputError(f"kind must be 'heads' or 'patterns', got {kind!r}.")
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
            f'<script>CircuitsVis.render("{div_id}", CircuitsVis.{component}, {json_for_script(props)});</script>'
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
        if self.n_figures or self.n_explorers:
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
        return write_text_atomic(path, self.to_html())

    def _repr_html_(self) -> str:  # a quick look inside Jupyter
        return "\n".join(self.blocks)
