"""Answer scoring: first token, one-token answers, whole answer teacher-forced (tiny models)."""

from __future__ import annotations

import pytest
import torch

from circuits.answer_scoring import (
    answer_is_argmax, answer_is_top1, first_and_whole, first_token_hits, score_rows, scored_accuracy,
)
from circuits.end_logits import outscored, unembed_end
from circuits.errors import InputError
from circuits.tasks import make_dataset
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
    assert score_rows(model, data, "first") == first_token_hits(model, data) == [True] * 10
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


@pytest.mark.parametrize("screen", [True, False])
def test_a_hit_on_held_logits_is_the_hit_on_the_residual(screen):
    # answer_is_argmax (logits at hand) and answer_is_top1 (screened or not) are one comparison
    model = tiny_model(style="gemma", n_layers=2)
    resid = torch.randn(12, model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    logits = unembed_end(model, resid)
    answers = logits.argmax(-1)
    answers[::3] = (answers[::3] + 1) % model.cfg.d_vocab  # every third row misses
    on_logits = answer_is_argmax(logits, answers)
    assert on_logits.tolist() == [i % 3 != 0 for i in range(12)]
    assert torch.equal(on_logits, answer_is_top1(model, resid, answers, screen=screen))


@pytest.mark.parametrize("style", ["gemma", "gpt2"])
def test_rivals_decide_misses_without_changing_a_hit(style):
    # a plain reference: the full logits' argmax, row by row, against rivals that beat some answers and not others
    model = tiny_model(style=style, n_layers=2)
    resid = torch.randn(40, model.cfg.d_model, generator=torch.Generator().manual_seed(1)) * 3
    logits = unembed_end(model, resid)
    top2 = logits.topk(2, dim=-1).indices
    answers = top2[:, 0].clone()
    answers[1::2] = top2[1::2, 1]  # odd rows: the runner-up, a miss its winner decides
    rivals = torch.unique(top2[:20, 0])  # only the first rows' winners are rivals: later misses go to the full path
    stats = {}
    hits = answer_is_top1(model, resid, answers, rivals=rivals, screen=False, stats=stats)
    reference = [int(row.argmax()) == int(a) for row, a in zip(logits, answers)]
    assert hits.tolist() == reference == [i % 2 == 0 for i in range(40)]
    compared = set(rivals.tolist()) | set(answers.tolist())  # every row's answer is a rival of the others
    by_hand = sum(1 for i in range(40) if i % 2 and int(top2[i, 0]) in compared)
    assert stats["outscored"] == by_hand >= 10 and by_hand < 20
    assert stats["rows"] == 40 - by_hand  # only the undecided rows were unembedded in full


def test_a_rival_inside_rounding_of_the_answer_is_left_to_the_full_argmax():
    model = tiny_model(style="gemma", n_layers=2)
    resid = torch.randn(4, model.cfg.d_model, generator=torch.Generator().manual_seed(2))
    answers = unembed_end(model, resid).argmax(-1)
    with torch.no_grad():  # a rival column equal to the answer's, shifted by far less than float32 rounding
        model.W_U[:, 0] = model.W_U[:, int(answers[0])] * (1 + 1e-9)
    beaten = outscored(model, resid[:1], answers[:1], torch.tensor([0]))
    assert not beaten.any()


def test_answer_is_argmax_wants_one_answer_per_row():
    with pytest.raises(InputError, match="one answer per row"):
        answer_is_argmax(torch.zeros(3, 5), torch.zeros(2, dtype=torch.long))


@pytest.mark.parametrize("style", ["gemma", "gpt2"])
def test_one_teacher_forced_pass_equals_two_plain_scorings(style):
    # the model's own answers are not used: real answers, so some rows hit and some miss
    model = tiny_model(style=style, n_layers=2)
    data = make_dataset(model, n_prompts=40, n_shots=1, seed=5, operand_range=(0, 30))
    first, whole = first_and_whole(model, data, batch_size=7)
    assert first == first_token_hits(model, data)
    plain_whole = []
    for row in data:  # full logits of prompt + answer, one row at a time
        tokens = torch.tensor([row["tokens"] + row["answer_token_ids"][:-1]])
        predicted = model(tokens)[0, len(row["tokens"]) - 1:].argmax(-1)
        plain_whole.append(predicted.tolist() == row["answer_token_ids"])
    assert whole == plain_whole


@pytest.mark.integration
def test_one_pass_scoring_on_gemma_equals_the_plain_full_logits(gemma):
    # plain: one full forward per row, the full float32 logits, argmax at every answer position
    data = make_dataset(gemma, op="+", n_prompts=48, n_shots=3, seed=11)
    first, whole = first_and_whole(gemma, data)
    plain_first, plain_whole = [], []
    with torch.no_grad():
        for row in data:
            tokens = torch.tensor([row["tokens"] + row["answer_token_ids"][:-1]])
            resid = gemma(tokens, stop_at_layer=gemma.cfg.n_layers)[0, len(row["tokens"]) - 1:]
            predicted = unembed_end(gemma, resid).argmax(-1).tolist()
            plain_first.append(predicted[0] == row["answer_token_ids"][0])
            plain_whole.append(predicted == row["answer_token_ids"])
    assert first == plain_first and whole == plain_whole
    assert 0 < sum(whole) < sum(first) < len(data)  # both hits and misses, so equality says something
