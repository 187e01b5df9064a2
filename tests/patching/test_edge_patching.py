"""Exact edge patching and circuit evaluation against a plain hook implementation, on gpt2/llama-GQA/gemma-MQA tiny models."""

from __future__ import annotations

import pytest
import torch

from circuits.graph import Graph, GraphLayout
from circuits.tasks import make_dataset, single_batch
from circuits.testing import tiny_model
from patching.circuit_evaluation import MeanPoolError, evaluate_circuit, evaluate_circuits
from patching.edge_patching import edge_patch
from tests.patching import edge_reference as plain

STYLES = {"gpt2": dict(style="gpt2"), "llama_gqa": dict(style="llama", n_key_value_heads=2), "gemma_mqa": dict(style="gemma")}
EDGES = ["input->a0.h1<q>", "input->a1.h2<k>", "a0.h2->a1.h0<k>", "m0->a1.h3<v>", "a1.h1->m1", "a0.h0->m0",
         "m1->logits", "input->logits", "a1.h3->logits"]


@pytest.fixture(scope="module", params=list(STYLES))
def setup(request):
    model = tiny_model(n_layers=2, seed=3, **STYLES[request.param])
    if request.param == "gpt2":
        with torch.no_grad():
            for block in model.blocks:
                block.attn.b_O.normal_(0, 0.3)
    data = make_dataset(model, n_prompts=5, n_shots=1, template_ids=["add-equation-0"], seed=1)
    return model, data


def _full(model):
    return GraphLayout.of(model).real_edge_mask.clone()


def test_edge_patch_equals_a_plain_hook_per_edge(setup):
    model, data = setup
    batch = single_batch(data)
    layout = GraphLayout.of(model)
    result = edge_patch(model, EDGES, data, progress=False)
    assert result.edges == [layout.edge_index(e) for e in EDGES]
    for (f, b), effect in zip(result.edges, result.effects):
        expected = plain.plain_edge_patch(model, f, b, batch.tokens, batch.cf_tokens, batch.answer_ids)
        assert abs(float(effect) - expected) < 1e-4 * max(1.0, abs(expected)), layout.edge_name(f, b)
    assert not torch.isnan(result.scores[result.edges[0]])
    assert torch.isnan(result.scores).sum() == layout.n_forward * layout.n_backward - len(EDGES)


def test_edge_patch_without_prefix_reuse_and_in_small_chunks_agrees(setup):
    model, data = setup
    fast = edge_patch(model, None, data, progress=False)
    slow = edge_patch(model, None, data, reuse_prefix=False, memory_mb=0.01, progress=False)
    assert len(fast.edges) == GraphLayout.of(model).n_edges
    torch.testing.assert_close(fast.per_prompt, slow.per_prompt, atol=2e-5, rtol=1e-4)


def test_full_graph_is_the_model_and_empty_graph_the_counterfactual(setup):
    model, data = setup
    batch = single_batch(data)
    empty = torch.zeros_like(_full(model))
    full_eval, empty_eval = evaluate_circuits(model, [_full(model), empty], data)
    ref = plain.logit(model, model(batch.tokens), batch.answer_ids)
    cf = plain.logit(model, model(batch.cf_tokens), batch.answer_ids)
    torch.testing.assert_close(full_eval.per_prompt.float(), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(empty_eval.per_prompt.float(), cf, atol=1e-4, rtol=1e-4)
    assert (full_eval.n_edges, empty_eval.n_edges) == (GraphLayout.of(model).n_edges, 0)


def test_full_graph_minus_one_edge_equals_edge_patch(setup):
    model, data = setup
    layout = GraphLayout.of(model)
    effects = edge_patch(model, EDGES, data, progress=False)
    circuits = []
    for f, b in effects.edges:
        mask = _full(model)
        mask[f, b] = False
        circuits.append(mask)
    full = evaluate_circuit(model, Graph(layout), data)
    for evaluation, effect in zip(evaluate_circuits(model, circuits, data), effects.per_prompt):
        torch.testing.assert_close(evaluation.per_prompt - full.per_prompt, effect, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("ablation", ["counterfactual", "zero", "mean", "positional-mean"])
def test_random_circuits_equal_the_plain_replacement(setup, ablation):
    """Receivers read Σ in-circuit current outputs + Σ out-of-circuit ablated outputs; several circuits per forward."""
    model, data = setup
    batch = single_batch(data)
    layout = GraphLayout.of(model)
    pool = make_dataset(model, n_prompts=4, n_shots=1, template_ids=["add-equation-0"], seed=7)
    pool_tokens = single_batch(pool).tokens
    g = torch.Generator().manual_seed(0)
    masks = [torch.rand(layout.n_forward, layout.n_backward, generator=g) < p for p in (0.3, 0.7, 0.9)]
    masks.append(torch.zeros(layout.n_forward, layout.n_backward, dtype=torch.bool))
    means_from = pool if ablation.endswith("mean") else None
    got = evaluate_circuits(model, masks, data, ablation=ablation, means_from=means_from, memory_mb=0.05)
    if ablation == "counterfactual":
        ablated = plain.outputs(model, batch.cf_tokens)
    elif ablation == "zero":
        ablated = {f: torch.zeros(model.cfg.d_model) for f in range(layout.n_forward)}
    else:
        pool_out = plain.outputs(model, pool_tokens)
        dims = (0, 1) if ablation == "mean" else (0,)
        ablated = {f: v.mean(dims) for f, v in pool_out.items()}
    for mask, evaluation in zip(masks, got):
        expected = plain.plain_circuit(model, mask & layout.real_edge_mask, batch.tokens, ablated, batch.answer_ids)
        torch.testing.assert_close(evaluation.per_prompt.float(), expected, atol=2e-4, rtol=1e-4)
        assert evaluation.ablation == ablation and evaluation.n_prompts == len(data)


def test_counterfactual_evaluation_with_and_without_prefix_reuse_agree(setup):
    model, data = setup
    layout = GraphLayout.of(model)
    mask = torch.rand(layout.n_forward, layout.n_backward, generator=torch.Generator().manual_seed(1)) < 0.5
    fast = evaluate_circuit(model, mask, data)
    slow = evaluate_circuit(model, mask, data, reuse_prefix=False)
    torch.testing.assert_close(fast.per_prompt, slow.per_prompt, atol=2e-5, rtol=1e-4)
