"""Precise SFT on the real gemma-3-270m: two optimizer steps, untouched weights bit-identical."""

import copy

import pytest
import torch

from circuits.nodes import Head
from finetune import ArithmeticMix, TrainConfig, arithmetic_train_set, train


@pytest.mark.integration
def test_precise_sft_on_gemma_touches_only_the_key_heads(gemma, tmp_path):
    model = copy.deepcopy(gemma)  # the session fixture must stay unmodified
    data = arithmetic_train_set(model, ArithmeticMix(n_examples=8, n_shots=1, styles=("equation",)))
    heads = [Head(9, 1), Head(9, 3)]
    config = TrainConfig(lr=1e-4, batch_size=4, micro_batch_size=4, max_steps=2, progress=False)
    result = train(model, data, config, method="precise", heads=heads, out_dir=tmp_path)
    d_model, d_head = model.cfg.d_model, model.cfg.d_head
    # 2 x (W_Q, W_O, b_Q) slices + the shared K/V head of layer 9 (MQA)
    assert result.n_trainable == 2 * (2 * d_model * d_head + d_head) + 2 * (d_model * d_head + d_head)
    before, after = gemma.state_dict(), model.state_dict()
    for name, value in after.items():
        if name in ("blocks.9.attn.W_Q", "blocks.9.attn.W_O", "blocks.9.attn.b_Q"):
            assert torch.equal(value[[0, 2]], before[name][[0, 2]]), name
            assert not torch.equal(value[[1, 3]], before[name][[1, 3]]), name
        elif name.startswith("blocks.9.attn._"):
            assert not torch.equal(value, before[name]), name
        else:
            assert torch.equal(value, before[name]), name
    size = sum(f.stat().st_size for f in (tmp_path / "final").iterdir())
    assert size < 5 * 2**20  # slices only, not the 1.7 GB model
