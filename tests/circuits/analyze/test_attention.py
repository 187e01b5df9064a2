"""Attention reads: END-query attention grouped by role, head classification, figures and views."""

import pytest
import torch

from circuits.analyze.attention import (
    ROLES, AttentionReads, HeadClassConfig, attention_reads, attention_views, classes_table,
    classify_heads, plot_role_distribution, plot_role_heatmap,
)
from circuits.nodes import Head
from circuits.tasks import make_dataset
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def gemma_style():
    return tiny_model(style="gemma", n_layers=2)


@pytest.fixture(scope="module")
def data(gemma_style):
    return make_dataset(gemma_style, n_prompts=8, styles=("equation",), seed=1)


def test_scores_match_manual_sum_over_role_positions(gemma_style, data):
    heads = [Head(0, 1), Head(1, 3)]
    reads = attention_reads(gemma_style, data, heads, progress=False)
    assert reads.scores.shape == (len(data), 2, len(ROLES))
    torch.testing.assert_close(reads.scores.sum(-1), torch.ones(len(data), 2), atol=1e-5, rtol=0)
    for p in (0, len(data) - 1):
        row = data[p]
        _, cache = gemma_style.run_with_cache(torch.tensor([row["tokens"]]))
        for i, h in enumerate(heads):
            pattern = cache["pattern", h.layer][0, h.head, -1]
            assert reads.scores[p, i, 0] == pytest.approx(pattern[row["a_pos"]].sum().item(), abs=1e-5)
            assert reads.scores[p, i, 1] == pytest.approx(pattern[row["b_pos"]].sum().item(), abs=1e-5)
            assert reads.scores[p, i, 2] == pytest.approx(pattern[row["op_pos"]].sum().item(), abs=1e-5)
            assert reads.scores[p, i, 3] == pytest.approx(pattern[0].item(), abs=1e-5)
            shots = slice(1, row["query_start"])
            assert reads.scores[p, i, ROLES.index("shots")] == pytest.approx(pattern[shots].sum().item(), abs=1e-5)
            assert reads.scores[p, i, ROLES.index("end")] == pytest.approx(pattern[-1].item(), abs=1e-5)
            named = sum(pattern[row[k]].sum().item() for k in ("a_pos", "b_pos", "op_pos"))
            query = 1 - named - pattern[0].item() - pattern[shots].sum().item() - pattern[-1].item()
            assert reads.scores[p, i, ROLES.index("query")] == pytest.approx(query, abs=1e-5)
    other = reads.role("shots") + reads.role("query") + reads.role("end")
    torch.testing.assert_close(reads.role("other"), other)


def test_query_start_marks_the_queried_problem(gemma_style):
    few = make_dataset(gemma_style, n_prompts=4, styles=("equation",), n_shots=2, seed=3)
    for row in few:
        tokens = row["tokens"]
        assert 1 < row["query_start"] <= min(row["a_pos"])
        queried = gemma_style.tokenizer.decode(tokens[row["query_start"]:])
        assert "\n" not in queried and row["prompt"].endswith(queried)
    zero = make_dataset(gemma_style, n_prompts=2, styles=("equation",), n_shots=0, seed=3)
    assert all(r["query_start"] == 1 for r in zero)  # no shots: the query follows BOS


def test_multi_query_heads_get_their_own_patterns(gemma_style, data):
    assert gemma_style.cfg.n_key_value_heads == 1
    reads = attention_reads(gemma_style, data, progress=False)
    assert len(reads.heads) == 8
    layer0 = reads.scores[:, :4, :]
    assert not torch.allclose(layer0[:, 0], layer0[:, 1])  # shared keys, different queries


def test_no_hook_survives_and_bad_input_is_explained(gemma_style, data):
    attention_reads(gemma_style, data, [Head(1, 0)], progress=False)
    assert all(not hp.fwd_hooks for hp in gemma_style.hook_dict.values())
    with pytest.raises(ValueError, match="out of range"):
        attention_reads(gemma_style, data, [Head(5, 0)], progress=False)
    with pytest.raises(ValueError, match="lacks columns"):
        attention_reads(gemma_style, data.remove_columns(["op_pos"]), progress=False)


def _synthetic(means):
    """Per head: A, B, operator, BOS, other (split evenly over the few-shot lines, the query and END)."""
    heads = [Head(0, i) for i in range(len(means))]
    rows = [m[:4] + [m[4] / 3] * 3 for m in means]
    scores = torch.tensor(rows, dtype=torch.float)[None].repeat(3, 1, 1)
    return AttentionReads(heads, scores)


def test_classification_rule_and_thresholds():
    reads = _synthetic([
        [0.2, 0.2, 0.05, 0.5, 0.05],   # operand 0.4
        [0.05, 0.05, 0.5, 0.3, 0.1],   # operator 0.5
        [0.05, 0.05, 0.05, 0.8, 0.05],  # BOS sink: other
        [0.1, 0.1, 0.25, 0.5, 0.05],   # operator 0.25 > operand 0.2
    ])
    labels = [c.label for c in classify_heads(reads)]
    assert labels == ["operand", "operator", "other", "operator"]
    strict = [c.label for c in classify_heads(reads, HeadClassConfig(operand_threshold=0.5, operator_threshold=0.6))]
    assert strict == ["other"] * 4
    rows = classes_table(classify_heads(reads), only_labelled=True)
    assert [r["class"] for r in rows] == ["operand", "operator", "operator"]
    assert rows[0]["operand (A+B)"] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="Thresholds"):
        classify_heads(reads, HeadClassConfig(operand_threshold=0))


def test_figures_and_views(gemma_style, data):
    reads = attention_reads(gemma_style, data, progress=False)
    classes = classify_heads(reads, HeadClassConfig(0.05, 0.05))
    fig = plot_role_distribution({"+": reads, "-": reads}, heads=reads.heads[:3], classes=classes)
    assert len(fig.data) == 6 and len(fig.data[0].y) == len(data) * len(ROLES)
    heat = plot_role_heatmap(reads, 2, 4)
    assert heat.data[0].z.shape == (2, 4) if hasattr(heat.data[0].z, "shape") else len(heat.data[0].z) == 2
    views = attention_views(gemma_style, data, [Head(0, 0), Head(1, 2)], max_prompts=2, last_tokens=8)
    assert len(views) == 2 and views[0].attention.shape == (2, 8, 8) and len(views[0].tokens) == 8
    full = attention_views(gemma_style, ["1 + 2 = "], [Head(1, 2)])[0]
    torch.testing.assert_close(torch.tensor(full.attention).sum(-1), torch.ones(1, len(full.tokens)), atol=1e-5, rtol=0)
    assert "CircuitsVis" in full.to_circuitsvis().local_src


@pytest.mark.integration
def test_gemma_reads_sum_to_one_and_classify(gemma):
    ds = make_dataset(gemma, n_prompts=4, styles=("equation",), seed=0)
    reads = attention_reads(gemma, ds, [Head(l, h) for l in (5, 10) for h in range(4)], progress=False)
    torch.testing.assert_close(reads.scores.sum(-1), torch.ones(4, 8), atol=1e-4, rtol=0)
    assert {c.label for c in classify_heads(reads)} <= {"operand", "operator", "other"}
