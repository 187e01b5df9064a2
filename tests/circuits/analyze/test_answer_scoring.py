"""Answer scoring: first token, one-token answers, whole answer teacher-forced (tiny models)."""

from __future__ import annotations

import pytest
import torch

from circuits.analyze.answer_scoring import score_rows, scored_accuracy
from circuits.tasks import accuracy_mask, make_dataset
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(style="gemma", n_layers=2)
    data = make_dataset(model, n_prompts=10, n_shots=1, seed=3)

    def greedy(row, i):  # the model's own greedy continuation: 2 tokens for even rows, 1 for odd
        tokens = list(row["tokens"])
        for _ in range(2 - i % 2):
            tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
        return {"answer_token_ids": tokens[len(row["tokens"]):]}

    return model, data.map(greedy, with_indices=True)


def test_own_greedy_answers_are_all_correct(setup):
    model, data = setup
    assert score_rows(model, data, "whole") == [True] * 10
    assert score_rows(model, data, "first") == accuracy_mask(model, data) == [True] * 10
    assert score_rows(model, data, "one_token") == [None, True] * 5


def test_a_wrong_second_token_fails_only_the_whole_answer(setup):
    model, data = setup
    wrong = data.map(lambda r, i: {"answer_token_ids": r["answer_token_ids"][:1] + [(r["answer_token_ids"][-1] + 1) % 20]}
                     if i % 2 == 0 else {}, with_indices=True)
    assert score_rows(model, wrong, "first") == [True] * 10
    assert score_rows(model, wrong, "whole", batch_size=3) == [False, True] * 5
    estimate = scored_accuracy(model, wrong, "whole")
    assert estimate.value == 0.5 and estimate.n == 10 and estimate.low < 0.5 < estimate.high
    assert scored_accuracy(model, wrong, "one_token").n == 5


def test_unknown_scoring_is_refused(setup):
    model, data = setup
    with pytest.raises(ValueError, match="Unknown scoring"):
        score_rows(model, data, "last")
