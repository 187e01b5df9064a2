"""patching.edges.positions: the span schema, and position-aware edges that merge back into today's graph."""

from __future__ import annotations

import pytest
import torch

from circuits.graph import GraphLayout
from circuits.tasks import iter_batches
from patching.edges.attribute import edge_attribution
from patching.edges.curves import faithfulness_curve
from patching.edges.evaluate import evaluate_circuits
from patching.edges.positions import MERGED, SPANS, PositionalScores, span_ids
from patching import SweepOptions


@pytest.fixture(scope="module")
def setup(one_length_prompts):
    model, data = one_length_prompts
    return model, data.select(range(6))


def test_every_position_gets_the_span_of_its_role(setup):
    _, data = setup
    batch = next(iter_batches(data, 6))
    ids = span_ids(batch.role_masks)
    for j, row in enumerate(data):
        assert ids[j, 0] == SPANS.index("bos") and ids[j, -1] == SPANS.index("end")
        for role in ("a", "b", "op"):
            assert all(ids[j, p] == SPANS.index(role) for p in row[f"{role}_pos"])
        assert all(ids[j, p] == SPANS.index("shots") for p in range(1, row["query_start"]))
        after_b = range(max(row["b_pos"]) + 1, len(row["tokens"]) - 1)
        assert all(ids[j, p] == SPANS.index("equals") for p in after_b)
    assert torch.equal(span_ids(batch.role_masks, MERGED), torch.zeros_like(ids))


def test_position_aware_scores_sum_to_the_position_free_ones(setup):
    model, data = setup
    plain = edge_attribution(model, data, method="EAP", options=SweepOptions(progress=False))
    for schema in (SPANS, MERGED):
        positional = edge_attribution(model, data, method="EAP", spans=schema, options=SweepOptions(progress=False))
        assert isinstance(positional, PositionalScores) and positional.scores.shape[-1] == len(schema)
        real = plain.layout.real_edge_mask
        torch.testing.assert_close(positional.merged().scores[real], plain.scores[real], rtol=1e-4, atol=1e-6)


def test_a_circuit_constant_over_spans_is_the_position_free_circuit(setup):
    model, data = setup
    layout = GraphLayout.of(model)
    g = torch.Generator().manual_seed(0)
    circuits = [layout.real_edge_mask & (torch.rand(layout.real_edge_mask.shape, generator=g) < p) for p in (0.2, 0.6)]
    plain = evaluate_circuits(model, circuits, data)
    positional = evaluate_circuits(model, [c[:, :, None].expand(-1, -1, len(SPANS)) for c in circuits], data,
                                   spans=SPANS)
    for a, b in zip(plain, positional):
        torch.testing.assert_close(a.per_prompt, b.per_prompt, rtol=1e-5, atol=1e-6)
    # under counterfactual ablation the shared prefix (BOS, shots) carries no change: its edges never matter
    dropped = []
    for c in circuits:
        mask = c[:, :, None].expand(-1, -1, len(SPANS)).clone()
        mask[:, :, [SPANS.index("bos"), SPANS.index("shots")]] = False
        dropped.append(mask)
    for a, b in zip(plain, evaluate_circuits(model, dropped, data, spans=SPANS)):
        torch.testing.assert_close(a.per_prompt, b.per_prompt, rtol=1e-5, atol=1e-6)
    # but the operator's span does
    no_op = [m.clone() for m in dropped]
    for m in no_op:
        m[:, :, SPANS.index("op")] = False
    changed = [float((a.per_prompt - b.per_prompt).abs().max())
               for a, b in zip(plain, evaluate_circuits(model, no_op, data, spans=SPANS))]
    assert max(changed) > 1e-4


def test_the_curve_with_every_span_merged_is_the_position_free_curve(setup):
    model, data = setup
    plain = edge_attribution(model, data, method="EAP", options=SweepOptions(progress=False))
    merged = edge_attribution(model, data, method="EAP", spans=MERGED, options=SweepOptions(progress=False))
    fractions = (0.05, 0.2, 0.5, 1.0)
    a = faithfulness_curve(model, plain, data, fractions=fractions, n_bootstrap=50,
                           options=SweepOptions(progress=False))
    b = faithfulness_curve(model, merged, data, fractions=fractions, n_bootstrap=50,
                           options=SweepOptions(progress=False))
    assert a.n_edges == b.n_edges and b.spans == MERGED
    for x, y in zip(a.faithfulness, b.faithfulness):
        assert x.value == pytest.approx(y.value, rel=1e-4, abs=1e-5)
    positional = faithfulness_curve(model, edge_attribution(model, data, method="EAP", spans=SPANS,
                                                            options=SweepOptions(progress=False)),
                                    data, fractions=fractions, n_bootstrap=50, options=SweepOptions(progress=False))
    assert positional.n_total_edges == len(SPANS) * plain.layout.n_edges
    assert positional.faithfulness[-1].value == pytest.approx(1.0)


def test_token_tensors_cannot_be_position_aware(setup):
    model, data = setup
    tokens = torch.tensor(data["tokens"])
    with pytest.raises(ValueError, match="positions of the prompts' parts"):
        edge_attribution(model, tokens, torch.tensor(data["cf_tokens"]), answer_ids=0, spans=SPANS,
                         options=SweepOptions(progress=False))
