"""Activation patching equals TransformerLens' get_act_patch_* functions (reference tokens as "corrupted")."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import patching as tl_patching

from circuits.tasks import make_dataset, single_batch
from tests.tiny_models import tiny_model
from patching.node_level.activation_patching import activation_patch
from patching import SweepOptions


STYLES = [("gpt2", None), ("llama", 2), ("gemma", None)]


@pytest.fixture(scope="module", params=STYLES, ids=[s for s, _ in STYLES])
def setup(request):
    style, kv = request.param
    model = tiny_model(style=style, n_key_value_heads=kv, n_layers=2)
    data = make_dataset(model, n_prompts=4, n_shots=0, template_ids=("add-equation-0",), seed=2)
    batch = single_batch(data)
    _, cf_cache = model.run_with_cache(batch.cf_tokens)
    answers = batch.answer_ids

    def metric(logits):
        return logits[torch.arange(len(answers)), -1, answers].mean()

    return model, batch, cf_cache, metric


CASES = [
    ("z", "all", tl_patching.get_act_patch_attn_head_out_all_pos),
    ("z", "each", tl_patching.get_act_patch_attn_head_out_by_pos),
    ("mlp_out", "each", tl_patching.get_act_patch_mlp_out),
    ("resid_pre", "each", tl_patching.get_act_patch_resid_pre),
    ("attn_out", "each", tl_patching.get_act_patch_attn_out),
]


@pytest.mark.parametrize("component,positions,tl_fn", CASES, ids=[f"{c}-{p}" for c, p, _ in CASES])
def test_equals_transformer_lens(setup, component, positions, tl_fn):
    model, batch, cf_cache, metric = setup
    expected = tl_fn(model, batch.tokens, cf_cache, metric)
    got = activation_patch(model, batch, component=component, positions=positions, options=SweepOptions(progress=False))
    assert got.patched.shape == expected.shape
    torch.testing.assert_close(got.patched, expected.float(), atol=1e-5, rtol=0)
    assert (got.effect.abs() > 1e-6).any()  # not a vacuous comparison


@pytest.fixture(scope="module", params=STYLES, ids=[s for s, _ in STYLES])
def few_shot(request):
    """Two-shot prompts: reference and counterfactual share a long prefix, which the fast path reuses."""
    style, kv = request.param
    model = tiny_model(style=style, n_key_value_heads=kv, n_layers=3)
    data = make_dataset(model, n_prompts=3, n_shots=2, template_ids=("add-equation-0",), seed=4)
    return model, single_batch(data)


@pytest.mark.parametrize("component,positions,tl_fn", CASES, ids=[f"{c}-{p}" for c, p, _ in CASES])
def test_shared_prefix_reuse_equals_transformer_lens(few_shot, component, positions, tl_fn):
    from patching.sweeps.forward import shared_prefix_length

    model, batch = few_shot
    prefix = shared_prefix_length(batch.tokens, batch.cf_tokens)
    assert prefix > batch.tokens.shape[1] // 2  # the fast path really skips most positions
    _, cf_cache = model.run_with_cache(batch.cf_tokens)
    answers = batch.answer_ids
    expected = tl_fn(model, batch.tokens, cf_cache, lambda lg: lg[torch.arange(len(answers)), -1, answers].mean())
    fast = activation_patch(model, batch, component=component, positions=positions,
                            options=SweepOptions(progress=False))
    plain = activation_patch(model, batch, component=component, positions=positions,
                             options=SweepOptions(reuse_prefix=False, progress=False))
    torch.testing.assert_close(fast.patched, expected.float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.patched, plain.patched, atol=1e-5, rtol=0)
    assert (fast.effect.abs() > 1e-6).any()


def test_end_position_is_last_column_of_each(setup):
    model, batch, _, _ = setup
    each = activation_patch(model, batch, component="z", positions="each", options=SweepOptions(progress=False))
    end = activation_patch(model, batch, component="z", positions="end", options=SweepOptions(progress=False))
    torch.testing.assert_close(end.patched, each.patched[:, -1], atol=1e-5, rtol=0)


def test_small_memory_budget_and_layer_subset_agree(setup):
    model, batch, _, _ = setup
    full = activation_patch(model, batch, component="z", options=SweepOptions(progress=False))
    tiny_chunks = activation_patch(model, batch, component="z",
                                   options=SweepOptions(memory_mb=0.001, progress=False), layers=[1])
    assert torch.isnan(tiny_chunks.patched[0]).all()
    torch.testing.assert_close(tiny_chunks.patched[1], full.patched[1], atol=1e-5, rtol=0)


def test_bad_inputs():
    model = tiny_model(n_layers=2)
    data = make_dataset(model, n_prompts=3, n_shots=0)
    with pytest.raises(ValueError, match="Unknown component"):
        activation_patch(model, data, component="q", options=SweepOptions(progress=False))
    with pytest.raises(ValueError, match="Unknown positions"):
        activation_patch(model, data, positions="some", options=SweepOptions(progress=False))
    with pytest.raises(ValueError, match="out of range"):
        activation_patch(model, data, layers=[7], options=SweepOptions(progress=False))
    with pytest.raises(ValueError, match="Unknown metric"):
        activation_patch(model, data, options=SweepOptions(metric="nope", progress=False))


def test_no_layers_is_refused():
    """layers=[] returned an all-NaN result (nothing patched) as if it had run."""
    model = tiny_model(n_layers=2)
    data = make_dataset(model, n_prompts=3, n_shots=0)
    with pytest.raises(ValueError, match=r"layers is empty, so nothing would be patched: name at least one layer in 0..1"):
        activation_patch(model, data, layers=[], options=SweepOptions(progress=False))
    with pytest.raises(ValueError, match=r"Layers \[0.5\] are out of range"):
        activation_patch(model, data, layers=[0.5], options=SweepOptions(progress=False))


@pytest.mark.integration
def test_gemma_equals_transformer_lens(gemma):
    """gemma-3-270m, 4 two-shot prompts, the heads of the first and last layer (TL's sweep is ~1 forward per head).

    Two shots make the shared prefix long, so the cached-prefix fast path is what is compared."""
    import pandas as pd

    data = make_dataset(gemma, n_prompts=4, n_shots=2, template_ids=("add-equation-0",), seed=0)
    batch = single_batch(data)
    answers = batch.answer_ids
    layers = [0, gemma.cfg.n_layers - 1]
    with torch.no_grad():
        _, cf_cache = gemma.run_with_cache(batch.cf_tokens)
        index = pd.DataFrame([(l, h) for l in layers for h in range(gemma.cfg.n_heads)], columns=["layer", "head"])
        expected = tl_patching.generic_activation_patch(
            gemma, batch.tokens, cf_cache, lambda lg: lg[torch.arange(len(answers)), -1, answers].mean(),
            patch_setter=tl_patching.layer_head_vector_patch_setter, activation_name="z", index_df=index)
    got = activation_patch(gemma, batch, component="z", layers=layers, options=SweepOptions(progress=False))
    torch.testing.assert_close(got.patched[layers].flatten(), expected.float(), atol=1e-4, rtol=0)


def test_a_metric_that_ignores_the_logits_warns_that_every_activation_effect_is_zero():
    from circuits.tasks import make_dataset
    from patching.sweeps.inputs import NoEffectWarning
    from tests.tiny_models import tiny_model

    model = tiny_model(n_layers=1)
    data = make_dataset(model, n_prompts=4, n_shots=0, template_ids=("add-equation-0",), seed=2)
    detached = lambda logits, answers, alts: logits[:, 0].detach() * 0  # noqa: E731
    with pytest.warns(NoEffectWarning, match="Every activation-patching effect is exactly 0"):
        activation_patch(model, data, options=SweepOptions(metric=detached, progress=False))
