"""patching.sweeps.task_metrics: each task metric against a computation by hand on a tiny model's END logits,
and the metrics through edge attribution and circuit evaluation."""

from __future__ import annotations

import pytest
import torch

from circuits.classic_tasks import GreaterThanConfig, IOIConfig, make_greater_than, make_ioi
from circuits.errors import InputError
from circuits.pair_tasks import PairTask
from patching import SweepOptions
from patching.edges import edge_attribution, evaluate_circuit
from patching.sweeps.task_metrics import full_logprobs, keep_solved, prob_diff_metric, row_metric, task_metric
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model(style="gemma", n_layers=2, seed=1)


def _end_logits(model, row) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([row["tokens"]]))[0, -1].double()


def test_logit_diff_and_logit_by_hand(model):
    task = make_ioi(model, IOIConfig(n_prompts=4))
    diff = row_metric(model, task.rows, task_metric(task)[0])
    logit = row_metric(model, task.rows, task_metric(PairTask("ioi", task.rows, "logit"))[0])
    for i, row in enumerate(task.rows):
        end = _end_logits(model, row)
        answer, alt = row["answer_token_ids"][0], row["alt_token_id"]
        assert float(diff[i]) == pytest.approx(float(end[answer] - end[alt]), abs=1e-4)
        assert float(logit[i]) == pytest.approx(float(end[answer]), abs=1e-4)


def test_prob_diff_by_hand(model):
    task = make_greater_than(model, GreaterThanConfig(n_prompts=4, decade_ends=False, seed=2))
    values = row_metric(model, task.rows, task_metric(task)[0])
    for i, row in enumerate(task.rows):
        probs = _end_logits(model, row).softmax(-1)
        first = row["year"] // 10
        above = sum(float(probs[t]) for t in task.ordered_ids[first + 1:])
        below = sum(float(probs[t]) for t in task.ordered_ids[:first + 1])
        assert float(values[i]) == pytest.approx(above - below, abs=1e-5)


def test_prob_diff_refuses_an_answer_outside_the_candidates():
    metric = prob_diff_metric([3, 4, 5])
    with pytest.raises(InputError, match="not among the ordered candidates"):
        metric.fn(torch.zeros(1, 10), torch.tensor([7]), None)
    with pytest.raises(InputError, match="at least two distinct candidate"):
        prob_diff_metric([3, 3])


def test_kl_by_hand_and_zero_for_the_full_model(model):
    task = make_ioi(model, IOIConfig(n_prompts=3))
    metric, keyed = task_metric(PairTask("ioi", task.rows, "kl"), model)
    assert keyed["answer_token_ids"] == [[0], [1], [2]]
    assert row_metric(model, keyed, metric).abs().max() < 1e-5  # the full model is its own reference
    full = full_logprobs(model, task.rows).double()
    other = torch.randn(3, model.cfg.d_vocab_out, generator=torch.Generator().manual_seed(0))
    by_hand = (full.exp() * (full - other.double().log_softmax(-1))).sum(-1)
    assert torch.allclose(metric.fn(other, torch.arange(3), None).double(), -by_hand, atol=1e-5)
    with pytest.raises(InputError, match="pass the model"):
        task_metric(PairTask("ioi", task.rows, "kl"))


def test_task_metrics_drive_attribution_and_circuit_evaluation(model):
    for task in (make_ioi(model, IOIConfig(n_prompts=4)), make_greater_than(model, GreaterThanConfig(n_prompts=4))):
        metric, rows = task_metric(task, model)
        options = SweepOptions(metric=metric, progress=False)
        scores = edge_attribution(model, rows, method="EAP-IG-inputs", ig_steps=2, options=options)
        assert scores.meta["metric"] == task.metric
        assert scores.meta["reference_metric"] == pytest.approx(float(row_metric(model, rows, metric).mean()),
                                                                abs=1e-4)
        real = scores.layout.real_edge_mask
        full, empty = (evaluate_circuit(model, mask, rows, options=options) for mask in (real, torch.zeros_like(real)))
        assert full.metric == metric.name and full.mean == pytest.approx(scores.meta["reference_metric"], abs=1e-4)
        twins = rows.map(lambda r: {"tokens": r["cf_tokens"]})  # the empty circuit is the counterfactual run
        assert empty.mean == pytest.approx(float(row_metric(model, twins, metric).mean()), abs=1e-4)


