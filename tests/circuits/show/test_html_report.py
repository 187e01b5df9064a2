"""The HTML report builder: offline assets, sections, escaping, atomic save."""

import re

import plotly.graph_objects as go
import pytest

from circuits.analyze.attention import AttentionView
from circuits.show.html_report import Report, circuitsvis_bundle

import numpy as np


def _fig(n=3):
    return go.Figure(go.Scatter(x=list(range(n)), y=list(range(n))))


def _view():
    att = np.tril(np.ones((3, 3)))
    return AttentionView(["<bos>", "1", "+"], np.stack([att / att.sum(-1, keepdims=True)] * 2), ["L0H0", "L0H1"], "1+")


def test_plotly_js_inlined_once_and_no_network_urls(tmp_path):
    report = Report("t").add_figure(_fig()).add_figure(_fig(), caption="second")
    text = report.save(tmp_path / "r.html").read_text()
    assert text.count("Plotly.newPlot") == 2
    assert len(re.findall(r"<script>/\*\*\s*\n?\s*\* plotly\.js", text)) <= 1
    assert text.count("<script") == 3  # one plotly.js, two figures
    assert not re.search(r"<script[^>]+src=", text) and "cdn.plot.ly" not in text.split("</head>")[1]
    assert "CircuitsVis" not in text  # no bundle unless a view needs it


def test_attention_view_uses_the_local_circuitsvis_bundle(tmp_path):
    text = Report("t").add_attention_view(_view()).add_attention_view(
        {"tokens": ["a", "b", "c"], "attention": np.eye(3)[None]}, kind="patterns").to_html()
    assert "unpkg.com" not in text
    assert text.count("var CircuitsVis=") == 1
    assert "CircuitsVis.AttentionHeads" in text and "CircuitsVis.AttentionPatterns" in text
    assert '"attentionHeadNames": ["L0H0", "L0H1"]' in text
    assert "</script" not in circuitsvis_bundle()
    with pytest.raises(ValueError, match=r"attention must be \[head, 3, 3\]"):
        Report("t").add_attention_view({"tokens": ["a", "b", "c"], "attention": np.eye(2)[None]})
    with pytest.raises(ValueError, match="kind"):
        Report("t").add_attention_view(_view(), kind="lines")


def test_text_and_tables_are_escaped():
    text = Report("<T>").add_text("a < b\n\nnew <p>").add_table(
        [{"x": 1, "y": "<script>"}, {"x": 2.5, "z": "q"}], caption="c").add_settings({"lr": 1e-5, "heads": [1, 2]}).to_html()
    assert "&lt;T&gt;" in text and "a &lt; b" in text and "&lt;script&gt;" in text
    assert "<th>z</th>" in text and 'class="num">2.5<' in text and "[1, 2]" in text
    with pytest.raises(TypeError, match="plotly"):
        Report("t").add_figure({"data": []})


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "report.html"
    Report("ok").add_text("first").save(path)
    report = Report("broken").add_text("second")

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("circuits.atomic_files.os.replace", crash)
    with pytest.raises(OSError, match="disk full"):
        report.save(path)
    assert "first" in path.read_text() and list(path.parent.iterdir()) == [path]


