"""Our ACDC against auto-circuit's (UFO-101/auto-circuit 1.0.1), an independent implementation of the same search.

auto-circuit is not a dependency of the toolkit: these tests run where it is importable (install it with
``pip install --no-deps --target DIR auto-circuit==1.0.1 ordered-set blobfile lxml pycryptodomex`` and put DIR on
PYTHONPATH) and are skipped elsewhere. Both search the same edges in the same order (auto-circuit's own order
within a layer follows a Python set), with the KL of the END distribution and counterfactual ablation, so they must
keep the same edges. On a model with norms after attention auto-circuit's ablations are not the model's, and the
arm says so instead of running.
"""

from __future__ import annotations

import pytest
import torch

from circuits.tasks import TaskBatch
from experiments.bench_circuits import acdc_arm
from patching.edges.acdc import ACDCConfig, acdc
from tests.tiny_models import tiny_model

pytestmark = pytest.mark.skipif(acdc_arm.auto_circuit_missing() is not None,
                                reason=acdc_arm.auto_circuit_missing() or "")


def _prompts(model, seed: int, n: int = 6, length: int = 8):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, model.cfg.d_vocab, (n, length), generator=generator)
    cf_tokens = torch.randint(3, model.cfg.d_vocab, (n, length), generator=generator)
    tokens[:, 0] = cf_tokens[:, 0] = 1
    return tokens, cf_tokens


@pytest.mark.parametrize("style, n_layers, n_heads", [("gpt2", 2, 2), ("llama", 3, 4)])
@pytest.mark.parametrize("threshold", [0.001, 0.01])
def test_auto_circuits_acdc_keeps_the_edges_ours_keeps(style, n_layers, n_heads, threshold):
    model = tiny_model(n_layers=n_layers, n_heads=n_heads, d_head=8, n_ctx=16, style=style, seed=1)
    tokens, cf_tokens = _prompts(model, seed=1)
    ours = acdc(model, TaskBatch(tokens, cf_tokens, tokens[:, -1].clone(), {}, list(range(len(tokens)))),
                config=ACDCConfig(objective="kl", threshold=threshold))
    layout = ours.graph.layout
    kept = acdc_arm.kept_edges(ours.graph)
    theirs = acdc_arm.auto_circuit_acdc(model, tokens, cf_tokens, threshold)
    assert theirs["n_edges"] == int(layout.real_edge_mask.sum())  # the same graph
    assert 0 < len(kept) < theirs["n_edges"]  # a search that removed edges and kept some
    assert theirs["kept_edges"] == kept


def test_the_arm_runs_over_the_receivers_ours_runs_over():
    model = tiny_model(n_layers=2, n_heads=2, d_head=8, n_ctx=16, style="llama", seed=0)
    tokens, cf_tokens = _prompts(model, seed=0)
    ours = acdc(model, TaskBatch(tokens, cf_tokens, tokens[:, -1].clone(), {}, list(range(len(tokens)))),
                config=ACDCConfig(objective="kl", threshold=0.01, max_receivers=3))
    theirs = acdc_arm.auto_circuit_acdc(model, tokens, cf_tokens, 0.01, n_receivers=3)
    layout = ours.graph.layout
    tested = [b for b in range(layout.n_backward - 3, layout.n_backward)]
    assert theirs["n_edges"] == int(layout.real_edge_mask[:, tested].sum()) == ours.n_tested
    assert theirs["kept_edges"] == acdc_arm.kept_edges(ours.graph, 3)
    assert all(layout.edge_index(name)[1] in tested for name in theirs["kept_edges"])


def test_a_model_with_norms_after_attention_is_refused_with_why():
    gemma_like = tiny_model(n_layers=2, n_heads=2, d_head=8, n_ctx=16, style="gemma")
    assert "post-attention norm" in acdc_arm.auto_circuit_missing(gemma_like)
    assert "KL only" in acdc_arm.auto_circuit_missing(None, "metric")
