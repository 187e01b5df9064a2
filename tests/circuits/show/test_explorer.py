"""The edge-circuit explorer's data: per-size rows equal a by-hand top-n, hidden counts, compare-mode set
arithmetic, node and edge hover fields, the page's files, and the refusals of bad input."""

from __future__ import annotations

import copy

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import select_top_n
from circuits.nodes import MLP, Head
from circuits.show.explorer import MIB_SIZES, Explorer, circuit_explorer
from circuits.show.html_report import Report

CURVE = {"fractions": [0.1, 0.2, 0.5, 1.0],
         "faithfulness": [{"value": v, "low": v - 0.1, "high": v + 0.05} for v in (0.3, 0.6, 0.9, 1.0)]}


def scored(seed=0, layout=GraphLayout(3, 2)) -> Graph:
    g = torch.Generator().manual_seed(seed)
    random = torch.randn(layout.n_forward, layout.n_backward, generator=g)
    return Graph(layout, torch.where(layout.real_edge_mask, random, torch.nan))


def by_hand_top(graph: Graph, n: int) -> list[str]:
    """The names of the n real edges of largest |score|, largest first (ties cannot happen with random scores)."""
    layout = graph.layout
    pairs = [(f, b) for f, b in layout.real_edge_mask.nonzero().tolist()]
    pairs.sort(key=lambda p: -abs(float(graph.scores[p[0], p[1]])))
    return [layout.edge_name(f, b) for f, b in pairs[:n]]


def drawn_names(explorer: Explorer, rows: list[int]) -> list[str]:
    page = explorer.payload
    edges, nodes = page["edges"], page["nodes"]
    return [f"{nodes['name'][edges['src'][i]]}->{page['receivers'][edges['recv'][i]]}" for i in rows]


def test_each_size_draws_the_top_n_edges_by_score():
    graph = scored()
    explorer = circuit_explorer(graph, curve=CURVE, prune=False)
    page = explorer.payload
    assert [s["fraction"] for s in page["sizes"]] == CURVE["fractions"]  # the curve's sizes by default
    for size, point in zip(page["sizes"], CURVE["faithfulness"]):
        n = int(size["fraction"] * graph.n_edges)
        assert size["n"] == size["n_circuit"] == n and size["f"] == pytest.approx(point)
        assert drawn_names(explorer, size["drawn"]) == by_hand_top(graph, n)
        assert sorted(size["drawn"]) == size["drawn"]  # the table is sorted by |score|, so rows ascend
    scores = [abs(s) for s in page["edges"]["score"]]
    assert scores == sorted(scores, reverse=True)


def test_pruned_sizes_are_the_mib_circuits_and_the_default_sizes_are_mibs():
    graph = scored(1)
    explorer = circuit_explorer(graph)
    page = explorer.payload
    assert [s["fraction"] for s in page["sizes"]] == list(MIB_SIZES)
    for size in page["sizes"]:
        circuit = select_top_n(graph, size["n"])  # MIB's pruned top-n
        want = {graph.layout.edge_name(f, b) for f, b in circuit.in_graph.nonzero().tolist()}
        assert set(drawn_names(explorer, size["drawn"])) == want and size["n_circuit"] == len(want)
        assert size["f"] is None  # no curve: f is not claimed


def test_a_methods_own_selector_gets_the_graphs_own_scores():
    """A selector may remember its answers by score tensor (the ILP one does): it is given the graph's own."""
    graph, seen = scored(10), []

    def select(scores, n):
        seen.append(scores)
        return select_top_n(graph, max(n - 1, 0), prune=False).in_graph  # one edge fewer than top-n: visibly its own

    explorer = circuit_explorer(graph, sizes=(0.1, 0.5), select=select, start=0.45)
    assert seen and all(s is graph.scores for s in seen)
    assert [s["n_circuit"] for s in explorer.payload["sizes"]] == [9, 49]
    assert explorer.payload["start"] == 1  # the size nearest to start


def test_at_most_max_edges_are_drawn_and_the_rest_counted_hidden():
    graph = scored(2)
    explorer = circuit_explorer(graph, curve=CURVE, prune=False, max_edges=7)
    for size in explorer.payload["sizes"]:
        assert drawn_names(explorer, size["drawn"]) == by_hand_top(graph, size["n"])[:7]
        assert size["n_circuit"] - len(size["drawn"]) == size["n"] - 7  # what the page reports as hidden
    assert explorer.payload["max_edges"] == 7


def test_compare_mode_counts_are_set_arithmetic():
    a, b = scored(3), scored(4)
    explorer = circuit_explorer(a, compare=b, sizes=(0.05, 0.2, 0.5), labels=("EAP-IG", "learned"), max_edges=12)
    page = explorer.payload
    assert page["labels"] == ["EAP-IG", "learned"]
    layout = a.layout
    for size in page["sizes"]:
        edges = lambda g: {layout.edge_name(f, b) for f, b in select_top_n(g, size["n"]).in_graph.nonzero().tolist()}
        in_a, in_b = edges(a), edges(b)
        parts = size["compare"]
        assert (parts["both"]["count"], parts["only_a"]["count"], parts["only_b"]["count"]) == (
            len(in_a & in_b), len(in_a - in_b), len(in_b - in_a))
        assert set(drawn_names(explorer, parts["both"]["rows"])) <= in_a & in_b
        assert set(drawn_names(explorer, parts["only_a"]["rows"])) <= in_a - in_b
        assert set(drawn_names(explorer, parts["only_b"]["rows"])) <= in_b - in_a
        drawn = sum(len(p["rows"]) for p in parts.values())
        assert drawn == min(12, len(in_a | in_b))  # the budget is shared, never exceeded
    second = page["edges"]["score_b"]
    for i, name in enumerate(drawn_names(explorer, range(len(second)))):
        assert second[i] == pytest.approx(float(b.scores[layout.edge_index(name)]), rel=1e-3)


