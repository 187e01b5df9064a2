"""Edge-circuit and faithfulness-curve figures: what is drawn, widths by score, bands from intervals."""

from __future__ import annotations

import pytest
import torch

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.show.edge_figures import edge_circuit_figure, faithfulness_figure
from circuits.graph_selection import select_top_n
from circuits.nodes import Head


def scored(seed=0):
    layout = GraphLayout(3, 2)
    g = torch.Generator().manual_seed(seed)
    scores = torch.where(layout.real_edge_mask, torch.randn(layout.n_forward, layout.n_backward, generator=g), torch.nan)
    return Graph(layout, scores)


def test_edge_circuit_figure_draws_the_circuit_edges_with_widths_by_score():
    graph = select_top_n(scored(), 12, prune=False)
    fig = edge_circuit_figure(graph, head_roles={Head(0, 0): "operand", Head(2, 1): "operator"})
    hover = [t for t in fig.data if t.hovertemplate and "extra" in t.hovertemplate and t.mode == "markers"][0]
    assert len(hover.text) == graph.n_edges_in_graph
    names = {text.split(":")[0] for text in hover.text}
    layout = graph.layout
    assert names == {layout.edge_name(f, b) for f, b in graph.in_graph.nonzero().tolist()}
    lines = [t for t in fig.data if t.mode == "lines"]
    widths = sorted({t.line.width for t in lines})
    assert len(widths) >= 2  # several |score| levels
    # the widest line carries the largest |score| edge
    widest = max(lines, key=lambda t: t.line.width)
    top = graph.scores.abs().nan_to_num().mul(graph.in_graph).flatten().argmax().item()
    f, b = divmod(top, layout.n_backward)
    assert widest.line.color == ("#1f77b4" if graph.scores[f, b] > 0 else "#d62728")
    legend = {t.name for t in fig.data if t.name}
    assert "logits" in legend and "input" in legend


def test_edge_circuit_figure_limits_edges_and_refuses_an_empty_circuit():
    graph = select_top_n(scored(1), 40, prune=False)
    fig = edge_circuit_figure(graph, max_edges=5)
    assert "5 of 40 circuit edges drawn" in fig.layout.title.text
    with pytest.raises(InputError, match="no edge in the circuit"):
        edge_circuit_figure(Graph(graph.layout, graph.scores, torch.zeros_like(graph.in_graph)))


def test_faithfulness_figure_band_follows_the_intervals():
    curve = {"fractions": [0.001, 0.01, 0.1, 1.0],
             "faithfulness": [{"value": v, "low": v - 0.1, "high": v + 0.05} for v in (0.1, 0.4, 0.8, 1.0)]}
    fig = faithfulness_figure([("EAP-IG", curve), ("EAP", curve)])
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(bands) == 2
    assert list(bands[0].x) == [0.1, 1.0, 10.0, 100.0, 100.0, 10.0, 1.0, 0.1]
    assert list(bands[0].y)[:4] == pytest.approx([0.15, 0.45, 0.85, 1.05])
    assert fig.layout.xaxis.type == "log"
    with pytest.raises(InputError, match="fractions"):
        faithfulness_figure({"x": []})


def test_highlighted_heads_get_a_black_ring():
    graph = select_top_n(scored(2), 60, prune=False)
    fig = edge_circuit_figure(graph, highlight=[Head(1, 0)])
    rings = {}
    for trace in fig.data:
        if trace.mode == "markers+text" and trace.name == "heads":
            rings.update(zip(trace.text, trace.marker.line.color))
    assert rings["L1H0"] == "black" and all(c == "white" for n, c in rings.items() if n != "L1H0")  # heads named as in the report


@pytest.mark.parametrize("n_layers", [3, 18])
def test_node_labels_are_not_cut_off_at_the_plot_edges(n_layers):
    """The "input" and "logits" labels sit above their markers (inside the x range), and no node label is clipped."""
    layout = GraphLayout(n_layers, 4)
    g = torch.Generator().manual_seed(0)
    graph = select_top_n(Graph(layout, torch.where(layout.real_edge_mask, torch.randn(
        layout.n_forward, layout.n_backward, generator=g), torch.nan)), 30, prune=False)
    fig = edge_circuit_figure(graph)
    low, high = fig.layout.xaxis.range
    for name in ("input", "logits"):
        trace = next(t for t in fig.data if t.name == name)
        assert list(trace.text) == [name] and trace.textposition == "top center"
        assert low < trace.x[0] - 0.5 and trace.x[0] + 0.5 < high  # marker (and the label centred on it) inside
    labelled = [t for t in fig.data if t.mode == "markers+text"]
    assert labelled and all(t.cliponaxis is False for t in labelled)
