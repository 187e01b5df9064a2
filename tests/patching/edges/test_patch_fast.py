"""patching.edges.patch_fast: the fast path of edge patching equals the hook path and the plain patch, its
prefix keys rotated once change nothing, and it steps aside where blocks are parallel."""

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


@pytest.mark.parametrize("style", list(STYLES))
def test_fast_path_equals_the_hook_path_and_the_plain_patch_with_layers_in_between(style):
    """Three layers: receivers below, in and above the middle; fast path (block pieces, END-only last layer) vs hooks."""
    model = tiny_model(n_layers=3, seed=5, **STYLES[style])
    data = make_dataset(model, n_prompts=4, n_shots=1, template_ids=["add-equation-0"], seed=2)
    batch = single_batch(data)
    layout = GraphLayout.of(model)
    fast = edge_patch(model, None, data,
                      options=SweepOptions(memory_mb=0.02, progress=False))  # several chunks per receiver layer
    hooked = edge_patch(model, None, data, fast=False, options=SweepOptions(progress=False))
    assert fast.edges == hooked.edges and len(fast.edges) == layout.n_edges
    torch.testing.assert_close(fast.per_prompt, hooked.per_prompt, atol=2e-5, rtol=1e-4)
    for name in ("input->a0.h0<q>", "a0.h1->a1.h2<k>", "m0->a1.h3<v>", "a1.h0->m1", "input->m0", "m1->a2.h1<q>",
                 "a2.h2->m2"):
        f, b = layout.edge_index(name)
        expected = plain.plain_edge_patch(model, f, b, batch.tokens, batch.cf_tokens, batch.answer_ids)
        got = float(fast.effects[fast.edges.index((f, b))])
        assert abs(got - expected) < 1e-4 * max(1.0, abs(expected)), name


@pytest.mark.parametrize("style", ["llama_gqa", "gemma_mqa"])
def test_rotating_the_prefix_keys_once_changes_nothing(style, monkeypatch):
    """Rotary models: the fast path rotates the prefix's cached keys once per layer instead of once per
    patched row; the effects are the same bit for bit, and no shadowing method survives the run."""
    from patching.edges import patch_fast as _edge_fast

    model = tiny_model(n_layers=3, seed=7, **STYLES[style])
    assert model.cfg.positional_embedding_type == "rotary"
    data = make_dataset(model, n_prompts=4, n_shots=1, template_ids=["add-equation-0"], seed=4)
    assert single_batch(data).tokens.shape[1] > 4  # a real shared prefix, so the cache path runs
    calls = []
    original = _edge_fast.prefix_rotary_once

    def counting(attn, kv, layer, times, *, enabled=True):
        calls.append((kv is not None, enabled))
        return original(attn, kv, layer, times, enabled=enabled)

    monkeypatch.setattr(_edge_fast, "prefix_rotary_once", counting)
    once = edge_patch(model, None, data, options=SweepOptions(memory_mb=0.02, progress=False))
    assert (True, True) in calls
    calls.clear()
    every_row = edge_patch(model, None, data, options=SweepOptions(memory_mb=0.02, progress=False),
                           rotate_prefix_once=False)
    assert calls and all(not enabled for _, enabled in calls)
    assert torch.equal(once.per_prompt, every_row.per_prompt)
    assert all("apply_rotary" not in vars(block.attn) for block in model.blocks)


def test_fast_path_is_skipped_where_blocks_are_parallel():
    from patching.edges.patch_fast import fast_path_problem

    model = tiny_model(style="gpt2", n_layers=2, seed=0)
    assert fast_path_problem(model) is None
    model.cfg.parallel_attn_mlp = True
    try:
        assert "parallel" in fast_path_problem(model)
    finally:
        model.cfg.parallel_attn_mlp = False
