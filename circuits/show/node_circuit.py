"""The circuit as a layered graph: key heads -> key MLPs -> logits (plotly, no graphviz).

Inputs are plain numbers, so any method that scores nodes can be drawn (path
patching, activation patching, attribution): a ``[n_layers, n_heads]`` head
effect map and an ``[n_layers]`` MLP effect vector (tensors, arrays or dicts
keyed by :class:`~circuits.nodes.Head` / :class:`~circuits.nodes.MLP`), plus
optional head roles from :func:`circuits.analyze.attention.classify_heads`.

Nodes are placed by layer on the x axis (heads at their head index, MLPs on a
row below, the logits at the right). The ``top_heads`` heads and ``top_mlps``
MLPs with the largest effect are drawn, ranked by ``|effect|`` (``rank_by="abs"``)
or by the most negative effect (``"negative"``: path patching reports the drop
of the answer logit when a node is corrupted, so important nodes are negative).
Edges go from each key head to every key MLP in a later layer and to the
logits, and from each key MLP to the logits: a reading aid for how information
can flow through the residual stream, not a measured edge weight.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import plotly.graph_objects as go

from circuits.analyze.attention import CLASS_COLORS
from circuits.errors import InputError
from circuits.nodes import MLP, Head

MLP_COLOR = "#1f77b4"
LOGITS_COLOR = "#111111"


def _to_numpy(values):
    return values.detach().float().cpu().numpy() if hasattr(values, "detach") else values


def _as_head_grid(head_effects) -> np.ndarray:
    if isinstance(head_effects, Mapping):
        if not head_effects:
            raise InputError("head_effects is empty.")
        n_layers = max(h.layer for h in head_effects) + 1
        n_heads = max(h.head for h in head_effects) + 1
        grid = np.full((n_layers, n_heads), np.nan)
        for h, v in head_effects.items():
            grid[h.layer, h.head] = float(v)
        return grid
    grid = np.asarray(_to_numpy(head_effects), dtype=float)
    if grid.ndim != 2:
        raise InputError(f"head_effects must be a [n_layers, n_heads] array or a dict of Head -> effect, got shape {grid.shape}.")
    return grid


def _as_mlp_vector(mlp_effects, n_layers: int) -> np.ndarray:
    if mlp_effects is None:
        return np.full(n_layers, np.nan)
    if isinstance(mlp_effects, Mapping):
        vec = np.full(n_layers, np.nan)
        for m, v in mlp_effects.items():
            vec[m.layer if isinstance(m, MLP) else int(m)] = float(v)
        return vec
    vec = np.asarray(_to_numpy(mlp_effects), dtype=float).reshape(-1)
    if vec.shape[0] != n_layers:
        raise InputError(f"mlp_effects has {vec.shape[0]} entries but head_effects has {n_layers} layers.")
    return vec


def _rank_key(values: np.ndarray, rank_by: str) -> np.ndarray:
    rank_by = {"neg": "negative", "pos": "positive"}.get(rank_by, rank_by)  # patching.sweeps.results.NodeScores.ranked spelling
    if rank_by == "abs":
        return -np.abs(values)
    if rank_by == "negative":
        return values
    if rank_by == "positive":
        return -values
    raise InputError(f"rank_by must be 'abs', 'negative' or 'positive', got {rank_by!r}.")


def top_nodes(head_effects, mlp_effects=None, top_heads: int = 10, top_mlps: int = 3, rank_by: str = "abs"):
    """The key heads and MLPs by effect: ``([(Head, effect)], [(MLP, effect)])``, strongest first (NaNs skipped)."""
    grid = _as_head_grid(head_effects)
    mlps = _as_mlp_vector(mlp_effects, grid.shape[0])
    flat = [(Head(l, h), grid[l, h]) for l in range(grid.shape[0]) for h in range(grid.shape[1]) if np.isfinite(grid[l, h])]
    flat.sort(key=lambda x: _rank_key(np.array(x[1]), rank_by))
    mlp_list = [(MLP(l), mlps[l]) for l in range(len(mlps)) if np.isfinite(mlps[l])]
    mlp_list.sort(key=lambda x: _rank_key(np.array(x[1]), rank_by))
    return flat[:top_heads], mlp_list[:top_mlps]


def circuit_figure(
    head_effects,
    mlp_effects=None,
    head_roles: Mapping[Head, str] | None = None,
    *,
    top_heads: int = 10,
    top_mlps: int = 3,
    rank_by: str = "abs",
    title: str = "Arithmetic circuit: key heads, key MLPs and the logits",
) -> go.Figure:
    """A layered plotly graph of the key heads (coloured by role), the key MLPs and the logits.

    ``head_roles`` maps heads to ``"operand"``/``"operator"``/``"other"`` (e.g.
    ``{c.head: c.label for c in classify_heads(reads)}``); heads without a role are grey.
    Marker size grows with ``|effect|``.
    """
    if top_heads < 0 or top_mlps < 0:
        raise InputError("top_heads and top_mlps must be >= 0.")
    grid = _as_head_grid(head_effects)
    n_layers, n_heads = grid.shape
    heads, mlps = top_nodes(head_effects, mlp_effects, top_heads, top_mlps, rank_by)
    roles = dict(head_roles or {})
    scale = max([abs(v) for _, v in heads + mlps] + [1e-12])
    size = lambda v: 12 + 28 * abs(v) / scale  # noqa: E731 -- a one-line size rule
    mlp_y, logits_pos = -1.5, (n_layers, (n_heads - 1) / 2)
    pos = {h: (h.layer, h.head) for h, _ in heads} | {m: (m.layer + 0.3, mlp_y) for m, _ in mlps}

    edge_x, edge_y = [], []
    for h, _ in heads:
        targets = [m for m, _ in mlps if m.layer > h.layer] + ["logits"]
        for t in targets:
            x1, y1 = logits_pos if t == "logits" else pos[t]
            edge_x += [pos[h][0], x1, None]
            edge_y += [pos[h][1], y1, None]
    for m, _ in mlps:
        edge_x += [pos[m][0], logits_pos[0], None]
        edge_y += [pos[m][1], logits_pos[1], None]

    fig = go.Figure()
    fig.add_trace(go.Scatter(x=edge_x, y=edge_y, mode="lines", line=dict(color="#cccccc", width=1),
                             hoverinfo="skip", showlegend=False))
    for label in ("operand", "operator", "other"):
        group = [(h, v) for h, v in heads if roles.get(h, "other") == label]
        if not group:
            continue
        fig.add_trace(go.Scatter(
            x=[pos[h][0] for h, _ in group], y=[pos[h][1] for h, _ in group], mode="markers+text",
            text=[str(h) for h, _ in group], textposition="top center", name=f"{label} heads",
            marker=dict(size=[size(v) for _, v in group], color=CLASS_COLORS[label], line=dict(width=1, color="white")),
            customdata=[[v] for _, v in group], hovertemplate="%{text}: effect %{customdata[0]:.4g}<extra></extra>",
        ))
    if mlps:
        fig.add_trace(go.Scatter(
            x=[pos[m][0] for m, _ in mlps], y=[pos[m][1] for m, _ in mlps], mode="markers+text",
            text=[str(m) for m, _ in mlps], textposition="bottom center", name="key MLPs",
            marker=dict(size=[size(v) for _, v in mlps], color=MLP_COLOR, symbol="square"),
            customdata=[[v] for _, v in mlps], hovertemplate="%{text}: effect %{customdata[0]:.4g}<extra></extra>",
        ))
    fig.add_trace(go.Scatter(x=[logits_pos[0]], y=[logits_pos[1]], mode="markers+text", text=["logits"],
                             textposition="middle right", name="logits (END)",
                             marker=dict(size=26, color=LOGITS_COLOR, symbol="diamond")))
    fig.update_xaxes(title_text="layer", range=[-0.7, n_layers + 1.2], dtick=1, zeroline=False)
    fig.update_yaxes(tickvals=[mlp_y, *range(n_heads)], ticktext=["MLP", *[f"H{h}" for h in range(n_heads)]],
                     range=[mlp_y - 1, n_heads], zeroline=False)
    fig.update_layout(title=title, height=max(320, 60 * n_heads + 200), plot_bgcolor="white")
    return fig
