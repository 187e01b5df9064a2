"""The edge-circuit explorer: one self-contained, interactive page over a scored edge graph.

:func:`circuit_explorer` turns a :class:`~circuits.graph.Graph` of edge scores into an :class:`Explorer`. The page
draws the circuit by layer as :func:`circuits.show.edge_figures.edge_circuit_figure` does (heads at layer x head
index, MLPs on a row below, ``input`` left, ``logits`` right; width grows with |score|, blue positive, red negative)
and adds what a static figure cannot:

* a **size control** over the circuit sizes (fractions of the edges, MIB's ten by default, or the fractions of the
  faithfulness curve): it redraws the circuit at that size (MIB's pruned top-n by |score|, or the method's own
  selector) and shows f with its 95% interval from the curve;
* **hover** a node for its name and the fields of ``node_info`` (attention-read class, path-patching effect,
  key-head rank, IIA per causal variable, ...); hover an edge for its score and, with ``edge_share``, the share of
  runs keeping it (consensus and stability runs);
* **compare mode** (``compare=`` a second scoring of the same graph): at each size, the edges both circuits keep,
  only the first keeps and only the second keeps, in three colours with their counts;
* **click a node** to highlight its paths to the logits (the drawn edges downstream of it that lead there);
* **export** as SVG from the plot's camera button (vector, for papers).

Everything is computed here, in Python: the page receives one table of the edges it may draw (sorted by |score|)
and, per size, the rows to draw, so its script only slices and calls ``Plotly.react``. At most ``max_edges``
edges are drawn per size (the largest |score|; the page says how many are hidden), so a graph of a 7B model
(1.6 million edges) opens as fast as one of gemma-3-270m (10,342). Edges are drawn as one line trace per colour
and width (segments separated by gaps), not one trace per edge.

An :class:`Explorer` is also a plotly ``Figure``: the static :func:`edge_circuit_figure` of the circuit at the
start size, so run folders that write every figure as JSON or export it for a paper keep working. Its
``html_fragment()`` goes into a page that already loads plotly.js (the report's
:meth:`circuits.show.html_report.Report.add_explorer`); ``html_document()``, ``save(path)`` and a Jupyter cell
(an ``iframe`` whose ``srcdoc`` holds the page, so its script runs apart from the notebook's) inline plotly.js
and need no network.
"""

from __future__ import annotations

import html
import json
import math
import numbers
import os
import re
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from torch import Tensor

from circuits.analyze.attention import CLASS_COLORS
from circuits.atomic_files import write_text_atomic
from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import mib_selector
from circuits.nodes import MLP, Head
from circuits.show.edge_figures import NEGATIVE_COLOR, POSITIVE_COLOR, SHIFT_COLORS, edge_circuit_figure, node_positions
from circuits.show.html_report import json_for_script
from circuits.show.node_circuit import LOGITS_COLOR, MLP_COLOR

__all__ = ["Explorer", "circuit_explorer", "MIB_SIZES"]

#: MIB's circuit sizes (fractions of the edges), the default positions of the size control
MIB_SIZES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
#: edges drawn per size by default: a page stays responsive, a reader still sees the circuit's bulk
DEFAULT_MAX_EDGES = 3000
#: edges of the static figure (the Explorer as a plotly Figure): more is unreadable on paper
STATIC_EDGES = 300
WIDTH_BINS = 5


