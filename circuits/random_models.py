"""Tiny random `HookedTransformer`s with a character tokenizer: to try a method in seconds, and for the unit tests.

Every character is one token (digits included, like gemma and Llama), and the
tokenizer prepends ``<bos>``, so prompts built by :mod:`circuits.tasks` have the
same structure as on the real model. Nothing here downloads anything.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformers import PreTrainedTokenizerFast

from circuits.errors import InputError

SPECIAL_TOKENS = ("<pad>", "<bos>", "<unk>")
CHARACTERS = string.digits + string.ascii_letters + string.punctuation + " \n"


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A fast tokenizer that maps each printable ASCII character to one token and prepends BOS."""
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *CHARACTERS])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<pad>",
        pad_token="<pad>",
        unk_token="<unk>",
        add_bos_token=True,
        # TransformerLens reads name_or_path when it looks for a BOS-adding twin.
        name_or_path="char-tokenizer",
    )


def tiny_model(
    *,
    n_layers: int = 2,
    n_heads: int = 4,
    d_head: int = 8,
    n_key_value_heads: int | None = None,
    style: str = "gpt2",
    seed: int = 0,
    device: str = "cpu",
    n_ctx: int = 256,
) -> HookedTransformer:
    """A random `HookedTransformer` with the character tokenizer.

    ``style`` picks the block layout: ``"gpt2"`` (LayerNorm, learned positions,
    GELU MLP, biases), ``"llama"`` (RMSNorm, rotary, gated SiLU MLP, optional
    grouped-query attention) or ``"gemma"`` (like llama, plus the norms after
    attention and MLP that gemma-3 has, and multi-query attention by default).
    """
    tokenizer = char_tokenizer()
    d_model = n_heads * d_head
    common = dict(
        n_layers=n_layers,
        d_model=d_model,
        d_head=d_head,
        n_heads=n_heads,
        n_ctx=n_ctx,
        d_vocab=len(tokenizer.get_vocab()),
        d_mlp=4 * d_model,
        seed=seed,
        device=device,
        default_prepend_bos=True,
    )
    if style == "gpt2":
        cfg = HookedTransformerConfig(**common, act_fn="gelu_new", normalization_type="LN")
    elif style in ("llama", "gemma"):
        if style == "gemma" and n_key_value_heads is None:
            n_key_value_heads = 1
        cfg = HookedTransformerConfig(
            **common,
            act_fn="silu",
            normalization_type="RMS",
            positional_embedding_type="rotary",
            rotary_dim=d_head,
            gated_mlp=True,
            final_rms=True,
            n_key_value_heads=n_key_value_heads,
            use_normalization_before_and_after=(style == "gemma"),
        )
    else:
        raise InputError(f"Unknown tiny-model style {style!r}: use 'gpt2', 'llama' or 'gemma'.")
    return HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=True)
