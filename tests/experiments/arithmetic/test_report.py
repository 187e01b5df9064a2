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


def _results(fraction: float) -> dict:
    """results.json of a run, as far as the first screen reads it (numbers made up, shapes as the pipeline writes)."""
    est = lambda v, lo, hi, n: {"value": v, "low": lo, "high": hi, "n": n}
    return {
        "experiment": "addition", "n_prompts": 200, "n_kept": 127, "n_layers": 18, "n_heads": 4,
        "accuracy": {"first_token": est(0.635, 0.566, 0.699, 200), "whole_answer": est(0.4, 0.335, 0.469, 200)},
        "key_heads": ["L10H0", "L16H1"],
        "knockout": {"ks": [1, 2], "effect_rank": [0.8, 0.55], "effect_ci": [[0.7, 0.9], [0.43, 0.66]],
                     "random_rank": [0.97, 0.87], "random_ci": [[0.9, 1.0], [0.8, 0.93]], "n_seeds": 10, "n_prompts": 64,
                     "effect_drop": [est(0.2, 0.1, 0.3, 64), est(0.45, 0.33, 0.58, 64)],
                     "transfer": {"zero_shot": {"drop": est(0.31, 0.125, 0.5, 32)}}},
        "edge_circuit": {"method": "EAP-IG-inputs", "ablation": "mean", "threshold": 0.8, "n_selection": 20,
                         "n_heldout": 20, "n_total_edges": 10342, "n_circuit_nodes": 91,
                         "cpr": est(0.727, 0.694, 0.778, 20), "cmd": est(0.272, 0.225, 0.305, 20),
                         "smallest": {"fraction": fraction, "n_edges": int(fraction * 10342), "threshold": 0.8,
                                      "f_heldout": est(0.92, 0.87, 1.0, 20)},
                         "key_heads": {"key_heads": ["L10H0", "L16H1"], "n_key_heads_in_circuit": 2}},
    }


def test_the_first_screen_says_what_was_found_with_intervals():
    from experiments.arithmetic.report import findings

    lines = findings(_results(0.05))
    text = " ".join(lines)
    assert "63.5% [56.6%, 69.9%]" in text and "40.0% [33.5%, 46.9%]" in text  # accuracy with Wilson intervals
    assert "L10H0, L16H1" in text and "55% [43%, 66%]" in text and "87% [80%, 93%]" in text
    assert "drop is 45% [33%, 58%]" in text and "n = 64 prompts" in text
    assert "CPR 0.73 [0.69, 0.78]" in text and "517 of 10,342 edges (5%)" in text and "2 of the 2 key heads" in text
    assert "zero shot 31% [12%, 50%]" in text
    assert not any("not small" in line for line in lines)


def test_a_weak_circuit_gets_a_plain_sentence():
    from experiments.arithmetic.report import findings

    lines = findings(_results(0.5))
    weak = [line for line in lines if "not small" in line]
    assert len(weak) == 1 and "50% of all edges" in weak[0] and "72 heads" in weak[0]


def test_attention_views_are_folded_and_carry_no_heading():
    html = run_report("r", attention_views=[_view(), _view()]).to_html()
    fold = html.split('<details class="fold">')[1].split("</details>")[0]
    assert fold.count("CircuitsVis.render") == 2 and "<h3>" not in fold and "2 views" in fold