class Explorer(go.Figure):
    """An interactive edge-circuit page (see the module docstring) that is also the static figure at its start size.

    ``payload`` is everything the page draws (node and edge tables, per-size rows, f); ``html_fragment()`` the page
    for a document that loads plotly.js, ``html_document()`` the whole offline page, ``save(path)`` writes it.
    """

    _payload: Optional[dict] = None  # plotly figures accept only underscored attributes of their own

    @property
    def payload(self) -> dict:
        if self._payload is None:
            raise InputError("This figure carries no explorer data (a copy keeps only the static figure): "
                             "build it with circuits.show.explorer.circuit_explorer.")
        return self._payload

    def html_fragment(self) -> str:
        """The explorer as a ``<div>`` and a ``<script>`` that draw it with the page's global ``Plotly``."""
        root = f"explorer-{uuid.uuid4().hex[:12]}"
        page = self.payload
        layout = json.loads(self.to_json())["layout"]
        layout.update(title={"text": html.escape(page["title"])}, autosize=True, uirevision="explorer")
        layout.pop("width", None)
        mode = ""
        if page["labels"] is not None:
            a, b = (html.escape(x) for x in page["labels"])
            mode = (f'<label>view <select class="explorer-mode"><option value="circuit">circuit {a}</option>'
                    f'<option value="compare">compare {a} with {b}</option></select></label>')
        sizes = page["sizes"]
        values = {"__ROOT__": root, "__PAYLOAD__": json_for_script(page, compact=True),
                  "__LAYOUT__": json_for_script(layout, compact=True)}
        script = re.sub("__ROOT__|__PAYLOAD__|__LAYOUT__", lambda m: values[m[0]], _EXPLORER_JS)  # one pass
        return (
            f'<div class="circuit-explorer" id="{root}" data-ready="0">'
            f'<style>{_EXPLORER_CSS}</style><div class="explorer-controls">'
            f'<label>circuit size <input type="range" class="explorer-size" min="0" max="{len(sizes) - 1}" step="1" '
            f'value="{page["start"]}"></label> <span class="explorer-size-label"></span> {mode} '
            '<button type="button" class="explorer-clear">clear highlight</button></div>'
            '<p class="explorer-status"></p><div class="explorer-plot"></div></div>'
            f"<script>{script}</script>"
        )

    def html_document(self) -> str:
        """The explorer as one offline HTML page (plotly.js inlined)."""
        from plotly.offline import get_plotlyjs

        title = html.escape(self.payload["title"])
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{title}</title><script>{get_plotlyjs()}</script></head>\n<body>"
                f"{self.html_fragment()}</body></html>\n")

    def save(self, path: str | os.PathLike) -> Path:
        """Write :meth:`html_document` to ``path`` atomically (a temporary file, then a rename); return the path."""
        return write_text_atomic(path, self.html_document())

    def _repr_html_(self) -> str:
        # srcdoc isolates the page's script and its copy of plotly.js from the notebook's own
        height = int(self.layout.height or 600) + 120
        return (f'<iframe srcdoc="{html.escape(self.html_document(), quote=True)}" '
                f'style="width:100%;height:{height}px;border:0"></iframe>')

    def _repr_mimebundle_(self, *args, **kwargs) -> dict:  # Jupyter asks for this before _repr_html_
        return {"text/html": self._repr_html_()}

    def _ipython_display_(self) -> None:
        # IPython asks for this before any _repr_: plotly's Figure would show the static figure, not the page
        from IPython.display import display

        display(self._repr_mimebundle_(), raw=True)


