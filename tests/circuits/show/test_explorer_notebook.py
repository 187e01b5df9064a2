"""An explorer as a notebook cell's value shows the interactive page, not plotly's static figure: IPython asks an
object for ``_ipython_display_`` before any ``_repr_*_``, and plotly's ``Figure`` has one of its own."""

from __future__ import annotations

import pytest
import torch

from circuits.graph import Graph, GraphLayout
from circuits.show.explorer import circuit_explorer


def test_a_cell_that_ends_with_an_explorer_shows_its_page():
    interactive = pytest.importorskip("IPython.core.interactiveshell")
    layout = GraphLayout(2, 2)
    scores = torch.rand(layout.n_forward, layout.n_backward, generator=torch.Generator().manual_seed(0))
    explorer = circuit_explorer(Graph(layout, torch.where(layout.real_edge_mask, scores, torch.nan)))
    shell = interactive.InteractiveShell.instance()
    shown = []
    shell.display_pub.publish = lambda data, metadata=None, **kw: shown.append(data)
    shell.display_formatter.format(explorer)  # what a cell's last value and display() call
    assert len(shown) == 1 and list(shown[0]) == ["text/html"]
    assert shown[0]["text/html"].startswith("<iframe srcdoc=") and "circuit-explorer" in shown[0]["text/html"]
    assert "application/vnd.plotly.v1+json" not in shown[0]
