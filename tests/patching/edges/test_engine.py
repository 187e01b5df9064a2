"""Senders' outputs add up to every receiver's input (the edge graph's convention), on gpt2-, llama- and gemma-style models."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from circuits.graph import GraphLayout
from tests.tiny_models import char_tokenizer, tiny_model
from patching.edges.engine import (
    UnsupportedModelError, edge_mode, edge_prefix_kv, receiver_hooks, sender_outputs,
)

STYLES = {
    "gpt2": dict(style="gpt2"),
    "llama_gqa": dict(style="llama", n_key_value_heads=2),
    "gemma_mqa": dict(style="gemma"),
}


def _model(name: str, **kw) -> HookedTransformer:
    model = tiny_model(n_layers=3, seed=1, **STYLES[name], **kw)
    if name == "gpt2":  # non-zero attention biases: they must reach the receivers as constants
        with torch.no_grad():
            for block in model.blocks:
                block.attn.b_O.normal_(0, 0.5)
    return model


def _tokens(model, n=3, pos=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.cfg.d_vocab, (n, pos), generator=g)


def _receiver_inputs(model, tokens) -> dict[int, torch.Tensor]:
    """Every receiver's actual input, read at its hook in a plain run under edge_mode."""
    hooks = receiver_hooks(model)
    store: dict[str, torch.Tensor] = {}

    def keep(act, *, hook):
        store[hook.name] = act.clone()

    with edge_mode(model):
        model.run_with_hooks(tokens, fwd_hooks=[(n, keep) for n in sorted({n for n, _ in hooks})])
    return {b: store[name] if head is None else store[name][:, :, head] for b, (name, head) in enumerate(hooks)}


@pytest.mark.parametrize("name", STYLES)
def test_sender_outputs_sum_to_every_receiver_input(name):
    model = _model(name)
    tokens = _tokens(model)
    layout = GraphLayout.of(model)
    outputs = sender_outputs(model, tokens)
    assert outputs.shape == (layout.n_forward, *tokens.shape, model.cfg.d_model)
    inputs = _receiver_inputs(model, tokens)
    for b in range(layout.n_backward):
        limit = layout.forward_limit(b)
        # constant biases: b_O of every attention layer whose heads feed this receiver
        n_attn_layers = sum(1 for layer in range(layout.n_layers) if layout.head_forward(layer, 0) < limit)
        bias = sum((model.blocks[layer].attn.b_O for layer in range(n_attn_layers)), torch.zeros(model.cfg.d_model))
        expected = outputs[:limit].sum(0) + bias
        torch.testing.assert_close(expected, inputs[b], atol=2e-5, rtol=1e-4,
                                   msg=lambda m: f"{layout.backward_names[b]}: {m}")


@pytest.mark.parametrize("name", STYLES)
def test_head_outputs_equal_hook_result_under_the_norm_convention(name):
    """z·W_O (post-norm: times w / that run's ln1_post scale) equals TL's own hook_result scaled the same way."""
    model = _model(name)
    tokens = _tokens(model)
    layout = GraphLayout.of(model)
    outputs = sender_outputs(model, tokens)
    names = [f"blocks.{l}.attn.hook_result" for l in range(layout.n_layers)]
    names += [f"blocks.{l}.ln1_post.hook_scale" for l in range(layout.n_layers)] if model.cfg.use_normalization_before_and_after else []
    with edge_mode(model, attn_result=True):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    for layer in range(layout.n_layers):
        result = cache[f"blocks.{layer}.attn.hook_result"]
        if model.cfg.use_normalization_before_and_after:
            result = result / cache[f"blocks.{layer}.ln1_post.hook_scale"][:, :, None] * model.blocks[layer].ln1_post.w
        for head in range(layout.n_heads):
            torch.testing.assert_close(outputs[layout.head_forward(layer, head)], result[:, :, head], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", STYLES)
def test_sender_outputs_from_a_cached_prefix_match_the_full_run(name):
    model = _model(name)
    tokens = _tokens(model)
    tokens[:, :5] = tokens[0, :5]  # a shared prefix, as few-shot prompts have
    full = sender_outputs(model, tokens)
    for mode in (False, True):
        with (edge_mode(model) if mode else torch.no_grad()):
            suffix = sender_outputs(model, tokens, start=5, prefix_kv=edge_prefix_kv(model, tokens[:, :5]))
        torch.testing.assert_close(suffix, full[:, :, 5:], atol=2e-5, rtol=1e-4)


def test_edge_mode_sets_and_restores_flags_even_on_error():
    model = _model("gemma_mqa")
    flags = ("use_split_qkv_input", "ungroup_grouped_query_attention", "use_hook_mlp_in", "use_attn_result")
    before = {f: getattr(model.cfg, f) for f in flags}
    with pytest.raises(RuntimeError, match="inside"):
        with edge_mode(model, attn_result=True):
            assert all(getattr(model.cfg, f) for f in flags)
            with edge_mode(model):  # nesting keeps the outer block's flags
                pass
            assert all(getattr(model.cfg, f) for f in flags)
            raise RuntimeError("inside")
    assert {f: getattr(model.cfg, f) for f in flags} == before


def test_receiver_hooks_follow_the_backward_layout():
    model = _model("llama_gqa")
    layout = GraphLayout.of(model)
    hooks = receiver_hooks(model)
    assert len(hooks) == layout.n_backward
    assert hooks[layout.head_backward(1, 2, "k")] == ("blocks.1.hook_k_input", 2)
    assert hooks[layout.mlp_backward(2)] == ("blocks.2.hook_mlp_in", None)
    assert hooks[layout.logits_backward] == ("blocks.2.hook_resid_post", None)


def test_unsupported_models_are_refused_with_a_reason():
    gemma = _model("gemma_mqa")
    with torch.no_grad():
        gemma.blocks[1].attn.b_O.fill_(0.1)
    with pytest.raises(UnsupportedModelError, match="non-zero attention bias b_O"):
        with edge_mode(gemma):
            pass
    cfg = HookedTransformerConfig(n_layers=1, d_model=8, d_head=4, n_heads=2, n_ctx=16, d_vocab=10, attn_only=True,
                                  act_fn="gelu")
    with pytest.raises(UnsupportedModelError, match="attention-only"):
        sender_outputs(HookedTransformer(cfg), torch.zeros(1, 3, dtype=torch.long))
    assert issubclass(UnsupportedModelError, ValueError)


def test_parallel_attention_mlp_blocks_add_up_too():
    cfg = HookedTransformerConfig(n_layers=2, d_model=16, d_head=4, n_heads=4, n_ctx=32, d_vocab=len(char_tokenizer().get_vocab()),
                                  d_mlp=32, act_fn="gelu_new", normalization_type="LN", parallel_attn_mlp=True, seed=0)
    model = HookedTransformer(cfg, tokenizer=char_tokenizer())
    tokens = _tokens(model)
    layout = GraphLayout.of(model)
    outputs = sender_outputs(model, tokens)
    inputs = _receiver_inputs(model, tokens)
    for b in range(layout.n_backward):
        torch.testing.assert_close(outputs[:layout.forward_limit(b)].sum(0), inputs[b], atol=2e-5, rtol=1e-4)