def circuit_explorer(
    graph: Graph,
    *,
    curve: Any = None,
    sizes: Optional[Sequence[float]] = None,
    start: Optional[float] = None,
    node_info: Optional[Mapping[Any, Mapping[str, Any]]] = None,
    edge_share: Any = None,
    compare: Optional[Graph] = None,
    labels: tuple[str, str] = ("A", "B"),
    head_roles: Optional[Mapping[Head, str]] = None,
    highlight: Sequence[Head] = (),
    signs: Optional[Graph] = None,
    select: Optional[Callable[[Tensor, int], Tensor]] = None,
    prune: bool = True,
    max_edges: int = DEFAULT_MAX_EDGES,
    title: str = "Edge circuit explorer",
    figure_title: Optional[str] = None,
) -> Explorer:
    """The explorer of ``graph``'s edge scores (see the module docstring).

    ``curve``: a faithfulness curve (``FaithfulnessCurve`` or its ``to_dict()``); f at each size comes from it, and
    its fractions are the default ``sizes`` (else :data:`MIB_SIZES`). A size of fraction x is the circuit of
    ``int(x * n_edges)`` edges, as MIB counts. ``start``: the size shown first, and drawn by the static figure (the
    size nearest to it; default: nearest to ``graph``'s own circuit when ``in_graph`` is a selection, else to 5%).
    ``node_info``: fields shown on hovering a node, keyed by node (``Head``, ``MLP``, ``'L3H1'``, ``'MLP3'``,
    ``'a3.h1'``, ``'m3'``, ``'input'``, ``'logits'``). ``edge_share``: per-edge shares (a Graph whose scores are them, or a ``[n_forward, n_backward]``
    array). ``compare``: a second scoring of the same graph; ``labels`` name the two. ``head_roles``,
    ``highlight``, ``signs``: as :func:`~circuits.show.edge_figures.edge_circuit_figure`. The circuit of n edges is
    ``select(scores, n)`` (a bool mask; given each graph's own ``scores`` tensor, so a selector that remembers its
    answers by tensor answers from memory), by default MIB's pruned top-n
    (:func:`circuits.graph_selection.mib_selector`), or the plain top-n when ``prune`` is false. At most ``max_edges``
    edges (the largest |score|) are drawn per size. ``title`` heads the page, ``figure_title`` the static figure
    (default: ``title``).
    """
    layout = graph.layout
    scores = _finite_scores(graph.scores, layout, "graph")
    fractions, points = _sizes_and_points(curve, sizes)
    if max_edges < 1:
        raise InputError(f"max_edges={max_edges}: draw at least one edge per size "
                         f"(the default is {DEFAULT_MAX_EDGES}).")
    shares = None if edge_share is None else _matrix(edge_share, layout, "edge_share")
    scores_b = None if compare is None else _compare_scores(compare, layout)
    ranking = _Ranking(scores, layout)
    rankings = {id(graph.scores): ranking}
    if scores_b is not None:
        rankings[id(compare.scores)] = ranking_b = _Ranking(scores_b, layout)
    choose = _chooser(layout, select, prune, rankings)
    counts = [int(x * layout.n_edges) for x in fractions]
    masks = [choose(graph.scores, n) & layout.real_edge_mask for n in counts]
    drawn = [ranking.first(mask, max_edges) for mask in masks]
    compared: list = [None] * len(counts)
    if scores_b is not None:
        compared = [_compare_at(ranking, ranking_b, mask, choose(compare.scores, n) & layout.real_edge_mask, max_edges)
                    for mask, n in zip(masks, counts)]
    table = torch.unique(torch.cat([*drawn, *[ranks for c in compared if c for ranks, _ in c.values()]]))
    start_index = _start_index(graph, fractions, counts, masks, start)
    page = {
        "title": title, "labels": list(labels) if scores_b is not None else None, "n_total_edges": layout.n_edges,
        "max_edges": max_edges, "start": start_index,
        "colors": dict(SHIFT_COLORS, positive=POSITIVE_COLOR, negative=NEGATIVE_COLOR),
        "nodes": _node_table(layout, head_roles, highlight, node_info), "receivers": layout.backward_names,
        "edges": _edge_table(layout, ranking.order[table], scores, signs, shares, scores_b),
        "sizes": [_size_entry(table, x, n, mask, ranks, parts, points.get(x))
                  for x, n, mask, ranks, parts in zip(fractions, counts, masks, drawn, compared)],
    }
    explorer = Explorer(_static_figure(graph, masks[start_index], head_roles, highlight, signs, figure_title or title))
    explorer._payload = page
    return explorer


def _finite_scores(scores: Tensor, layout: GraphLayout, what: str) -> Tensor:
    """``scores`` as float64 on the CPU, 0 off the real edges; non-finite scores on real edges are refused."""
    scores = torch.as_tensor(scores).detach().double().cpu()
    real = layout.real_edge_mask
    bad = real & ~torch.isfinite(scores)
    if bad.any():
        f, b = bad.nonzero()[0].tolist()
        raise InputError(f"The {what} has {int(bad.sum())} edges whose score is NaN or infinite (first: "
                         f"{layout.edge_name(f, b)}): score every edge (e.g. with patching.edges.attribute), or set "
                         "the scores of edges you did not score to 0, before exploring it.")
    return torch.where(real, scores, torch.zeros((), dtype=torch.float64))


def _matrix(value: Any, layout: GraphLayout, what: str) -> Tensor:
    """A per-edge ``[n_forward, n_backward]`` matrix from a Graph (its scores) or an array, checked and finite."""
    if isinstance(value, Graph):
        values = value.scores
    else:
        values = value if isinstance(value, Tensor) else torch.as_tensor(np.asarray(value, dtype=np.float64))
    shape = (layout.n_forward, layout.n_backward)
    if tuple(values.shape) != shape:
        raise InputError(f"{what} has shape {tuple(values.shape)}, but this graph's edges form {shape} "
                         "(n_forward, n_backward): give one value per edge of the same graph.")
    return _finite_scores(values, layout, what)