def test_keep_solved_keeps_positive_rows(model):
    task = make_ioi(model, IOIConfig(n_prompts=10))
    kept, share = keep_solved(model, task)
    values = row_metric(model, task.rows, task_metric(task)[0])
    assert len(kept.rows) == int((values > 0).sum()) and share == pytest.approx(float((values > 0).float().mean()))
    assert (row_metric(model, kept.rows, task_metric(kept)[0]) > 0).all()


def test_a_task_the_model_solves_nowhere_is_refused(model):
    task = make_ioi(model, IOIConfig(n_prompts=6))
    solved = (row_metric(model, task.rows, task_metric(task)[0]) > 0).tolist()

    def unsolved(row, i):  # the answer and the distractor swapped where the model prefers the answer
        if not solved[i]:
            return {}
        return {"answer_token_ids": [row["alt_token_id"]], "alt_token_id": row["answer_token_ids"][0]}

    flipped = PairTask("ioi", task.rows.map(unsolved, with_indices=True), "logit_diff")
    with pytest.raises(InputError, match="The model solves none of the 6 rows of task 'ioi'"):
        keep_solved(model, flipped)


def test_learned_circuits_train_on_the_task_metric(model):
    """The "metric" objective scores the metric handed on (faithfulness is judged by it), not the answer logit."""
    from patching.edges.learn import learn_circuit

    task = make_ioi(model, IOIConfig(n_prompts=4))
    metric, rows = task_metric(task, model)
    runs = {name: learn_circuit(model, rows, metric=m, method="top-n", steps=2, batch_size=4, progress=False)
            for name, m in (("logit", "logit"), ("logit_diff", metric))}
    assert runs["logit"].faithfulness != runs["logit_diff"].faithfulness
    same = learn_circuit(model, rows, metric="logit_diff", method="top-n", steps=2, batch_size=4, progress=False)
    assert same.faithfulness == pytest.approx(runs["logit_diff"].faithfulness)


def test_two_digit_prob_diff_by_hand(model):
    from patching.sweeps.task_metrics import two_digit_prob_diff

    task = make_greater_than(model, GreaterThanConfig(n_prompts=2, decade_ends=False, seed=5))
    values = two_digit_prob_diff(model, task.rows, task.ordered_ids)
    for i, row in enumerate(task.rows):
        with torch.no_grad():
            first = model(torch.tensor([row["tokens"]]))[0, -1].double().softmax(-1)
            total = 0.0
            for d, digit in enumerate(task.ordered_ids):
                second = model(torch.tensor([row["tokens"] + [digit]]))[0, -1].double().softmax(-1)
                for e, other in enumerate(task.ordered_ids):
                    p = float(first[digit] * second[other])
                    total += p if 10 * d + e > row["year"] else -p
        assert float(values[i]) == pytest.approx(total, abs=1e-5)
    with pytest.raises(InputError, match="needs the ten digit tokens in order"):
        two_digit_prob_diff(model, task.rows, task.ordered_ids[:5])


@pytest.mark.integration
def test_on_gemma_the_one_forward_greater_than_metric_is_the_chain_rule_at_decade_ends(gemma):
    """gemma writes a year's digits as two tokens; where YY ends in 9 the first digit decides (circuits.classic_tasks)."""
    from patching.sweeps.task_metrics import two_digit_prob_diff

    task = make_greater_than(gemma, GreaterThanConfig(n_prompts=4))
    one = row_metric(gemma, task.rows, task_metric(task)[0])
    two = two_digit_prob_diff(gemma, task.rows, task.ordered_ids)
    assert (one - two).abs().max() < 0.01  # what is left: the mass on a second token that is not a digit