def test_hover_fields_of_nodes_and_edges():
    graph = scored(5)
    layout = graph.layout
    share = torch.where(layout.real_edge_mask, 0.25, torch.nan)
    share[layout.edge_index("input->logits")] = 1.0
    explorer = circuit_explorer(graph, sizes=(1.0,), prune=False, edge_share=share,
                                head_roles={Head(1, 0): "operand"}, highlight=[Head(2, 1)],
                                node_info={Head(1, 0): {"path-patching effect": -12.5, "key-head rank": 1},
                                           "MLP2": {"IIA": {"sum": 0.91}}, "a0.h1": {"key-head rank": 3}})
    nodes = explorer.payload["nodes"]
    hover = dict(zip(nodes["name"], nodes["hover"]))
    assert "attention-read class: operand" in hover["a1.h0"] and "path-patching effect: -12.5" in hover["a1.h0"]
    assert "key-head rank: 1" in hover["a1.h0"] and "key-head rank: 3" in hover["a0.h1"]
    assert "IIA: sum 0.91" in hover["m2"] and hover["logits"].startswith("<b>logits</b>")
    assert dict(zip(nodes["name"], nodes["ring"]))["a2.h1"]
    assert nodes["group"][nodes["name"].index("a1.h0")] == "operand heads"
    shares = dict(zip(drawn_names(explorer, range(len(explorer.payload["edges"]["share"]))),
                      explorer.payload["edges"]["share"]))
    assert shares["input->logits"] == 1.0 and shares["a1.h0->logits"] == 0.25


def test_the_explorer_is_the_static_figure_at_its_start_size():
    graph = select_top_n(scored(6), 20, prune=False)  # a selected circuit: the start is the size nearest to it
    explorer = circuit_explorer(graph, sizes=(0.05, 0.2, 1.0), prune=False)
    assert isinstance(explorer, go.Figure) and explorer.payload["start"] == 1
    assert "edges drawn" in explorer.layout.title.text  # edge_circuit_figure's subtitle
    assert explorer.to_json()  # run folders write every figure as JSON
    assert copy.deepcopy(explorer).to_json()
    with pytest.raises(InputError, match="carries no explorer data"):
        go.Figure.__new__(Explorer).payload


def test_the_page_is_offline_and_saved_atomically(tmp_path):
    explorer = circuit_explorer(scored(7), curve=CURVE)
    path = explorer.save(tmp_path / "explorer.html")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "Plotly.react" in text and 'class="circuit-explorer"' in text
    assert "https://cdn" not in text.split("<body>")[1]  # the page part loads nothing (plotly.js is inline)
    assert [p.name for p in tmp_path.iterdir()] == ["explorer.html"]  # no temporary file left behind
    frame = explorer._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and "&lt;script&gt;" in frame
    assert list(explorer._repr_mimebundle_()) == ["text/html"]  # the page, not plotly's own renderer of the figure


def test_the_report_embeds_the_explorer_with_one_copy_of_plotly():
    report = Report("explorer").add_explorer(circuit_explorer(scored(8)), heading="Circuit", caption="the circuit")
    page = report.to_html()
    assert report.n_explorers == 1 and page.count("Plotly.react") == 1
    assert page.count("<script>") >= 2 and page.count(".explorer-plot") >= 1 and "the circuit" in page
    with pytest.raises(InputError, match="circuit_explorer"):
        report.add_explorer(go.Figure())


def test_bad_input_is_refused_with_what_to_do():
    graph = scored(9)
    with pytest.raises(InputError, match=r"fractions of the edges in \(0, 1\]; got \[0.0, 1.5\]"):
        circuit_explorer(graph, sizes=(0.0, 0.5, 1.5))
    with pytest.raises(InputError, match="different layouts .*compare two scorings of the same model"):
        circuit_explorer(graph, compare=scored(0, GraphLayout(2, 2)))
    nan = graph.scores.clone()
    nan[graph.layout.edge_index("a1.h0->logits")] = float("inf")
    with pytest.raises(InputError, match=r"1 edges whose score is NaN or infinite \(first: a1.h0->logits\)"):
        circuit_explorer(Graph(graph.layout, nan))
    with pytest.raises(InputError, match="edge_share has shape"):
        circuit_explorer(graph, edge_share=np.ones((2, 2)))
    with pytest.raises(InputError, match="not a node of this graph"):
        circuit_explorer(graph, node_info={MLP(7): {"IIA": 1.0}})
    with pytest.raises(InputError, match=r"start=0 is not a fraction of the edges in \(0, 1\]"):
        circuit_explorer(graph, sizes=(0.1, 0.5), start=0)
    with pytest.raises(InputError, match="draw at least one edge per size"):
        circuit_explorer(graph, max_edges=0)
    with pytest.raises(InputError, match="A curve must have 'fractions' and 'faithfulness'"):
        circuit_explorer(graph, curve={"fractions": [0.1]})
    with pytest.raises(InputError, match="compare must be a circuits.graph.Graph"):
        circuit_explorer(graph, compare=graph.scores)
    with pytest.raises(InputError, match="No size holds an edge .*choose larger sizes"):
        circuit_explorer(graph, sizes=(0.001,))  # int(0.001 * 100 edges) = 0
