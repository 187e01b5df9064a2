"""Input contracts of the patching and task entry points: what used to give garbage, a silent default or a raw
library error now gives a clear `InputError` that says what to do.

Cross-cutting: the input contract of the sweeps of patching, of circuits.tasks and of the AF1 entry points."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from circuits.errors import InputError
from circuits.analyze.probes import ProbeConfig
from circuits.answer_scoring import first_token_accuracy
from circuits.tasks import TaskConfig, make_dataset
from circuits.errors import TaskDataError
from tests.tiny_models import tiny_model
from patching.all_for_one import AF1Config
from patching.all_for_one.template_prompts import make_template_dataset
from patching.node_level.attribution_patching import attribution_patch
from patching.node_level.knockout_curves import knockout
from patching.node_level.path_patching import path_patch
from patching.node_level.head_ranking import key_heads
from patching import SweepOptions
from circuits.templates import template_by_id


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(style="gemma", n_layers=2)
    return model, make_dataset(model, n_prompts=4, n_shots=0, seed=1)


def _mean_logit(logits, answers, alt):  # a common mistake: averaging over the batch inside the metric
    return logits.gather(-1, answers[:, None]).mean()


@pytest.mark.parametrize("method", ["hooks", "fast"])
def test_metric_of_the_wrong_shape_is_refused_by_path_patching(setup, method):
    model, data = setup
    with pytest.raises(InputError, match=r"returned \(\) for \d+ prompts; a metric must return one value per prompt"):
        path_patch(model, data, options=SweepOptions(metric=_mean_logit, progress=False), method=method)


def test_metric_of_the_wrong_shape_is_refused_by_attribution_patching(setup):
    model, data = setup
    with pytest.raises(InputError, match="a metric must return one value per prompt"):
        attribution_patch(model, data, options=SweepOptions(metric=_mean_logit, progress=False))
    with pytest.raises(InputError, match="a metric must return one value per prompt"):
        attribution_patch(model, data, options=SweepOptions(metric=lambda lg, a, alt: lg[:, :2], progress=False))


def test_nan_metric_is_an_error_not_an_empty_circuit(setup):
    model, data = setup
    with pytest.raises(InputError, match="returned NaN/Inf"):
        path_patch(model, data,
                   options=SweepOptions(metric=lambda lg, a, alt: torch.full((len(a),), float("nan")), progress=False))
    scores = path_patch(model, data, options=SweepOptions(progress=False))
    broken = dataclasses.replace(scores, heads=torch.full_like(scores.heads, float("nan")), baseline=float("nan"))
    with pytest.raises(InputError, match="no key heads can be chosen"):
        key_heads(broken)
    with pytest.raises(InputError, match="no key heads can be chosen"):
        key_heads(broken, top_k=3)


@pytest.mark.parametrize("bad", [0, -2])
def test_batch_size_below_one_is_refused_everywhere(setup, bad):
    model, data = setup
    message = rf"batch_size must be an integer >= 1, got {bad}"
    with pytest.raises(InputError, match=message):
        path_patch(model, data, options=SweepOptions(batch_size=bad, progress=False))
    with pytest.raises(InputError, match=message):
        attribution_patch(model, data, options=SweepOptions(batch_size=bad, progress=False))
    with pytest.raises(InputError, match=message):
        first_token_accuracy(model, data, batch_size=bad)
    with pytest.raises(InputError, match=message):
        knockout(model, data, [], options=SweepOptions(batch_size=bad))
    with pytest.raises(InputError, match=message):
        ProbeConfig(batch_size=bad)
    with pytest.raises(InputError, match=message):
        AF1Config(tail_batch_size=bad)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"styles": ()}, "styles is empty"),
        ({"template_ids": ()}, "template_ids is empty"),
        ({"operand_range": (9, 0)}, r"operand_range must be two integers \(lo, hi\) with lo <= hi, got \(9, 0\)"),
        ({"decimals": -1}, "decimals must be an integer >= 0, got -1"),
        ({"n_prompts": 2.5}, "n_prompts must be an integer >= 1, got 2.5"),
        ({"n_prompts": 0}, "n_prompts must be an integer >= 1, got 0"),
        ({"n_shots": -3}, "n_shots must be an integer >= 0, got -3"),
    ],
)
def test_bad_task_settings_are_refused(setup, overrides, message):
    model, _ = setup
    with pytest.raises(InputError, match=message):
        make_dataset(model, **overrides)
    with pytest.raises(InputError, match=message):
        TaskConfig(**overrides)


def test_af1_template_data_checks_its_arguments(setup):
    model, _ = setup
    template = template_by_id("add-equation-0")
    with pytest.raises(InputError, match="n_shots must be an integer >= 0, got -1"):
        make_template_dataset(model, [template], 4, n_shots=-1)
    with pytest.raises(InputError, match=r"lo <= hi, got \(9, 0\)"):
        make_template_dataset(model, [template], 4, operand_range=(9, 0))


def test_negative_answers_blame_the_minus_sign_merging(gemma_tokenizer):
    with pytest.raises(TaskDataError, match=r"merges the prompt's last token ' ' with the answer's minus sign into ' -'"):
        make_dataset(gemma_tokenizer, op="-", n_prompts=20, allow_negative=True, styles=("equation",), n_shots=0)


@pytest.fixture(scope="module")
def gemma_tokenizer():
    from transformers import AutoTokenizer

    from circuits.loading import default_cache_dir

    path = default_cache_dir() / "gemma-3-270m" / "tokenizer"
    if not path.is_dir():
        pytest.skip("the gemma-3-270m cache is not built on this machine")
    return AutoTokenizer.from_pretrained(str(path))
