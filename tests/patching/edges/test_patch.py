"""patching.edges.patch: exact edge patching against a plain hook per edge (tests/patching/edge_reference.py),
with and without prefix reuse and in small chunks, on gpt2/llama-GQA/gemma-MQA tiny models."""

from __future__ import annotations

import pytest
import torch

from circuits.graph import GraphLayout
from circuits.tasks import make_dataset, single_batch
from tests.tiny_models import tiny_model
from patching.edges.patch import edge_patch
from patching import SweepOptions
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


def test_edge_patch_equals_a_plain_hook_per_edge(setup):
    model, data = setup
    batch = single_batch(data)
    layout = GraphLayout.of(model)
    result = edge_patch(model, EDGES, data, options=SweepOptions(progress=False))
    assert result.edges == [layout.edge_index(e) for e in EDGES]
    for (f, b), effect in zip(result.edges, result.effects):
        expected = plain.plain_edge_patch(model, f, b, batch.tokens, batch.cf_tokens, batch.answer_ids)
        assert abs(float(effect) - expected) < 1e-4 * max(1.0, abs(expected)), layout.edge_name(f, b)
    assert not torch.isnan(result.scores[result.edges[0]])
    assert torch.isnan(result.scores).sum() == layout.n_forward * layout.n_backward - len(EDGES)


def test_edge_patch_without_prefix_reuse_and_in_small_chunks_agrees(setup):
    model, data = setup
    fast = edge_patch(model, None, data, options=SweepOptions(progress=False))
    slow = edge_patch(model, None, data, options=SweepOptions(reuse_prefix=False, memory_mb=0.01, progress=False))
    assert len(fast.edges) == GraphLayout.of(model).n_edges
    torch.testing.assert_close(fast.per_prompt, slow.per_prompt, atol=2e-5, rtol=1e-4)


def test_a_metric_that_ignores_the_logits_warns_that_every_edge_effect_is_zero():
    from circuits.tasks import make_dataset
    from patching.sweeps.inputs import NoEffectWarning
    from tests.tiny_models import tiny_model

    model = tiny_model(n_layers=1)
    data = make_dataset(model, n_prompts=3, n_shots=0, template_ids=("add-equation-0",), seed=2)
    constant = lambda logits, answers, alts: torch.ones(logits.shape[0])  # noqa: E731
    with pytest.warns(NoEffectWarning, match="Every edge-patching effect is exactly 0"):
        edge_patch(model, None, data, options=SweepOptions(metric=constant, progress=False))
