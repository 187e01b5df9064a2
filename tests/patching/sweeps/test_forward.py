"""patching.sweeps.forward: the shared-prefix length of a batch, tiled prefix KV caches and their memory budget."""

from __future__ import annotations

import torch

from patching.sweeps import forward
from tests.tiny_models import tiny_model


def test_shared_prefix_length():
    from patching.sweeps.forward import shared_prefix_length

    ref = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]])
    cf = torch.tensor([[1, 2, 3, 9, 5], [1, 2, 9, 4, 5]])
    assert shared_prefix_length(ref, cf) == 2  # the earliest difference over the batch
    assert shared_prefix_length(ref, ref) == 4  # identical twins: END is still run


def test_tiled_prefix_cache_and_its_memory_budget():
    from circuits.prefix_cache import TiledKVCache, prefix_kv_cache
    from patching.sweeps.forward import rows_per_chunk

    model = tiny_model(style="llama", n_key_value_heads=2, n_layers=2)
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 5))
    entries = prefix_kv_cache(model, tokens)
    assert entries[0].past_keys.shape == (2, 5, 2, model.cfg.d_head)
    tiled = TiledKVCache(entries, 3)
    assert len(tiled) == 2
    entry = tiled[1]
    assert entry.frozen and entry.past_keys.shape[0] == 6
    torch.testing.assert_close(entry.past_values[4], entries[1].past_values[0])  # row i * batch + b
    # a long cached prefix takes room from the batched patches
    assert rows_per_chunk(model, 1.0, 4, cached_pos=400) < rows_per_chunk(model, 1.0, 4)


@torch.no_grad()
def test_weights_stored_transposed_give_the_same_logits_and_nest():
    model = tiny_model(style="gemma", n_layers=2)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 7), generator=torch.Generator().manual_seed(0))
    plain = model(tokens)
    W_in = model.blocks[0].mlp.W_in
    with forward.transposed_weight_storage(model):
        assert W_in.T.is_contiguous()  # TransformerLens' per-call W.T.contiguous() is then the stored tensor
        with forward.transposed_weight_storage(model):
            pass
        assert W_in.T.is_contiguous()  # an inner block leaves the outer block's storage
        torch.testing.assert_close(model(tokens), plain, rtol=0, atol=0)
    assert W_in.is_contiguous() and not W_in.T.is_contiguous()  # restored on exit
    torch.testing.assert_close(model(tokens), plain, rtol=0, atol=0)
