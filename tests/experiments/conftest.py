"""A tiny random model saved as a model directory, so experiments run end to end in seconds."""

import pytest
import torch

from circuits.loading import save_model
from tests.tiny_models import tiny_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    model = tiny_model(style="gemma", n_layers=2, n_ctx=1024)  # character-level word problems are long
    digits = [model.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    with torch.no_grad():  # make the random model answer with digits, so some answers are right
        model.unembed.b_U[digits] += 20.0
    path = tmp_path_factory.mktemp("models") / "tiny"
    save_model(model, path)
    return path
