"""merging.blocks: each submodule evaluated on its cached input gives what the model itself computes there, and
swapped parameters are used; per-head parameters leave out the K/V that heads share."""

import pytest
import torch

from circuits.errors import InputError
from merging.blocks import collect_inputs, head_param_names, input_hook, kind_param_names, submodule_output
from tests.tiny_models import tiny_model

STYLES = [("gpt2", None), ("llama", 2), ("gemma", None)]


@pytest.mark.parametrize("style,kv", STYLES, ids=[s for s, _ in STYLES])
def test_pieces_on_cached_inputs_are_the_models_own_outputs(style, kv):
    model = tiny_model(style=style, n_layers=2, n_key_value_heads=kv)
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(0))
    layer = 1
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        inputs = collect_inputs(model, tokens, None, [input_hook(model, layer, k) for k in ("attn", "mlp")])
        x_attn, x_mlp = inputs[input_hook(model, layer, "attn")], inputs[input_hook(model, layer, "mlp")]
        torch.testing.assert_close(x_attn, cache["resid_pre", layer])
        torch.testing.assert_close(submodule_output(model, layer, "attn", {}, x_attn), cache["attn_out", layer], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(submodule_output(model, layer, "mlp", {}, x_mlp), cache["mlp_out", layer], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(submodule_output(model, layer, "layer", {}, x_attn),
                                   cache["resid_post", layer] - cache["resid_pre", layer], atol=1e-5, rtol=1e-5)
        heads = submodule_output(model, layer, "heads", {}, x_attn)  # [batch, pos, head, d_model]
        expected = torch.einsum("bphd,hdm->bphm", cache["z", layer], model.blocks[layer].attn.W_O)
        torch.testing.assert_close(heads, expected, atol=1e-5, rtol=1e-5)
        doubled = submodule_output(model, layer, "heads", {"attn.W_O": 2 * model.blocks[layer].attn.W_O}, x_attn)
        torch.testing.assert_close(doubled, 2 * heads, atol=1e-5, rtol=1e-5)  # the swapped parameter is the one used
        if not model.cfg.use_normalization_before_and_after:  # no norm after attention: the heads add up
            torch.testing.assert_close(heads.sum(2) + model.blocks[layer].attn.b_O, cache["attn_out", layer],
                                       atol=1e-5, rtol=1e-5)


def test_parameter_names_of_each_kind():
    mha, mqa = tiny_model(style="gpt2", n_layers=1), tiny_model(style="gemma", n_layers=1)
    assert set(head_param_names(mha, 0)) == {"attn.W_Q", "attn.b_Q", "attn.W_K", "attn.b_K", "attn.W_V", "attn.b_V",
                                             "attn.W_O"}
    assert set(head_param_names(mqa, 0)) == {"attn.W_Q", "attn.b_Q", "attn.W_O"}  # one K/V head: not a head's own
    attn, mlp = kind_param_names(mqa, 0, "attn"), kind_param_names(mqa, 0, "mlp")
    assert "ln1_post.w" in attn and "attn._W_K" in attn and all(n.startswith(("ln2", "mlp.")) for n in mlp)
    assert sorted(attn + mlp) == sorted(kind_param_names(mqa, 0, "layer"))
    with pytest.raises(InputError, match="Unknown submodule kind 'neuron'"):
        kind_param_names(mqa, 0, "neuron")
