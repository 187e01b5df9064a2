"""The tests' tiny random models: :mod:`circuits.random_models` under the name the tests use."""

from circuits.random_models import CHARACTERS, SPECIAL_TOKENS, char_tokenizer, tiny_model

__all__ = ["CHARACTERS", "SPECIAL_TOKENS", "char_tokenizer", "tiny_model"]
