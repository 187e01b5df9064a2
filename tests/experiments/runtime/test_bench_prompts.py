"""experiments.runtime.bench_prompts: the benchmarks' one-length prompt batches."""

import pytest

from circuits.errors import InputError
from experiments.runtime.bench_prompts import one_length_prompts
from tests.tiny_models import tiny_model


def test_one_length_prompts_keeps_one_token_length():
    model = tiny_model(n_layers=1)
    data = one_length_prompts(model, op="+", n_prompts=6, n_shots=2, seed=0)
    assert len(data) == 6 and len(set(data["end_pos"])) == 1


def test_one_length_prompts_refuses_a_short_batch_with_what_to_do():
    model = tiny_model(n_layers=1)
    # A random model answers almost nothing correctly: asking for correct prompts only leaves too few.
    with pytest.raises(InputError, match="lower --n-prompts"):
        one_length_prompts(model, op="+", n_prompts=40, n_shots=2, seed=0, correct_only=True)
