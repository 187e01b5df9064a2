"""Number activations equal what run_with_cache stores at the number's last token / END."""

import pytest
import torch

from circuits.errors import InputError
from circuits.analyze.number_tokens import (
    arithmetic_activations,
    arithmetic_prompts,
    group_mean,
    number_activations,
    number_prompts,
    number_token_vectors,
)
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model(style="gemma", n_layers=2)


def test_number_activations_match_the_cache(model):
    numbers = [3, 17, 256, 9, 40]
    keys = [(0, "resid_post"), (1, "mlp_out"), (1, "attn_out"), (0, "resid_mid")]
    acts = number_activations(model, numbers, keys, template="x = {n};")
    for i, n in enumerate(numbers):
        tokens = model.to_tokens(f"x = {n};")
        _, cache = model.run_with_cache(tokens)
        last = 5 + len(str(n)) - 1  # <bos> x ␣ = ␣, then one token per digit
        for layer, component in keys:
            expected = cache[f"blocks.{layer}.hook_{component}"][0, last]
            torch.testing.assert_close(acts[(layer, component)][i], expected, rtol=1e-5, atol=1e-5)


def test_number_prompt_positions(model):
    tokens, positions = number_prompts(model, [5, 123], template="{n}")
    assert positions == [1, 3] and [len(t) for t in tokens] == [2, 4]


def test_arithmetic_activations_at_end_and_operand(model):
    prompts = arithmetic_prompts(model, [(2, 3), (41, 7)], prefix="1 + 1 = 2\n")
    assert prompts.results == [5, 48]
    end = arithmetic_activations(model, prompts, [(1, "resid_post")])[(1, "resid_post")]
    at_a = arithmetic_activations(model, prompts, [(1, "resid_post")], where="a")[(1, "resid_post")]
    for i, row in enumerate(prompts.rows):
        _, cache = model.run_with_cache(torch.tensor([row["tokens"]]))
        torch.testing.assert_close(end[i], cache["blocks.1.hook_resid_post"][0, -1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(at_a[i], cache["blocks.1.hook_resid_post"][0, row["a_pos"][-1]], rtol=1e-5, atol=1e-5)


def test_group_mean_and_token_vectors(model):
    values, means = group_mean(torch.tensor([[1.0], [3.0], [10.0]]), [4, 4, 2])
    assert values == [2, 4] and means[:, 0].tolist() == [10.0, 2.0]
    numbers, vectors = number_token_vectors(model, 50, "unembed")
    assert numbers == list(range(10))  # the character tokenizer spells only 0..9 as one token
    digit_ids = [model.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    torch.testing.assert_close(vectors, model.W_U[:, digit_ids].T.float())


def test_bad_component_and_layer_are_refused(model):
    with pytest.raises(InputError, match="Unknown component"):
        number_activations(model, [1, 2], [(0, "resid")])
    with pytest.raises(InputError, match="outside 0..1"):
        number_activations(model, [1, 2], [(5, "resid_post")])
    with pytest.raises(InputError, match="'{n}'"):
        number_prompts(model, [1], template="no slot")


def test_pairs_by_result_cover_every_sum():
    from circuits.analyze.number_tokens import pairs_by_result
    pairs = pairs_by_result(99, per_result=2, seed=1)
    sums = [a + b for a, b in pairs]
    assert sorted(set(sums)) == list(range(199)) and sums.count(0) == 1 and sums.count(100) == 2
    assert all(0 <= a <= 99 and 0 <= b <= 99 for a, b in pairs) and len(set(pairs)) == len(pairs)
