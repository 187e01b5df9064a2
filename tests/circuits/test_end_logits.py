"""circuits.end_logits: the END-only logits equal the last position of a full forward."""

import torch

from circuits import tasks
from circuits.end_logits import end_logits
from tests.tiny_models import tiny_model


def test_end_logits_equal_full_forward():
    model = tiny_model(style="gemma")
    ds = tasks.make_dataset(model, n_prompts=8, template_ids=("add-equation-0",), n_shots=0)
    batch = tasks.single_batch(ds)
    full = model(batch.tokens)[:, -1]
    assert torch.allclose(end_logits(model, batch.tokens), full, atol=1e-5)
    ids = torch.tensor([3, 5])
    assert torch.allclose(end_logits(model, batch.tokens, token_ids=ids), full[:, ids], atol=1e-5)