def _compare_scores(compare: Any, layout: GraphLayout) -> Tensor:
    if not isinstance(compare, Graph):
        raise InputError(f"compare must be a circuits.graph.Graph (a second scoring of the same model), got "
                         f"{type(compare).__name__}.")
    if compare.layout != layout:
        mine, theirs = layout, compare.layout
        raise InputError(f"The compared graphs have different layouts ({mine.n_layers} layers x {mine.n_heads} heads "
                         f"against {theirs.n_layers} x {theirs.n_heads}): compare two scorings of the same model.")
    return _finite_scores(compare.scores, layout, "compared graph")


def _sizes_and_points(curve: Any, sizes: Optional[Sequence[float]]) -> tuple[list[float], dict[float, dict]]:
    """The sizes (sorted fractions) and the curve's f estimate at each size it measured."""
    points: dict[float, dict] = {}
    if curve is not None:
        data = curve.to_dict() if hasattr(curve, "to_dict") else curve
        try:
            for x, point in zip(data["fractions"], data["faithfulness"], strict=True):
                points[float(x)] = {k: _number(point.get(k)) for k in ("value", "low", "high")}
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise InputError(f"A curve must have 'fractions' and 'faithfulness' estimates (value, low, high), one "
                             f"per fraction: {err}.") from None
    chosen = list(sizes) if sizes is not None else (list(points) or list(MIB_SIZES))
    bad = [x for x in chosen if isinstance(x, bool) or not (isinstance(x, numbers.Real) and 0 < x <= 1)]
    if bad or not chosen:
        raise InputError(f"Circuit sizes are fractions of the edges in (0, 1]; got {bad or 'none'}: pass e.g. "
                         "sizes=(0.01, 0.05, 0.1) for 1%, 5% and 10% of the edges.")
    fractions = sorted({float(x) for x in chosen})
    matched = {x: next((p for key, p in points.items() if math.isclose(key, x, rel_tol=1e-9)), None) for x in fractions}
    return fractions, {x: p for x, p in matched.items() if p is not None}


def _number(value: Any) -> Optional[float]:
    """A finite float, or None (JSON has no NaN; results.json holds a missing interval as null)."""
    return float(value) if isinstance(value, numbers.Real) and math.isfinite(value) else None


class _Ranking:
    """Every real edge by |score|, largest first (ties in index order, as the selections break them)."""

    def __init__(self, scores: Tensor, layout: GraphLayout):
        real = layout.real_edge_mask.flatten()
        magnitude = torch.where(real, scores.abs().flatten(), torch.tensor(-1.0, dtype=torch.float64))
        self.order = torch.argsort(magnitude, descending=True, stable=True)[: layout.n_edges]
        self.rank_of = torch.full((real.numel(),), -1, dtype=torch.long)
        self.rank_of[self.order] = torch.arange(layout.n_edges)

    def ranks(self, mask: Tensor) -> Tensor:
        """The ranks of the edges of ``mask``, ascending."""
        return torch.sort(self.rank_of[mask.flatten().nonzero().flatten()]).values

    def first(self, mask: Tensor, k: int) -> Tensor:
        """The ranks of ``mask``'s ``k`` edges of largest |score|."""
        return self.ranks(mask)[:k]


def _chooser(layout: GraphLayout, select, prune: bool,
             rankings: Mapping[int, _Ranking]) -> Callable[[Tensor, int], Tensor]:
    """``(scores, n) -> mask`` of the circuit of n edges; ``scores`` is a graph's own tensor, ``rankings`` its
    ranking by the tensor's ``id``."""
    if select is not None:
        return lambda scores, n: torch.as_tensor(select(scores, n)).bool().cpu()
    if prune:
        return mib_selector(layout)

    def top_n(scores: Tensor, n: int) -> Tensor:
        mask = torch.zeros(layout.n_forward * layout.n_backward, dtype=torch.bool)
        mask[rankings[id(scores)].order[:n]] = True
        return mask.view(layout.n_forward, layout.n_backward)

    return top_n


