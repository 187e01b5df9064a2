"""circuits.random_models: the character tokenizer (one token per character, BOS first) and the tiny models' styles."""

import pytest
import torch

from circuits.errors import InputError
from circuits.random_models import CHARACTERS, SPECIAL_TOKENS, char_tokenizer, tiny_model


def test_every_character_is_one_token_after_bos():
    tok = char_tokenizer()
    text = "12 + 345 = ?\nAb"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1
    assert tok.decode(ids[1:]) == text
    assert len(tok.get_vocab()) == len(SPECIAL_TOKENS) + len(CHARACTERS)


@pytest.mark.parametrize("style,kv,norm,gated", [("gpt2", None, "LN", False), ("llama", 2, "RMS", True),
                                                  ("gemma", 1, "RMS", True)])
def test_styles_build_their_block_layouts(style, kv, norm, gated):
    model = tiny_model(style=style, n_layers=2, n_key_value_heads=2 if style == "llama" else None, seed=3)
    cfg = model.cfg
    assert (cfg.normalization_type, cfg.gated_mlp, cfg.n_key_value_heads) == (norm, gated, kv)
    assert cfg.use_normalization_before_and_after == (style == "gemma")
    assert cfg.positional_embedding_type == ("standard" if style == "gpt2" else "rotary")
    same = tiny_model(style=style, n_layers=2, n_key_value_heads=2 if style == "llama" else None, seed=3)
    tokens = model.to_tokens("7 + 5 = ")
    with torch.no_grad():
        assert torch.equal(model(tokens), same(tokens))  # seeded


def test_unknown_style_is_refused():
    with pytest.raises(InputError, match="Unknown tiny-model style 'bert'"):
        tiny_model(style="bert")
