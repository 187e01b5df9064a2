import pytest
import torch

from circuits.nodes import MLP, Head
from circuits.testing import tiny_model
from finetune.masks import apply_selection, full_selection, kv_group, precise_selection


def _slices(sel):
    return {s.name: s for s in sel.slices}


def test_precise_selection_rows_under_mqa(tiny_gemma):
    sel = _slices(precise_selection(tiny_gemma, [Head(1, 2), Head(1, 0)], [MLP(0)]))
    assert sel["blocks.1.attn.W_Q"].index == (0, 2)
    assert sel["blocks.1.attn.W_O"].index == (0, 2)
    assert sel["blocks.1.attn.b_Q"].index == (0, 2)
    # one shared KV head: the whole (single-row) K/V tensors are tuned
    assert sel["blocks.1.attn._W_K"].index == (0,)
    assert sel["blocks.1.attn._b_V"].index == (0,)
    assert sel["blocks.1.attn.W_Q"].grad_scale == 4 / 2
    assert "blocks.1.attn.b_O" not in sel  # shared by all heads: not a head's parameter
    assert "blocks.0.attn.W_Q" not in sel
    assert sel["blocks.0.mlp.W_in"].index is None and sel["blocks.0.mlp.W_gate"].index is None
    assert not sel["blocks.0.mlp.b_in"].decay and sel["blocks.0.mlp.W_in"].decay


def test_gqa_kv_group_and_frozen_kv():
    model = tiny_model(style="llama", n_heads=4, n_key_value_heads=2)
    assert [kv_group(model, h) for h in range(4)] == [0, 0, 1, 1]
    sel = _slices(precise_selection(model, [Head(0, 3)]))
    assert sel["blocks.0.attn._W_K"].index == (1,)
    frozen = _slices(precise_selection(model, [Head(0, 3)], tune_kv=False))
    assert not any("_W_K" in n or "_W_V" in n for n in frozen)


def test_multi_head_attention_kv_rows_follow_heads(tiny):
    sel = _slices(precise_selection(tiny, [Head(0, 1), Head(0, 3)]))
    assert sel["blocks.0.attn.W_K"].index == (1, 3)
    assert sel["blocks.0.attn.b_V"].index == (1, 3)


def test_bad_nodes_are_rejected(tiny):
    with pytest.raises(ValueError, match="out of range"):
        precise_selection(tiny, [Head(5, 0)])
    with pytest.raises(ValueError, match="at least one"):
        precise_selection(tiny, [])


def test_grad_exactly_zero_outside_rows_and_rescaled_inside(tiny_gemma):
    tokens = torch.tensor([[1, 10, 20, 30, 40, 50]])
    raw = {}
    tiny_gemma(tokens).sum().backward()
    for n, p in tiny_gemma.named_parameters():
        raw[n] = p.grad.clone()
        p.grad = None
    sel = precise_selection(tiny_gemma, [Head(1, 1)])
    with apply_selection(tiny_gemma, sel):
        tiny_gemma(tokens).sum().backward()
        params = dict(tiny_gemma.named_parameters())
        assert params["embed.W_E"].grad is None and params["blocks.0.attn.W_Q"].grad is None
        g = params["blocks.1.attn.W_Q"].grad
        assert torch.count_nonzero(g[[0, 2, 3]]) == 0
        torch.testing.assert_close(g[1], raw["blocks.1.attn.W_Q"][1] * 4.0)
        torch.testing.assert_close(params["blocks.1.attn._W_K"].grad, raw["blocks.1.attn._W_K"] * 4.0)
    assert all(p.requires_grad for p in tiny_gemma.parameters())  # remove() restored the flags


def test_full_selection_freezes_embeddings_by_default(tiny):
    names = {s.name for s in full_selection(tiny).slices}
    assert "embed.W_E" not in names and "unembed.W_U" not in names and "pos_embed.W_pos" not in names
    assert "blocks.0.attn.W_Q" in names
    assert "embed.W_E" in {s.name for s in full_selection(tiny, train_embeddings=True).slices}
