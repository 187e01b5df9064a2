"""Fixtures of the edge-circuit tests: a tiny model and prompts of one token length."""

import pytest

from circuits.tasks import make_dataset
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def one_length_prompts():
    """A tiny gemma-style model and its one-shot prompts of the most common token length (no padding in a batch)."""
    model = tiny_model(style="gemma", n_layers=2, n_heads=4, seed=3)
    data = make_dataset(model, n_prompts=120, n_shots=1, seed=2)
    lengths = [len(t) for t in data["tokens"]]
    n = max(set(lengths), key=lengths.count)
    return model, data.filter(lambda r: len(r["tokens"]) == n)
