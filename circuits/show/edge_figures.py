"""Figures of edge circuits (plotly, offline): the circuit as a layered graph, and its faithfulness curve.

* :func:`edge_circuit_figure` draws the edges of a :class:`~circuits.graph.Graph` that are in the
  circuit (``in_graph``): nodes by layer on the x axis (heads at their head index, MLPs on a row
  below, ``input`` at the left, ``logits`` at the right), each edge a line whose width grows with
  ``|score|`` (blue: positive score, red: negative). Heads are coloured by their attention-read
  class when ``head_roles`` is given (:func:`circuits.analyze.attention.classify_heads`), as in
  :func:`circuits.show.node_circuit.circuit_figure`; ``highlight`` rings chosen heads (e.g. key heads). Edges into a head's q, k and v inputs all end at
  the head; the hover text names the input.
* :func:`faithfulness_figure` draws one or more faithfulness curves (f against the fraction of
  edges kept, log x) with their 95% interval bands, the f = 1 line of the full model and an
  optional threshold line (e.g. 0.8).

:func:`family_transfer_figure` draws the circuits of several prompt families evaluated on each other (f with
its interval, and the circuits' edge Jaccard) as two heatmaps.

They take plain data (a Graph; a curve's ``to_dict()`` or an object with ``fractions`` and
``faithfulness`` estimates), so ``circuits`` needs nothing from ``patching``.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import numpy as np
import plotly.graph_objects as go

from circuits.analyze.attention import CLASS_COLORS
from circuits.show.node_circuit import LOGITS_COLOR, MLP_COLOR
from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import nodes_in_graph
from circuits.nodes import Head

__all__ = ["circuit_shift_figure", "edge_circuit_figure", "faithfulness_figure", "family_transfer_figure", "node_positions"]

POSITIVE_COLOR, NEGATIVE_COLOR = "#1f77b4", "#d62728"
_WIDTH_BINS = 5


def _receiver_owner_name(layout: GraphLayout, backward: int) -> tuple[str, str]:
    """(node name, input label) of a receiver: ``('a3.h1', 'q')``, ``('m2', '')`` or ``('logits', '')``."""
    name = layout.backward_names[backward]
    if "<" in name:
        node, qkv = name[:-1].split("<")
        return node, qkv
    return name, ""


def node_positions(layout: GraphLayout) -> dict[str, tuple[float, float]]:
    """Where each node is drawn: heads at (layer, head index), MLPs on a row below, ``input`` left, ``logits`` right."""
    mlp_y = -1.5
    pos = {"input": (-1.0, (layout.n_heads - 1) / 2), "logits": (layout.n_layers, (layout.n_heads - 1) / 2)}
    for layer in range(layout.n_layers):
        for head in range(layout.n_heads):
            pos[f"a{layer}.h{head}"] = (layer, head)
        pos[f"m{layer}"] = (layer + 0.4, mlp_y)
    return pos


def edge_circuit_figure(
    graph: Graph,
    head_roles: Optional[Mapping[Head, str]] = None,
    *,
    max_edges: int = 300,
    title: str = "Edge circuit",
    highlight: Sequence[Head] = (),
    signs: Optional[Graph] = None,
) -> go.Figure:
    """The circuit's edges as a layered graph; at most ``max_edges`` edges (the largest |score|) are drawn.

    ``highlight``: heads drawn with a thick black ring (e.g. the key heads of path patching). ``signs``: scores of
    the same graph whose sign colours each edge (e.g. the signed attribution a learned circuit started from, whose
    own scores are all >= 0); by default the circuit's own scores' sign.
    """
    layout = graph.layout
    edges = (graph.in_graph & layout.real_edge_mask).cpu()
    if not edges.any():
        raise InputError("The graph has no edge in the circuit: select one first (circuits.graph_selection.select_top_n, ...).")
    scores = _dense_scores(graph.scores)
    sign_of = _dense_scores(signs.scores) if signs is not None else scores
    pairs = edges.nonzero().tolist()
    pairs.sort(key=lambda p: -abs(scores[p[0], p[1]]))
    pairs = pairs[:max_edges]
    pos = node_positions(layout)
    fig = go.Figure()
    _draw_edges(fig, layout, pos, pairs, scores, sign_of)
    shown = {layout.forward_names[f] for f, b in pairs} | {_receiver_owner_name(layout, b)[0] for f, b in pairs}
    _draw_nodes(fig, layout, pos, shown, head_roles, highlight)
    subtitle = (f"{len(pairs)} of {int(edges.sum())} circuit edges drawn; {sum(nodes_in_graph(graph).tolist())} "
                "nodes; width grows with |score|; colour: the sign of "
                f"{'the warm-start attribution' if signs is not None else 'the score'} (red: negative, corrupting the "
                "edge lowers the answer logit; blue: positive)")
    fig.update_xaxes(title_text="layer", range=[-1.8, layout.n_layers + 1.2], dtick=1, zeroline=False)
    fig.update_yaxes(tickvals=[-1.5, *range(layout.n_heads)], ticktext=["MLP", *[f"H{h}" for h in range(layout.n_heads)]],
                     range=[-2.5, layout.n_heads], zeroline=False)
    fig.update_layout(title=f"{title}<br><sup>{subtitle}</sup>", height=max(360, 60 * layout.n_heads + 240),
                      plot_bgcolor="white")
    return fig


def _draw_edges(fig: go.Figure, layout: GraphLayout, pos: dict, pairs: list, scores, sign_of) -> None:
    """The edges ``pairs`` as lines, one trace per (sign, width bin), their widths spanning the drawn edges' range
    of |score|; and an invisible marker at each edge's midpoint that carries its hover text."""
    magnitudes = [abs(float(scores[f, b])) for f, b in pairs]
    low, span = min(magnitudes), (max(magnitudes) - min(magnitudes)) or 1.0
    buckets: dict[tuple[bool, int], list] = {}
    for f, b in pairs:
        s = float(scores[f, b])
        level = min(_WIDTH_BINS - 1, int(_WIDTH_BINS * (abs(s) - low) / span))
        buckets.setdefault((float(sign_of[f, b]) >= 0, level), []).append((f, b))
    for (positive, level), group in sorted(buckets.items()):
        xs, ys = [], []
        for f, b in group:
            target, _ = _receiver_owner_name(layout, b)
            (x0, y0), (x1, y1) = pos[layout.forward_names[f]], pos[target]
            xs += [x0, x1, None]
            ys += [y0, y1, None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False, opacity=0.6,
                                 line=dict(width=0.8 + 1.8 * level, color=POSITIVE_COLOR if positive else NEGATIVE_COLOR)))
    mids = [((pos[layout.forward_names[f]][0] + pos[_receiver_owner_name(layout, b)[0]][0]) / 2,
             (pos[layout.forward_names[f]][1] + pos[_receiver_owner_name(layout, b)[0]][1]) / 2,
             f"{layout.edge_name(f, b)}: {scores[f, b]:.4g}") for f, b in pairs]
    fig.add_trace(go.Scatter(x=[m[0] for m in mids], y=[m[1] for m in mids], mode="markers", text=[m[2] for m in mids],
                             marker=dict(size=6, opacity=0), hovertemplate="%{text}<extra></extra>", showlegend=False))


