"""The report opens offline in headless Chromium with every plot and attention view drawn.

Screenshots are kept under test-artifacts/ (gitignored). Skips when Chromium,
chromedriver or selenium is missing (see tests/browser.py).

Cross-cutting (a browser test): the page that circuits.show.html_report builds, with the figures of
circuits.analyze and circuits.show and the sections of experiments.arithmetic.report, as a browser draws it.
"""

from pathlib import Path

import pytest

from circuits.analyze.attention import HeadClassConfig, attention_reads, attention_views, classify_heads, plot_role_distribution
from circuits.show.node_circuit import circuit_figure
from circuits.analyze.probes import plot_top_tokens, probe_mlps, top_number_tokens
from experiments.arithmetic.report import run_report
from circuits.tasks import make_dataset
from tests.tiny_models import tiny_model
from tests.browser import browser_or_skip, load_page

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"
SELECTORS = {"plots": ".plotly-figure .main-svg", "figures": ".plotly-figure",
             "drawn_figures": ".plotly-figure:has(.main-svg)", "views": ".attention-view",
             "views_drawn": ".attention-view *"}


def _tiny_report(tmp_path):
    model = tiny_model(style="gemma", n_layers=2)
    ds = make_dataset(model, n_prompts=6, styles=("equation",), seed=0)
    reads = attention_reads(model, ds, progress=False)
    classes = classify_heads(reads, HeadClassConfig(0.05, 0.05))
    probes = probe_mlps(model, ds, progress=False)
    import torch

    report = run_report(
        "browser test", dataset=ds, base_accuracy=0.5, head_classes=classes,
        attention_figures=[plot_role_distribution(reads, reads.heads[:3], classes)],
        attention_views=attention_views(model, ds, reads.heads[:2], max_prompts=2, last_tokens=10),
        probes=probes, top_tokens_figure=plot_top_tokens(top_number_tokens(model, "4 + 3 = "), "4 + 3 = ", "7"),
        circuit_figure=circuit_figure(torch.randn(2, 4), torch.randn(2), {c.head: c.label for c in classes}),
    )
    return report, report.save(tmp_path / "report.html")


def test_report_renders_offline_in_chromium(tmp_path):
    browser_or_skip()
    report, path = _tiny_report(tmp_path)
    assert report.n_figures == 5 and report.n_attention_views == 2
    page = load_page(path, SELECTORS, screenshot=ARTIFACTS / "report_tiny.png",
                     wait_for={"drawn_figures": report.n_figures, "views_drawn": 2})
    assert page.console_errors == []
    assert page.failed_requests == []
    # every figure container holds a drawn plot (.main-svg is plotly's drawing surface)
    assert page.counts["figures"] == page.counts["drawn_figures"] == report.n_figures
    assert page.counts["plots"] >= report.n_figures
    assert page.counts["views"] == 2 and page.counts["views_drawn"] > 10
    assert page.screenshot.exists() and page.screenshot.stat().st_size > 10_000


def test_a_broken_page_is_detected(tmp_path):
    """The helper must be able to fail: a figure whose plotly.js never loads draws nothing and logs an error."""
    browser_or_skip()
    import plotly.graph_objects as go
    import plotly.io as pio

    div = pio.to_html(go.Figure(go.Scatter(y=[1, 2])), full_html=False, include_plotlyjs=False)
    path = tmp_path / "broken.html"
    path.write_text(f"<html><body><div class='plotly-figure'>{div}</div></body></html>")
    page = load_page(path, SELECTORS, wait_for={"plots": 1}, timeout_s=5)
    assert page.counts["plots"] == 0 and page.counts["drawn_figures"] == 0 and page.counts["figures"] == 1
    assert any("Plotly" in e for e in page.console_errors)


@pytest.mark.integration
def test_gemma_report_renders_offline_in_chromium(gemma, tmp_path):
    browser_or_skip()
    from circuits.analyze.attention import plot_role_heatmap
    from circuits.tasks import filter_correct

    ds = make_dataset(gemma, n_prompts=8, styles=("equation",), seed=0)
    kept, accuracy = filter_correct(gemma, ds)
    reads = attention_reads(gemma, kept, progress=False)
    classes = classify_heads(reads)
    key = [c.head for c in classes if c.label != "other"][:4] or reads.heads[:4]
    probes = probe_mlps(gemma, kept, progress=False)
    report = run_report(
        "gemma-3-270m addition (browser test)", dataset=ds, base_accuracy=accuracy, n_kept=len(kept),
        head_classes=classes, attention_figures=[plot_role_distribution(reads, key, classes),
                                                 plot_role_heatmap(reads, gemma.cfg.n_layers, gemma.cfg.n_heads)],
        attention_views=attention_views(gemma, kept, key, max_prompts=1, last_tokens=12), probes=probes,
    )
    path = report.save(tmp_path / "report.html")
    page = load_page(path, SELECTORS, screenshot=ARTIFACTS / "report_gemma.png",
                     wait_for={"drawn_figures": report.n_figures, "views_drawn": 2})
    assert page.console_errors == [] and page.failed_requests == []
    assert page.counts["figures"] == page.counts["drawn_figures"] == report.n_figures
    assert page.counts["views_drawn"] > 10
