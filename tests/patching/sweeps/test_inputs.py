"""patching.sweeps.inputs: every accepted prompt form becomes the same groups of equal token length."""

import pytest
import torch

from circuits.errors import InputError
from circuits.tasks import make_dataset, single_batch
from patching.sweeps.inputs import prompt_groups
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(n_layers=1)
    return model, make_dataset(model, n_prompts=12, n_shots=0, seed=5)


def test_a_dataset_is_grouped_by_token_length_and_keeps_every_prompt(setup):
    model, data = setup
    groups = prompt_groups(model, data, alt_ids=4)
    assert sum(len(g) for g in groups) == len(data) and len(groups) == len(set(data["end_pos"]))
    for g in groups:
        assert g.tokens.shape == g.cf_tokens.shape and g.answer_ids.shape == (len(g),)
        assert g.alt_ids.tolist() == [4] * len(g)
    answers = sorted(a for g in groups for a in g.answer_ids.tolist())
    assert answers == sorted(r["answer_token_ids"][0] for r in data)
    assert sum(len(g) for g in prompt_groups(model, data, batch_size=2)) == len(data)
    assert all(len(g) <= 2 for g in prompt_groups(model, data, batch_size=2))


def test_a_batch_and_its_tensors_give_the_same_group(setup):
    model, data = setup
    batch = single_batch(data.filter(lambda r: r["template_id"] == data[0]["template_id"]
                                     and r["end_pos"] == data[0]["end_pos"]))
    (from_batch,) = prompt_groups(model, batch)
    chunks = prompt_groups(model, batch.tokens, batch.cf_tokens, answer_ids=batch.answer_ids, batch_size=1)
    assert len(chunks) == len(batch)
    assert torch.equal(torch.cat([c.tokens for c in chunks]), from_batch.tokens)
    assert torch.equal(torch.cat([c.answer_ids for c in chunks]), from_batch.answer_ids)
    (one_id,) = prompt_groups(model, batch.tokens, batch.cf_tokens, answer_ids=5)
    assert one_id.answer_ids.tolist() == [5] * len(batch)


def test_mismatched_forms_are_refused(setup):
    model, data = setup
    batch = single_batch(data.select([0]))
    with pytest.raises(InputError, match="counterfactual comes from its cf_tokens column"):
        prompt_groups(model, data, batch.cf_tokens)
    with pytest.raises(InputError, match="must both be \\[batch, pos\\] with the same shape"):
        prompt_groups(model, batch.tokens, batch.cf_tokens[:, :-1], answer_ids=1)
    with pytest.raises(InputError, match="pass answer_ids"):
        prompt_groups(model, batch.tokens, batch.cf_tokens)
    with pytest.raises(InputError, match="outside the vocabulary"):
        prompt_groups(model, batch.tokens, batch.cf_tokens, answer_ids=model.cfg.d_vocab)
    with pytest.raises(TypeError, match="reference must be a Dataset"):
        prompt_groups(model, ["1 + 2 = "])


def test_no_prompts_too_long_prompts_and_wrong_types_are_input_errors(setup):
    from circuits.errors import InputTypeError

    model, data = setup
    batch = single_batch(data.select([0]))
    with pytest.raises(InputError, match="no prompt"):
        prompt_groups(model, batch.tokens[:0], batch.cf_tokens[:0], answer_ids=3)
    long = torch.zeros((1, model.cfg.n_ctx + 1), dtype=torch.long)
    with pytest.raises(InputError, match=rf"longer than the model's context \({model.cfg.n_ctx} positions\)"):
        prompt_groups(model, long, long + 1, answer_ids=3)
    with pytest.raises(InputTypeError, match="reference must be a Dataset"):
        prompt_groups(model, ["1+2="], ["1-2="], answer_ids=3)


def test_identical_counterfactuals_are_warned_about(setup):
    from patching.sweeps.inputs import IdenticalCounterfactualWarning

    model, data = setup
    batch = single_batch(data.select([0]))
    with pytest.warns(IdenticalCounterfactualWarning, match="exactly 0 by construction"):
        prompt_groups(model, batch.tokens, batch.tokens.clone(), answer_ids=3)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prompt_groups(model, batch.tokens, batch.cf_tokens, answer_ids=3)  # a real twin: no warning


def test_a_model_with_nan_weights_is_refused_and_the_check_follows_changes():
    """NaN in W_Q gave finite path-patching scores (layer-0 heads exactly 0): attention zeroes NaN patterns."""
    model = tiny_model(n_layers=1)
    data = make_dataset(model, n_prompts=2, n_shots=0, seed=5)
    prompt_groups(model, data)  # finite: passes, and is remembered
    with torch.no_grad():
        model.blocks[0].attn.W_Q[0, 0, 0] = float("nan")  # an in-place change: the check runs again
    with pytest.raises(InputError, match=r"NaN or Inf weights in 1 tensors \(blocks\.0\.attn\.W_Q\)"):
        prompt_groups(model, data)
    with torch.no_grad():
        model.blocks[0].attn.W_Q[0, 0, 0] = 0.0
    prompt_groups(model, data)


def test_per_prompt_alt_ids_of_a_dataset_must_be_one_per_prompt(setup):
    model, data = setup
    per_prompt = list(range(5, 5 + len(data)))
    groups = prompt_groups(model, data, alt_ids=per_prompt, batch_size=5)
    assert sorted(a for g in groups for a in g.alt_ids.tolist()) == per_prompt  # each row keeps its own id
    for wrong in (per_prompt[:2], per_prompt + [99]):  # too few raised IndexError; too many were ignored
        with pytest.raises(InputError, match=rf"alt_ids has shape \({len(wrong)},\) but there are {len(data)} prompts"):
            prompt_groups(model, data, alt_ids=wrong)


def test_prompts_without_tokens_are_an_input_error(setup):
    model, data = setup
    batch = single_batch(data.select([0]))
    with pytest.raises(InputError, match=r"hold no tokens \(shape \[batch, 0\]\)"):
        prompt_groups(model, batch.tokens[:, :0], batch.cf_tokens[:, :0], answer_ids=3)


def test_a_dataset_that_a_filter_emptied_is_refused_saying_so():
    """It said 'The dataset is empty: nothing to batch.', not where the emptiness came from."""
    model = tiny_model(style="gpt2", n_layers=1, n_heads=2, seed=0)
    data = make_dataset(model, n_prompts=6, n_shots=1, seed=0).filter(lambda row: False)
    with pytest.raises(InputError, match=r"The Dataset holds no prompts \(0 rows: a filter or select that keeps none"):
        prompt_groups(model, data)