def _draw_nodes(fig: go.Figure, layout: GraphLayout, pos: dict, shown: set, head_roles, highlight) -> None:
    """The nodes the drawn edges touch: heads coloured by their attention-read class (``highlight`` ringed in
    black), MLPs as squares, then the input and the logits, every label kept whole near the axes' ends."""
    roles = {f"a{h.layer}.h{h.head}": label for h, label in (head_roles or {}).items()}
    heads = [n for n in layout.forward_names if n.startswith("a") and n in shown]
    ringed = {f"a{h.layer}.h{h.head}" for h in highlight}
    for label in ("operand", "operator", "other"):
        group = [n for n in heads if roles.get(n, "other") == label]
        if group:
            fig.add_trace(go.Scatter(
                x=[pos[n][0] for n in group], y=[pos[n][1] for n in group], mode="markers+text",
                text=[_head_label(n) for n in group],  # the report's one naming of heads (L10H0), not the graph's a10.h0
                textposition="top center", name=f"{label} heads" if head_roles else "heads",
                marker=dict(size=16, color=CLASS_COLORS[label],
                            line=dict(width=[3.5 if n in ringed else 1 for n in group],
                                      color=["black" if n in ringed else "white" for n in group]))))
    mlps = [n for n in layout.forward_names if n.startswith("m") and n in shown]
    if mlps:
        fig.add_trace(go.Scatter(x=[pos[n][0] for n in mlps], y=[pos[n][1] for n in mlps], mode="markers+text",
                                 text=[f"MLP {n[1:]}" for n in mlps], textposition="bottom center", name="MLPs",
                                 marker=dict(size=16, color=MLP_COLOR, symbol="square")))
    for name, symbol in (("input", "circle-open"), ("logits", "diamond")):
        # labels above the end nodes: a label beside them ran past the plot's edge and was cut off
        fig.add_trace(go.Scatter(x=[pos[name][0]], y=[pos[name][1]], mode="markers+text", text=[name],
                                 textposition="top center", name=name,
                                 marker=dict(size=22, color=LOGITS_COLOR, symbol=symbol)))
    fig.update_traces(cliponaxis=False, selector=dict(mode="markers+text"))  # labels near the axes' ends stay whole


