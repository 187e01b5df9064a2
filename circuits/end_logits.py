"""Scoring the answer token cheaply: logits only at END and only for the tokens needed.

A full forward of gemma-3-270m spends about three quarters of its time in the
unembedding (262k-token vocabulary at every position). Every metric here needs
the logits at the last position only, so :func:`end_logits` stops the forward
before the final norm, normalizes the END residual alone and unembeds it,
optionally against a subset of vocabulary columns.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.utilities.activation_functions import apply_softcap

HookList = Sequence[tuple[str | Callable, Callable]]


def unembed_end(
    model: HookedTransformer,
    resid_end: Float[Tensor, "batch d_model"],
    token_ids: Int[Tensor, "..."] | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """Final norm + unembedding of END residuals; restricted to ``token_ids`` columns when given."""
    if model.cfg.normalization_type is not None:
        resid_end = model.ln_final(resid_end[:, None, :])[:, 0, :]
    W_U, b_U = model.W_U, model.b_U
    if token_ids is not None:
        W_U, b_U = W_U[:, token_ids], b_U[token_ids]
    logits = resid_end @ W_U + b_U
    return apply_softcap(logits, model.cfg.output_logits_soft_cap)


def end_residual(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], fwd_hooks: HookList = ()
) -> Float[Tensor, "batch d_model"]:
    """The residual stream after the last block, at the last position."""
    resid = model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks), stop_at_layer=model.cfg.n_layers)
    return resid[:, -1, :]


def end_logits(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    *,
    fwd_hooks: HookList = (),
    token_ids: Int[Tensor, "..."] | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """Logits at the last position, equal to ``model(tokens)[:, -1]`` (or its ``token_ids`` columns)."""
    return unembed_end(model, end_residual(model, tokens, fwd_hooks), token_ids)


@torch.no_grad()
def top1_correct(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    answer_ids: Int[Tensor, "batch"],
    fwd_hooks: HookList = (),
) -> torch.Tensor:
    """Boolean per prompt: is the answer token the top-1 prediction at END?"""
    logits = end_logits(model, tokens, fwd_hooks=fwd_hooks)
    return logits.argmax(-1) == answer_ids.to(logits.device)