def _compare_at(ranking: _Ranking, ranking_b: _Ranking, a: Tensor, b: Tensor, max_edges: int) -> dict:
    """``{"both" | "only_a" | "only_b": (ranks under ``ranking`` of the drawn edges, count)}``: the drawn edges of
    each kind are its largest (by its own graph's |score|), at most ``max_edges`` over the three, shared in proportion
    to the counts."""
    kinds = {"both": (a & b, ranking), "only_a": (a & ~b, ranking), "only_b": (~a & b, ranking_b)}
    counts = [int(mask.sum()) for mask, _ in kinds.values()]
    out = {}
    for (kind, (mask, own)), count, cap in zip(kinds.items(), counts, _shares_of(max_edges, counts)):
        own_ranks = own.first(mask, cap)
        out[kind] = (torch.sort(ranking.rank_of[own.order[own_ranks]]).values, count)
    return out


def _shares_of(budget: int, counts: list[int]) -> list[int]:
    """``counts`` cut to ``budget`` in all, each in proportion (largest remainders round up)."""
    total = sum(counts)
    if total <= budget:
        return counts
    exact = [budget * c / total for c in counts]
    caps = [int(x) for x in exact]
    for i in sorted(range(len(counts)), key=lambda i: caps[i] - exact[i])[: budget - sum(caps)]:
        caps[i] += 1
    return caps


def _rows(table: Tensor, ranks: Tensor) -> list[int]:
    """Positions in the edge table (sorted ranks) of the edges of rank ``ranks``."""
    return torch.searchsorted(table, ranks).tolist()


def _size_entry(table: Tensor, fraction: float, n: int, mask: Tensor, drawn: Tensor, parts: Optional[dict],
                point: Optional[dict]) -> dict:
    """One size of the page: its n, the circuit's edge count after selection, the table rows to draw, f, and in
    compare mode each kind's rows and count."""
    compared = None if parts is None else {kind: {"rows": _rows(table, ranks), "count": count}
                                           for kind, (ranks, count) in parts.items()}
    return {"fraction": fraction, "n": n, "n_circuit": int(mask.sum()), "drawn": _rows(table, drawn), "f": point,
            "compare": compared}


def _start_index(graph: Graph, fractions: list[float], counts: list[int], masks: list[Tensor],
                 start: Optional[float]) -> int:
    """The size shown first (see :func:`circuit_explorer`); a start with an empty circuit moves to the next one."""
    selected = graph.n_edges_in_graph
    if start is None and 0 < selected < graph.n_edges:
        index = min(range(len(counts)), key=lambda i: abs(math.log(max(counts[i], 1) / selected)))
    else:
        target = 0.05 if start is None else start
        if not 0 < target <= 1:
            raise InputError(f"start={start} is not a fraction of the edges in (0, 1]: pass one of the sizes.")
        index = min(range(len(fractions)), key=lambda i: abs(math.log(fractions[i] / target)))
    non_empty = [i for i, m in enumerate(masks) if m.any()]
    if not non_empty:
        raise InputError("No size holds an edge (every circuit is empty): choose larger sizes, or a graph whose "
                         "scores select edges.")
    return next((i for i in non_empty if i >= index), non_empty[-1])


def _node_key(key: Any, layout: GraphLayout) -> str:
    """A node named any way the toolkit names it, as the graph names it (``a3.h1``, ``m3``, ``input``, ``logits``)."""
    if isinstance(key, Head):
        name = f"a{key.layer}.h{key.head}"
    elif isinstance(key, MLP):
        name = f"m{key.layer}"
    else:
        text = str(key)
        head, mlp = re.fullmatch(r"L(\d+)H(\d+)", text), re.fullmatch(r"MLP ?(\d+)", text)
        name = f"a{head[1]}.h{head[2]}" if head else f"m{mlp[1]}" if mlp else text
    if name != "logits" and name not in layout.forward_names:
        raise InputError(f"node_info names {key!r}, which is not a node of this graph ({layout.n_layers} layers x "
                         f"{layout.n_heads} heads): key it by Head, MLP, 'L3H1', 'MLP3', 'a3.h1', 'm3', 'input' or "
                         "'logits'.")
    return name


def _label(name: str) -> str:
    if name.startswith("a"):
        layer, head = name[1:].split(".h")
        return f"L{layer}H{head}"  # the report's one naming of heads
    return f"MLP {name[1:]}" if name.startswith("m") and name != "logits" else name


def _field(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_field(v)}" for k, v in value.items())
    return str(value)


