"""Static figure export (kaleido + Chromium): files next to the JSON, sized for a paper; skips without a browser."""

import shutil

import plotly.graph_objects as go
import pytest

from circuits.errors import InputError
from circuits.show.static_export import PAPER_WIDTH_PX, export_figures, paper_layout, parse_formats

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


def test_formats_are_checked():
    assert parse_formats("svg, PDF,svg") == ("svg", "pdf") and parse_formats("") == ()
    with pytest.raises(InputError, match="Unknown figure format.*'eps'.*svg, pdf, png"):
        parse_formats("svg,eps")


def test_paper_layout_is_text_width_and_keeps_the_figure():
    fig = go.Figure(go.Heatmap(z=[[1, 2], [3, 4]]), layout=dict(title="t", height=2000))
    paper = paper_layout(fig)
    assert paper.layout.width == PAPER_WIDTH_PX and paper.layout.height == 900 and paper.layout.font.size == 10
    assert fig.layout.width is None  # the original is untouched


def test_export_writes_svg_pdf_png(tmp_path):
    pytest.importorskip("kaleido", reason="static export needs kaleido (pip install 'kaleido>=1')")
    if not any(shutil.which(b) for b in BROWSERS):
        pytest.skip("kaleido needs Chrome/Chromium: apt-get install chromium (or set BROWSER_PATH)")
    fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[1, 3, 2], name="a line"), layout=dict(title="static export test"))
    (tmp_path / "line.json").write_text(fig.to_json())
    paths = export_figures({"line": fig}, tmp_path, ["svg", "pdf", "png"])
    assert sorted(p.name for p in paths) == ["line.pdf", "line.png", "line.svg"]
    svg = (tmp_path / "line.svg").read_text()
    assert svg.startswith("<svg") and f'width="{PAPER_WIDTH_PX}"' in svg and "static export test" in svg
    assert (tmp_path / "line.pdf").read_bytes().startswith(b"%PDF")
    png = (tmp_path / "line.png").read_bytes()
    assert png.startswith(b"\x89PNG") and int.from_bytes(png[16:20], "big") == 3 * PAPER_WIDTH_PX  # 3x scale
    assert not list(tmp_path.glob(".*.tmp.*"))  # no temporary files left
