"""experiments.arithmetic.report: the sections of an arithmetic run's report, each skipped when its inputs are absent."""

import numpy as np
import plotly.graph_objects as go

from circuits.analyze.attention import AttentionView, HeadClass
from circuits.nodes import Head
from circuits.tasks import make_dataset
from tests.tiny_models import char_tokenizer
from experiments.arithmetic.report import CAPTIONS, percent, run_report, summary


def _fig(n=3):
    return go.Figure(go.Scatter(x=list(range(n)), y=list(range(n))))


def _view():
    att = np.tril(np.ones((3, 3)))
    return AttentionView(["<bos>", "1", "+"], np.stack([att / att.sum(-1, keepdims=True)] * 2), ["L0H0", "L0H1"], "1+")


def test_run_report_skips_absent_sections():
    ds = make_dataset(char_tokenizer(), n_prompts=4, styles=("equation",))
    text = run_report("r", dataset=ds, base_accuracy=0.75).to_html()
    assert "<h2>Data</h2>" in text and "75.0%" in text
    for absent in ("Path patching", "Knockout", "Attention reads", "MLP probes", "Circuit<", "Settings"):
        assert f"<h2>{absent}" not in text
    classes = [HeadClass(Head(1, 2), "operand", 0.6, 0.1, 0.2, 0.1), HeadClass(Head(0, 0), "other", 0.1, 0.1, 0.7, 0.1)]
    full = run_report("r", patching_figure=_fig(), knockout_figure=_fig(), head_classes=classes,
                      attention_views=[_view()], circuit_figure=_fig(), captions={"knockout": "my knockout caption"})
    html = full.to_html()
    assert full.n_figures == 3 and full.n_attention_views == 1
    assert "L1H2" in html and "L0H0" not in html.split("Operand and operator heads")[1].split("</table>")[0]
    assert "my knockout caption" in html and CAPTIONS["circuit"][:40] in html


def test_summary_reads_missing_numbers_as_n_a():
    """A run on one prompt and one seed has no knockout interval (null in results.json); the summary's format
    string raised TypeError there, after every stage had run, and no report was written."""
    results = {"experiment": "addition", "base_accuracy": 1.0, "n_prompts": 1, "n_kept": 1, "key_heads": ["L0H0"],
               "key_head_fraction": 0.125,
               "knockout": {"ks": [1], "effect_rank": [1.0], "random_rank": [None], "random_ci": [[None, None]],
                            "n_seeds": 1, "n_prompts": 1, "base_accuracy": 1.0, "n_pool": 99}}
    text = summary(results)
    assert "accuracy 100% vs n/a (no interval) for 1 random heads over 1 seeds" in text
    assert "base accuracy 100.0% of 1 prompts" in text
    assert percent(float("nan")) == percent(None) == "n/a" and percent(0.5) == "50%"