def _head_label(node: str) -> str:
    """``a10.h0`` (the EAP-IG graph's node name) as ``L10H0`` (how :class:`circuits.nodes.Head` prints)."""
    layer, head = node[1:].split(".h")
    return f"L{layer}H{head}"


def _dense_scores(scores) -> np.ndarray:
    """Scores as a float64 array (NaN, i.e. no edge, as 0)."""
    return np.nan_to_num(scores.detach().double().cpu().numpy())


def _curve_points(curve) -> tuple[list[float], list[float], list[float], list[float]]:
    data = curve.to_dict() if hasattr(curve, "to_dict") else curve
    try:
        xs = [100 * float(x) for x in data["fractions"]]
        points = data["faithfulness"]
        values = [float(p["value"]) for p in points]
        lows = [float(p.get("low", p["value"])) for p in points]
        highs = [float(p.get("high", p["value"])) for p in points]
    except (KeyError, TypeError) as err:
        raise InputError(f"A curve must have 'fractions' and 'faithfulness' estimates (value, low, high): {err}.") from None
    return xs, values, lows, highs


def faithfulness_figure(
    curves: Union[object, Sequence[tuple[str, object]]],
    *,
    threshold: Optional[float] = 0.8,
    title: str = "Faithfulness of the top-scored edges",
) -> go.Figure:
    """Faithfulness f against % of edges kept (log x), each curve with its interval band.

    ``curves``: one curve (``FaithfulnessCurve`` or its ``to_dict()``), or ``[(label, curve), ...]``.
    """
    labelled = curves if isinstance(curves, (list, tuple)) else [("circuit", curves)]
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#d62728", "#e377c2", "#7f7f7f", "#bcbd22",
               "#17becf", "#393b79", "#637939"]
    fig = go.Figure()
    for i, (label, curve) in enumerate(labelled):
        xs, values, lows, highs = _curve_points(curve)
        color = palette[i % len(palette)]
        fig.add_trace(go.Scatter(x=xs + xs[::-1], y=highs + lows[::-1], fill="toself", fillcolor=color, opacity=0.2,
                                 line=dict(width=0), hoverinfo="skip", name=f"{label} 95% interval"))
        fig.add_trace(go.Scatter(x=xs, y=values, mode="lines+markers", name=label, line=dict(color=color),
                                 customdata=np.stack([lows, highs], axis=1),
                                 hovertemplate="%{x:.2g}% of edges: f = %{y:.3f} [%{customdata[0]:.3f}, "
                                               "%{customdata[1]:.3f}]<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#555555", dash="dash"), annotation_text="full model")
    if threshold is not None:
        fig.add_hline(y=threshold, line=dict(color="#999999", dash="dot"), annotation_text=f"f = {threshold:g}")
    fig.update_xaxes(type="log", title_text="% of edges kept")
    fig.update_yaxes(title_text="faithfulness f")
    fig.update_layout(title=title, plot_bgcolor="white", height=420)
    return fig



SHIFT_COLORS = {"kept": "#7f7f7f", "gained": "#2ca02c", "lost": "#d62728"}


