"""finetune.lora: LoRA on TransformerLens parameters trains and merges back into a plain model."""

import torch

from tests.tiny_models import tiny_model
from finetune import TrainConfig
from finetune.trainer import train


CFG = TrainConfig(lr=5e-3, batch_size=8, micro_batch_size=4, max_steps=6, weight_decay=0.1, progress=False)


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_lora_merges_back_to_plain_model(sft_rows):
    model = tiny_model(style="gemma")
    before = _state(model)
    result = train(model, sft_rows, CFG, method="lora")
    assert set(model.state_dict()) == set(before)  # peft wrappers are gone, names unchanged
    changed = {n for n, v in model.state_dict().items() if not torch.equal(v, before[n])}
    assert changed == {s.name for s in result.selection.slices}
    assert "blocks.0.attn._W_K" in changed and "embed.W_E" not in changed
    assert result.n_trainable < sum(v.numel() for v in before.values()) / 2
