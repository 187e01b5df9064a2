"""ABP masks on tiny random models: exactly the intended (query, key) pairs are blocked."""

import pytest
import torch
from transformer_lens import utils as tl_utils

from tests.tiny_models import tiny_model
from patching.all_for_one.abp import (
    abp_hooks,
    allowed_keys_mask,
    layer_peek_masks,
    mask_scores,
    peek_mask,
    per_head_mask,
)

N_POS = 7


def _tokens(model, n_pos=N_POS, batch=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, model.cfg.d_vocab, (batch, n_pos), generator=g)
    tokens[:, 0] = model.tokenizer.bos_token_id
    return tokens


def _patterns(model, tokens, masks):
    names = [tl_utils.get_act_name("pattern", l) for l in range(model.cfg.n_layers)]
    with model.hooks(fwd_hooks=abp_hooks(model, masks)):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    return [cache[n] for n in names]


def test_peek_mask_rules():
    m = peek_mask(4, last="full", others="self")
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, expected)
    s = peek_mask(4, last="self", others="self")
    assert s[-1].tolist() == [True, False, False, True]
    assert peek_mask(4, last="self", others="full")[:-1].all()
    assert peek_mask(3, last="self", keep_bos=False)[-1].tolist() == [False, False, True]
    with pytest.raises(ValueError, match="peek rule"):
        peek_mask(4, last="some")
    with pytest.raises(ValueError, match="n_pos"):
        peek_mask(0)


def test_allowed_keys_general_form():
    m = allowed_keys_mask(5, {-1: [2], 3: []}, default="full")
    assert m[4].tolist() == [True, False, True, False, True]
    assert m[3].tolist() == [True, False, False, True, False]
    assert m[2].all()  # default full for unlisted queries (causality is the model's job)
    with pytest.raises(ValueError, match="future"):
        allowed_keys_mask(5, {1: [3]})
    with pytest.raises(ValueError, match="out of range"):
        allowed_keys_mask(5, {7: [0]})


@pytest.mark.parametrize("style,kv", [("gpt2", None), ("llama", 2), ("gemma", None)])
def test_pattern_is_zero_exactly_where_blocked(style, kv):
    model = tiny_model(style=style, n_layers=2, n_key_value_heads=kv)
    tokens = _tokens(model)
    causal = torch.tril(torch.ones(N_POS, N_POS, dtype=torch.bool))
    no_peek_full_last = peek_mask(N_POS, last="full")
    # layer 1: heads 0 and 2 full peek, heads 1 and 3 self peek; different heads share a KV head here
    per_head = per_head_mask(4, [0, 2], no_peek_full_last, peek_mask(N_POS, last="self"))
    patterns = _patterns(model, tokens, {0: no_peek_full_last, 1: per_head})
    for pattern, allowed in ((patterns[0], no_peek_full_last[None].expand(4, -1, -1)), (patterns[1], per_head)):
        visible = allowed & causal
        assert (pattern[:, ~visible] == 0).all()
        assert (pattern[:, visible] > 0).all()
        assert torch.allclose(pattern.sum(-1), torch.ones(()))


def test_unmasked_layers_and_hooks_are_cleaned_up():
    model = tiny_model(style="gemma")
    tokens = _tokens(model)
    plain = model(tokens)
    with model.hooks(fwd_hooks=abp_hooks(model, {0: peek_mask(N_POS, last="full", others="full")})):
        same = model(tokens)
    assert torch.allclose(plain, same, atol=1e-6)
    masked = model.run_with_hooks(tokens, fwd_hooks=abp_hooks(model, {0: peek_mask(N_POS, last="self")}))
    assert not torch.allclose(plain, masked, atol=1e-4)
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())
    assert torch.allclose(model(tokens), plain)


def test_sliding_window_is_never_unmasked():
    model = tiny_model(style="gemma", n_layers=2)
    model.blocks[0].attn.attn_type = "local"
    model.cfg.window_size = 3
    tokens = _tokens(model)
    full = peek_mask(N_POS, last="full", others="full")
    pattern = _patterns(model, tokens, {0: full})[0]
    q = torch.arange(N_POS)[:, None]
    k = torch.arange(N_POS)[None, :]
    in_window = (k <= q) & (k > q - 3)
    assert (pattern[:, :, ~in_window] == 0).all()
    # the last token's full peek still cannot see BOS or early tokens outside the window
    pattern = _patterns(model, tokens, {0: peek_mask(N_POS, last="full")})[0]
    assert (pattern[:, :, -1, : N_POS - 3] == 0).all()
    assert (pattern[:, :, -1, N_POS - 3:] > 0).all()


def test_layer_peek_masks_per_head():
    model = tiny_model(style="llama", n_key_value_heads=2, n_layers=3)
    masks = layer_peek_masks(model, 5, layers=[1, 2], last="full", full_heads={1: [3]})
    assert masks[1].shape == (4, 5, 5)
    assert masks[1][3, -1].all() and not masks[1][0, -1].all()
    assert masks[2].shape == (5, 5) and masks[2][-1].all()


def test_bad_masks_give_clear_errors():
    model = tiny_model()
    tokens = _tokens(model)
    with pytest.raises(ValueError, match="prompt length"):
        model.run_with_hooks(tokens, fwd_hooks=abp_hooks(model, {0: peek_mask(N_POS + 1)}))
    with pytest.raises(ValueError, match="query heads"):
        abp_hooks(model, {0: torch.ones(3, N_POS, N_POS, dtype=torch.bool)})
    with pytest.raises(ValueError, match="out of range"):
        abp_hooks(model, {5: peek_mask(N_POS)})
    with pytest.raises(TypeError, match="boolean"):
        mask_scores(torch.zeros(1, 4, 3, 3), torch.ones(3, 3))
    with pytest.raises(ValueError, match="out of range"):
        per_head_mask(4, [4], peek_mask(3), peek_mask(3))
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())