def circuit_shift_figure(layout: GraphLayout, reference: "np.ndarray | object", changed: "np.ndarray | object", *,
                         max_edges: int = 300, title: str = "The circuit before and after") -> go.Figure:
    """Edges of two circuits of one graph coloured kept (grey), gained (green) or lost (red).

    ``reference`` and ``changed`` are bool masks ``[n_forward, n_backward]`` (tensors or arrays); at most
    ``max_edges`` edges are drawn per colour.
    """
    ref = np.asarray(getattr(reference, "cpu", lambda: reference)(), dtype=bool) & layout.real_edge_mask.numpy()
    new = np.asarray(getattr(changed, "cpu", lambda: changed)(), dtype=bool) & layout.real_edge_mask.numpy()
    status = {"kept": ref & new, "gained": ~ref & new, "lost": ref & ~new}
    pos = node_positions(layout)
    fig = go.Figure()
    shown: set[str] = set()
    for label, mask in status.items():
        pairs = np.argwhere(mask)[:max_edges].tolist()
        xs, ys = [], []
        for f, b in pairs:
            sender, (target, _) = layout.forward_names[f], _receiver_owner_name(layout, b)
            (x0, y0), (x1, y1) = pos[sender], pos[target]
            xs += [x0, x1, None]
            ys += [y0, y1, None]
            shown |= {sender, target}
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"{label} ({int(mask.sum())} edges)", opacity=0.6,
                                 line=dict(width=1.5, color=SHIFT_COLORS[label]), hoverinfo="skip"))
    nodes = [n for n in pos if n in shown]
    fig.add_trace(go.Scatter(x=[pos[n][0] for n in nodes], y=[pos[n][1] for n in nodes], mode="markers+text", text=nodes,
                             textposition="top center", name="nodes", showlegend=False,
                             marker=dict(size=12, color=[MLP_COLOR if n.startswith("m") else LOGITS_COLOR for n in nodes])))
    fig.update_traces(cliponaxis=False, selector=dict(mode="markers+text"))
    fig.update_xaxes(title_text="layer", range=[-1.8, layout.n_layers + 1.2], dtick=1, zeroline=False)
    fig.update_yaxes(tickvals=[-1.5, *range(layout.n_heads)], ticktext=["MLP", *[f"H{h}" for h in range(layout.n_heads)]],
                     range=[-2.5, layout.n_heads], zeroline=False)
    fig.update_layout(title=title, height=max(360, 60 * layout.n_heads + 240), plot_bgcolor="white")
    return fig


def family_transfer_figure(entry: Mapping, *, title: Optional[str] = None) -> go.Figure:
    """Two heatmaps from a ``FamilyCircuits.to_dict()`` (:mod:`patching.edges.families`): f of each family's circuit
    (rows) on each family's held-out prompts (columns), its 95% interval in the hover text, and the edge Jaccard of
    the families' circuits."""
    from plotly.subplots import make_subplots

    families = list(entry["families"])
    f = [[entry["f"][a][b] for b in families] for a in families]
    jaccard = [[entry["jaccard"][a][b] for b in families] for a in families]
    size = f"{100 * entry['fraction']:g}%"
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.18, subplot_titles=(
        f"f of the circuit at {size} of the edges", f"edge Jaccard of the circuits at {size}"))
    fig.add_trace(go.Heatmap(
        z=[[e["value"] for e in row] for row in f], x=families, y=families, colorscale="RdBu", zmid=0.0,
        text=[[f"{e['value']:.2f}" for e in row] for row in f], texttemplate="%{text}",
        customdata=[[[e["low"], e["high"]] for e in row] for row in f], colorbar=dict(x=0.41, title="f"),
        hovertemplate="circuit of %{y} on %{x}: f = %{z:.3f} [%{customdata[0]:.3f}, %{customdata[1]:.3f}]"
                      "<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Heatmap(
        z=jaccard, x=families, y=families, colorscale="Greens", zmin=0, zmax=1, colorbar=dict(title="Jaccard"),
        text=[[f"{v:.2f}" for v in row] for row in jaccard], texttemplate="%{text}",
        hovertemplate="circuits of %{y} and %{x}: Jaccard %{z:.3f}<extra></extra>"), row=1, col=2)
    fig.update_xaxes(title_text="prompts of", row=1, col=1)
    fig.update_yaxes(title_text="circuit of", autorange="reversed", row=1, col=1)
    fig.update_xaxes(title_text="circuit of", row=1, col=2)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    fig.update_layout(title=title or f"Circuits ({entry['method']}) across prompt families", height=460, width=1000,
                      plot_bgcolor="white")
    return fig
