"""patching.sweeps.metrics: the built-in metrics on hand-made logits; scoring from only the needed vocabulary columns gives
what the full unembedding gives; a metric must return one finite value per prompt."""

import pytest
import torch

from circuits.end_logits import unembed_end
from circuits.errors import InputError
from patching.sweeps.metrics import METRICS, PatchMetric, check_metric_values, get_metric, score_end
from tests.tiny_models import tiny_model


def test_built_in_metrics_on_hand_made_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    answers, alts = torch.tensor([2, 0]), torch.tensor([0, 1])
    assert METRICS["logit"].fn(logits, answers, None).tolist() == [3.0, 0.0]
    assert METRICS["logit_diff"].fn(logits, answers, alts).tolist() == [2.0, 0.0]
    probs = METRICS["prob"].fn(logits, answers, None)
    assert probs.tolist() == pytest.approx([torch.e**3 / (torch.e + torch.e**2 + torch.e**3), 1 / 3])
    assert METRICS["logprob"].fn(logits, answers, None).exp().tolist() == pytest.approx(probs.tolist())


@pytest.mark.parametrize("name", sorted(METRICS))
def test_scoring_from_the_needed_columns_equals_the_full_unembedding(name):
    model = tiny_model(style="gemma", n_layers=1)
    resid = torch.randn(5, model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    answers, alts = torch.tensor([7, 3, 7, 50, 3]), torch.tensor([3, 9, 60, 7, 3])  # repeats, shared ids
    metric = METRICS[name]
    with torch.no_grad():
        got = score_end(model, resid, answers, alts, metric)
        full = metric.fn(unembed_end(model, resid), answers, alts)
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


def test_get_metric_and_the_checks_on_values():
    def custom(logits, answers, alt):
        return logits[:, 0]

    assert get_metric("logit") is METRICS["logit"] and get_metric(METRICS["prob"]) is METRICS["prob"]
    wrapped = get_metric(custom)
    assert isinstance(wrapped, PatchMetric) and wrapped.full_vocab and wrapped.name == "custom"
    with pytest.raises(InputError, match="Unknown metric 'accuracy'"):
        get_metric("accuracy")
    with pytest.raises(TypeError, match="metric must be a name"):
        get_metric(3)
    with pytest.raises(InputError, match=r"returned \(\) for 2 prompts"):
        check_metric_values(wrapped, torch.tensor(1.0), 2)
    with pytest.raises(InputError, match="returned NaN/Inf for 1 of 2 prompts"):
        check_metric_values(wrapped, torch.tensor([1.0, float("inf")]), 2)
    model = tiny_model(n_layers=1)
    with pytest.raises(InputError, match="pass alt_ids"):
        score_end(model, torch.zeros(1, model.cfg.d_model), torch.tensor([1]), None, METRICS["logit_diff"])