def _node_table(layout: GraphLayout, head_roles, highlight, node_info) -> dict:
    """Per node (the senders, then ``logits``): name, label, position, legend group, colour, symbol, ring, hover."""
    roles = {f"a{h.layer}.h{h.head}": label for h, label in (head_roles or {}).items()}
    ringed = {f"a{h.layer}.h{h.head}" for h in highlight}
    info = {_node_key(k, layout): v for k, v in (node_info or {}).items()}
    pos = node_positions(layout)
    table: dict[str, list] = {k: [] for k in ("name", "label", "x", "y", "group", "color", "symbol", "ring", "hover")}
    for name in [*layout.forward_names, "logits"]:
        if name.startswith("a"):
            role = roles.get(name, "other")
            group, color, symbol = (f"{role} heads" if head_roles else "heads"), CLASS_COLORS[role], "circle"
        elif name.startswith("m") and name != "logits":
            group, color, symbol = "MLPs", MLP_COLOR, "square"
        else:
            group, color, symbol = name, LOGITS_COLOR, "circle-open" if name == "input" else "diamond"
        fields = ({"attention-read class": roles[name]} if name in roles else {}) | dict(info.get(name, {}))
        lines = [f"<b>{_label(name)}</b> ({name})"] + [f"{html.escape(str(k))}: {html.escape(_field(v))}"
                                                       for k, v in fields.items()]
        for key, value in zip(table, (name, _label(name), *pos[name], group, color, symbol, name in ringed,
                                      "<br>".join(lines))):
            table[key].append(value)
    return table


def _edge_table(layout: GraphLayout, flat: Tensor, scores: Tensor, signs: Optional[Graph], shares: Optional[Tensor],
                scores_b: Optional[Tensor]) -> dict:
    """Per drawable edge (flat indices ``flat``, by |score|): sender and receiver node rows, receiver index, score,
    sign, width level (0 to WIDTH_BINS - 1 over the table's |score| range), and share and second score if given."""
    senders, receivers = flat // layout.n_backward, flat % layout.n_backward
    owner = layout.receiver_owner()[receivers]
    owner = torch.where(owner < 0, layout.n_forward, owner)  # the logits are the row after the senders
    values = scores.flatten()[flat]
    sign_of = _matrix(signs, layout, "signs").flatten()[flat] if signs is not None else values
    magnitude = values.abs()
    low = float(magnitude.min()) if magnitude.numel() else 0.0
    span = (float(magnitude.max()) - low) if magnitude.numel() else 0.0
    level = ((WIDTH_BINS * (magnitude - low) / (span or 1.0)).long().clamp(max=WIDTH_BINS - 1))
    table = {"src": senders.tolist(), "dst": owner.tolist(), "recv": receivers.tolist(),
             "score": [float(f"{v:.4g}") for v in values.tolist()], "positive": (sign_of >= 0).tolist(),
             "level": level.tolist()}
    if shares is not None:
        table["share"] = [round(v, 4) for v in shares.flatten()[flat].tolist()]
    if scores_b is not None:
        table["score_b"] = [float(f"{v:.4g}") for v in scores_b.flatten()[flat].tolist()]
    return table


def _static_figure(graph: Graph, mask: Tensor, head_roles, highlight, signs, title) -> go.Figure:
    """:func:`edge_circuit_figure` of the circuit at the start size: what the explorer is as a plain figure."""
    circuit = Graph(graph.layout, graph.scores, in_graph=mask, meta=dict(graph.meta))
    return edge_circuit_figure(circuit, head_roles, max_edges=STATIC_EDGES, title=title, highlight=highlight,
                               signs=signs)


_EXPLORER_CSS = """
.circuit-explorer { margin: 1em 0; }
.explorer-controls { display: flex; flex-wrap: wrap; gap: .6em; align-items: center; font-size: .95em; }
.explorer-size { width: 16em; vertical-align: middle; }
.explorer-status { color: #333; font-size: .9em; margin: .4em 0; }
.explorer-plot { width: 100%; }
"""

