"""circuits.prefix_cache: a prefix's keys/values computed once, extended, and tiled, equal a plain forward."""

import torch

from circuits.prefix_cache import PrefixCache, TiledKVCache, prefix_kv_cache
from tests.tiny_models import tiny_model


def test_an_extended_prefix_equals_the_prefix_computed_whole():
    model = tiny_model(style="gemma", n_layers=2)
    tokens = torch.randint(5, model.cfg.d_vocab, (3, 12), generator=torch.Generator().manual_seed(0))
    tokens[:, :8] = tokens[0, :8]  # the three rows share 8 positions
    cache = PrefixCache(model)
    short = cache(tokens[:1, :5])
    extended = cache(tokens[:1, :8])  # runs positions 5..7 only, on top of the cached five
    assert len(cache.entries) == 2 and cache(tokens[:1, :5]) is short
    for got, want in zip(extended, prefix_kv_cache(model, tokens[:1, :8])):
        assert torch.allclose(got.past_keys, want.past_keys, atol=1e-5)
        assert torch.allclose(got.past_values, want.past_values, atol=1e-5)
    with torch.no_grad():
        x = model(tokens, stop_at_layer=0)[:, 8:]
        suffix = model(x, start_at_layer=0, past_kv_cache=TiledKVCache(extended, 3))
        assert torch.allclose(suffix, model(tokens)[:, 8:], atol=1e-4)


def test_a_models_prefix_cache_is_renewed_when_a_weight_changes():
    from circuits.prefix_cache import model_prefix_cache

    model = tiny_model(style="gemma", n_layers=2)
    tokens = torch.randint(5, model.cfg.d_vocab, (1, 6), generator=torch.Generator().manual_seed(1))
    cache = model_prefix_cache(model)
    before = cache(tokens)[1].past_keys.clone()  # layer 1 keys depend on layer 0 attention
    assert model_prefix_cache(model) is cache
    with torch.no_grad():
        model.blocks[0].attn.W_Q.mul_(2.0)  # fine-tuning changes weights in place: stale keys would be wrong
    renewed = model_prefix_cache(model)
    assert renewed is not cache and not torch.allclose(renewed(tokens)[1].past_keys, before)


def test_hooks_attached_to_the_model_are_not_baked_into_a_cached_prefix():
    from circuits.prefix_cache import run_after_shared_prefix

    model = tiny_model(style="gemma", n_layers=2)
    tokens = torch.randint(5, model.cfg.d_vocab, (3, 12), generator=torch.Generator().manual_seed(2))
    tokens[:, :8] = tokens[0, :8]
    plain_shared, _ = run_after_shared_prefix(model, tokens)  # caches the prefix of the unhooked model
    zero_head = ("blocks.0.attn.hook_z", lambda z, hook: z * 0)
    with torch.no_grad(), model.hooks(fwd_hooks=[zero_head]):  # an ablation context around a whole analysis
        shared, n = run_after_shared_prefix(model, tokens)
        plain = model(tokens, stop_at_layer=model.cfg.n_layers)[:, n:]
    assert n == 8 and torch.allclose(shared, plain, atol=1e-4) and not torch.allclose(shared, plain_shared, atol=1e-4)


def test_the_batch_common_prefix_is_where_every_row_agrees():
    from circuits.prefix_cache import batch_common_prefix_length

    tokens = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 9, 5], [1, 2, 3, 4, 6]])
    assert batch_common_prefix_length(tokens) == 3  # the rows part at position 3
    assert batch_common_prefix_length(tokens, limit=2) == 2
    assert batch_common_prefix_length(tokens[:1]) == 4  # one row: all but the last position
