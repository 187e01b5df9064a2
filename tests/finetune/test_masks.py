import pytest
import torch

from circuits.nodes import MLP, Head
from tests.tiny_models import tiny_model
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


# ---------------------------------------------------------------- tune_kv=False (Q and O slices only)

def _expected_rows_without_kv(model, heads):
    """What tune_kv=False may change, written out by hand: W_Q/b_Q/W_O rows of the heads, nothing else."""
    expected = {}
    for layer in sorted({h.layer for h in heads}):
        rows = tuple(sorted(h.head for h in heads if h.layer == layer))
        for short in ("W_Q", "b_Q", "W_O"):
            expected[f"blocks.{layer}.attn.{short}"] = rows
    return expected


@pytest.mark.parametrize("style, n_kv", [("gemma", None), ("llama", 2), ("llama", None)])
def test_without_kv_only_query_and_output_slices_change(style, n_kv, sft_rows):
    from finetune import TrainConfig
    from finetune.trainer import train

    model = tiny_model(style=style, n_layers=2, n_key_value_heads=n_kv)
    heads = [Head(0, 1), Head(1, 0), Head(1, 3)]
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    config = TrainConfig(lr=5e-3, batch_size=8, micro_batch_size=8, max_steps=3, progress=False, tune_kv=False)
    result = train(model, sft_rows, config, method="precise", heads=heads)
    expected = {n: rows for n, rows in _expected_rows_without_kv(model, heads).items() if n in before}
    assert {s.name: s.index for s in result.selection.slices} == expected
    for name, value in model.named_parameters():
        changed_rows = {r for r in range(value.shape[0]) if not torch.equal(value[r], before[name][r])}
        # every selected matrix row moves (biases may start at 0 and stay near it, but must not leave their rows)
        allowed = set(expected.get(name, ()))
        assert changed_rows <= allowed, f"{name}: rows {sorted(changed_rows - allowed)} changed outside the selection"
        if name.endswith(("W_Q", "W_O")) and name in expected:
            assert changed_rows == allowed, f"{name}: selected rows {sorted(allowed - changed_rows)} did not move"
    assert not any(("W_K" in n or "W_V" in n) for n in result.selection.names())


@pytest.mark.parametrize("style, n_kv", [("gemma", None), ("llama", 2)])
@pytest.mark.parametrize("tune_kv", [True, False])
def test_gradient_mask_counts_match_the_selection(style, n_kv, tune_kv):
    model = tiny_model(style=style, n_layers=2, n_key_value_heads=n_kv)
    heads = [Head(1, 0), Head(1, 3)]
    sel = precise_selection(model, heads, tune_kv=tune_kv)
    d_model, d_head = model.cfg.d_model, model.cfg.d_head
    n_kv_rows = 1 if n_kv is None and style == "gemma" else 2  # MQA: one KV head; GQA 2: heads 0 and 3 in both groups
    # by hand: Q and O of two heads (+ b_Q), and K, V of the KV heads they read (+ b_K, b_V)
    expected = 2 * (2 * d_model * d_head + d_head) + (2 * n_kv_rows * (d_model * d_head + d_head) if tune_kv else 0)
    assert sel.n_trainable(model) == expected
    with apply_selection(model, sel):
        model(torch.tensor([[1, 10, 20, 30, 40, 50, 60]])).float().pow(2).mean().backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert sum(int(torch.count_nonzero(g)) for g in grads.values()) == expected
        kv = [n for n in grads if "_W_K" in n or "_W_V" in n or "_b_K" in n or "_b_V" in n]
        assert bool(kv) == tune_kv
        q = grads["blocks.1.attn.W_Q"]
        assert torch.count_nonzero(q[[1, 2]]) == 0 and torch.count_nonzero(q[[0, 3]]) == q[[0, 3]].numel()