# Glue over plotly.js: every trace comes from the payload's precomputed rows; nothing is laid out here.
_EXPLORER_JS = r"""
(function () {
  "use strict";
  var P = __PAYLOAD__, LAYOUT = __LAYOUT__, N = P.nodes, E = P.edges;
  var root = document.getElementById("__ROOT__"), gd = root.querySelector(".explorer-plot");
  var slider = root.querySelector(".explorer-size"), sizeLabel = root.querySelector(".explorer-size-label");
  var status = root.querySelector(".explorer-status"), modeSelect = root.querySelector(".explorer-mode");
  var LOGITS = N.name.length - 1, MAX_LABELS = 200;  // more labels than this overlap into a grey band
  var CONFIG = {responsive: true, displaylogo: false,
                toImageButtonOptions: {format: "svg", filename: "edge-circuit", scale: 1}};
  var state = {size: P.start, mode: "circuit", focus: null};

  function percent(x) { return (+(100 * x).toPrecision(3)) + "%"; }
  function fmt(v) { return v === null || v === undefined ? "n/a" : v.toFixed(3); }

  function groups() {  // the drawn edges as [{rows, color, width, name}], one line trace each
    var size = P.sizes[state.size], out = [];
    if (state.mode === "compare") {
      [["both", "kept", "in both"], ["only_a", "lost", "only in " + P.labels[0]],
       ["only_b", "gained", "only in " + P.labels[1]]].forEach(function (k) {
        var part = size.compare[k[0]];
        out.push({rows: part.rows, color: P.colors[k[1]], width: 1.5, name: k[2] + " (" + part.count + ")"});
      });
      return out;
    }
    var bins = {};
    size.drawn.forEach(function (i) {
      var key = (E.positive[i] ? "p" : "n") + E.level[i];
      (bins[key] = bins[key] || []).push(i);
    });
    Object.keys(bins).sort().forEach(function (key) {
      var positive = key[0] === "p";
      out.push({rows: bins[key], color: positive ? P.colors.positive : P.colors.negative,
                width: 0.8 + 1.8 * (+key.slice(1)), name: positive ? "positive score" : "negative score"});
    });
    return out;
  }

  function pathsToLogits(rows, from) {  // drawn edges on some path from node `from` to the logits
    var down = {}, up = {}, changed = true;
    down[from] = true;
    while (changed) {
      changed = false;
      rows.forEach(function (i) { if (down[E.src[i]] && !down[E.dst[i]]) { down[E.dst[i]] = changed = true; } });
    }
    up[LOGITS] = changed = true;
    while (changed) {
      changed = false;
      rows.forEach(function (i) { if (up[E.dst[i]] && !up[E.src[i]]) { up[E.src[i]] = changed = true; } });
    }
    return rows.filter(function (i) { return down[E.src[i]] && up[E.dst[i]]; });
  }

  function lines(rows) {
    var x = [], y = [];
    rows.forEach(function (i) {
      x.push(N.x[E.src[i]], N.x[E.dst[i]], null);
      y.push(N.y[E.src[i]], N.y[E.dst[i]], null);
    });
    return {x: x, y: y};
  }

  function edgeHover(i) {
    var text = N.name[E.src[i]] + "->" + P.receivers[E.recv[i]] + "<br>score " + E.score[i];
    if (E.score_b) { text += " (" + P.labels[0] + "), " + E.score_b[i] + " (" + P.labels[1] + ")"; }
    if (E.share) { text += "<br>share of runs keeping it: " + E.share[i]; }
    return text;
  }

  function ringed(node) { return N.ring[node] || node === state.focus; }

  function nodeTraces(rows) {  // the nodes the drawn edges touch (and always input and logits), one trace per group
    var touched = {}, byGroup = {}, order = [];
    touched[0] = touched[LOGITS] = true;
    rows.forEach(function (i) { touched[E.src[i]] = touched[E.dst[i]] = true; });
    Object.keys(touched).map(Number).sort(function (a, b) { return a - b; }).forEach(function (i) {
      if (!byGroup[N.group[i]]) { byGroup[N.group[i]] = []; order.push(N.group[i]); }
      byGroup[N.group[i]].push(i);
    });
    var mode = Object.keys(touched).length <= MAX_LABELS ? "markers+text" : "markers";  // hover still names them
    return order.map(function (group) {
      var ids = byGroup[group], pick = function (f) { return ids.map(f); };
      return {type: "scatter", mode: mode, meta: "nodes", name: group, customdata: ids, cliponaxis: false,
              x: pick(function (i) { return N.x[i]; }), y: pick(function (i) { return N.y[i]; }),
              text: pick(function (i) { return N.label[i]; }), hovertext: pick(function (i) { return N.hover[i]; }),
              hovertemplate: "%{hovertext}<extra></extra>",
              textposition: pick(function (i) { return N.group[i] === "MLPs" ? "bottom center" : "top center"; }),
              marker: {size: pick(function (i) { return i === 0 || i === LOGITS ? 22 : 16; }),
                       color: pick(function (i) { return N.color[i]; }),
                       symbol: pick(function (i) { return N.symbol[i]; }),
                       line: {width: pick(function (i) { return ringed(i) ? 3.5 : 1; }),
                              color: pick(function (i) { return ringed(i) ? "black" : "white"; })}}};
    });
  }

  function traces(gs, rows) {
    var focus = state.focus === null ? null : pathsToLogits(rows, state.focus), out = [], seen = {};
    var dim = focus !== null && focus.length > 0;  // a node with no drawn path to the logits fades nothing
    gs.forEach(function (g) {
      var xy = lines(g.rows);
      out.push({type: "scatter", mode: "lines", meta: "edges", x: xy.x, y: xy.y, hoverinfo: "skip", name: g.name,
                legendgroup: g.name, showlegend: !seen[g.name], opacity: dim ? 0.15 : 0.6,
                line: {color: g.color, width: g.width}});
      seen[g.name] = true;
    });
    if (dim) {
      var xy = lines(focus);
      out.push({type: "scatter", mode: "lines", meta: "focus", x: xy.x, y: xy.y, hoverinfo: "skip",
                name: "paths of " + N.label[state.focus] + " to the logits (" + focus.length + " edges)",
                line: {color: "#111111", width: 3}});
    }
    out.push({type: "scatter", mode: "markers", meta: "edge-hover", showlegend: false, marker: {size: 6, opacity: 0},
              x: rows.map(function (i) { return (N.x[E.src[i]] + N.x[E.dst[i]]) / 2; }),
              y: rows.map(function (i) { return (N.y[E.src[i]] + N.y[E.dst[i]]) / 2; }),
              hovertext: rows.map(edgeHover), hovertemplate: "%{hovertext}<extra></extra>"});
    return out.concat(nodeTraces(rows));
  }

  function describe(rows) {
    var size = P.sizes[state.size], text = percent(size.fraction) + " of the " + P.n_total_edges + " edges: ", total;
    if (state.mode === "compare") {
      var c = size.compare;
      total = c.both.count + c.only_a.count + c.only_b.count;
      text += c.both.count + " in both circuits, " + c.only_a.count + " only in " + P.labels[0] + ", " +
              c.only_b.count + " only in " + P.labels[1];
    } else {
      total = size.n_circuit;
      text += total + " edges in the circuit";
      if (total !== size.n) { text += " (" + size.n + " selected, then pruned to paths from input to logits)"; }
    }
    text += "; " + rows.length + " drawn, " + (total - rows.length) + " hidden";
    if (total > rows.length) { text += " (those of smallest |score|; a larger max_edges draws them)"; }
    text += ". " + (size.f ? "f = " + fmt(size.f.value) + " [" + fmt(size.f.low) + ", " + fmt(size.f.high) +
                             "] (95% interval)" : "f not measured at this size") + ".";
    if (state.focus !== null) {
      var paths = pathsToLogits(rows, state.focus).length;
      text += " Highlighted: the paths of " + N.label[state.focus] + " to the logits (" + paths + " drawn edges).";
    }
    return text;
  }

  function render() {
    var gs = groups(), rows = [].concat.apply([], gs.map(function (g) { return g.rows; }));
    sizeLabel.textContent = percent(P.sizes[state.size].fraction) + " of the edges";
    status.textContent = describe(rows);
    root.dataset.drawnEdges = rows.length;
    return Plotly.react(gd, traces(gs, rows), LAYOUT, CONFIG).then(function () {
      root.dataset.rendered = state.mode + ":" + state.size + ":" + state.focus;
    });
  }

  function focus(node) { state.focus = state.focus === node ? null : node; return render(); }

  slider.addEventListener("input", function () { state.size = +slider.value; render(); });
  if (modeSelect) { modeSelect.addEventListener("change", function () { state.mode = modeSelect.value; render(); }); }
  root.querySelector(".explorer-clear").addEventListener("click", function () { state.focus = null; render(); });
  root.explorer = {state: state, payload: P, render: render, focus: focus};
  render().then(function () {
    gd.on("plotly_click", function (event) {
      var point = event.points[0];
      if (point.data.meta === "nodes") { focus(point.customdata); }
    });
    root.dataset.ready = "1";
  });
})();
"""
