"""Scoring the answer token cheaply: logits only at END and only for the tokens needed.

A full forward of gemma-3-270m spends about three quarters of its time in the
unembedding (262k-token vocabulary at every position). Every metric here needs
the logits at the last position only, so :func:`end_logits` stops the forward
before the final norm, normalizes the END residual alone and unembeds it,
optionally against a subset of vocabulary columns.

**Top-1 without the full float32 unembedding** (:func:`end_argmax`). Accuracy needs the
argmax over the whole vocabulary, and on gemma the float32 unembedding of one END row
(640 x 262,144) costs as much as ~1.7 positions of the model. Bounds relative to a clean
run cannot replace it: a knockout moves the normalised END residual by ~41 (norm ~133)
while the answer leads its runner-up by ~1.4 logits. Instead the logits are screened in
bfloat16 (~4x faster than float32 on a CPU with AVX512-BF16 or AMX) with a certified error bound:
with ``u = 2^-8`` the bfloat16 unit roundoff, every screened logit ``a_t`` is within

    E = |h| max_t |w_t| (2u + u^2 + 2 gamma_n (1+u)^2) + u / (1-u) max_t |a_t| + (max b - min b)

of the float32 logit (rounding of ``h`` and ``w_t``, float32 accumulation ``gamma_n``, bfloat16
output; the bias, if any, bounded by its range). A token with ``a_t < max_s a_s - 2E`` cannot
be the argmax, so only the few others (2 per row on gemma, at most 9 in 1,088 knocked-out
rows) get exact float32 logits. A row falls back to the full float32 unembedding when its
best two candidates are within a tie margin (where float32 rounding could decide), when it
has too many candidates, when the model runs in another dtype, or under a logit soft-cap.
The bound assumes float32 accumulation in the bfloat16 matrix product; it is checked once
per model against the float32 logits, and a model whose check fails is never screened.

The screen pays only where the CPU multiplies bfloat16 natively: on an AVX2-only CPU torch
emulates the product, and one gemma END block (64 rows x 262,144) took 69 s in bfloat16
against 0.47 s in float32 (one thread, AMD EPYC). So by default (``screen=None``) it runs only
where oneDNN reports native bfloat16 support (:func:`native_bfloat16`); ``screen=True`` forces
it (the tests check its certificate on any CPU), ``screen=False`` never screens.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from typing import Callable, Optional, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.utilities.activation_functions import apply_softcap, softcap_enabled

SCREEN_ROWS = 128  # rows screened per bfloat16 product (a [rows, d_vocab] bfloat16 block)
MAX_CANDIDATES = 64  # more candidates than this in a row: the row takes the full float32 unembedding
TIE_MARGIN = 1e-6  # relative slack on top of the summation-order bound for the best two exact candidates

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


def _normed(model: HookedTransformer, resid_end: Tensor) -> Tensor:
    if model.cfg.normalization_type is not None:
        return model.ln_final(resid_end[:, None, :])[:, 0, :]
    return resid_end


def _gamma(n: int) -> float:
    """``gamma_n = n u / (1 - n u)``, float32's bound on the relative error of a sum of ``n`` products."""
    return n * 2.0**-24 / (1 - n * 2.0**-24)


class _Screen:
    """A model's bfloat16 unembedding and the per-model constants of the bound (module docstring)."""

    def __init__(self, model: HookedTransformer):
        W_U, b_U = model.W_U.detach(), model.b_U.detach()
        self.key = (W_U.data_ptr(), W_U._version, b_U.data_ptr(), b_U._version)
        self.W = W_U.to(torch.bfloat16)
        u, gamma = 2.0**-8, _gamma(W_U.shape[0])
        w_max = float(W_U.norm(dim=0).max())
        self.w_factor = w_max * (2 * u + u * u + 2 * gamma * (1 + u) ** 2)
        # two float32 summation orders of h . w_t differ by at most 2 gamma |h| |w_t|: closer candidates
        # are left to the full product, whose rounding the plain argmax sees
        self.tie_factor = 2 * gamma * w_max
        self.out_factor = u / (1 - u)
        self.bias_range = float(b_U.max() - b_U.min()) if b_U.numel() else 0.0
        self.checked: Optional[bool] = None  # None until the first rows are checked against float32

    def bound(self, h: Tensor, a: Tensor) -> Tensor:
        """Per row, the largest possible |screened - float32| logit difference."""
        a_abs = torch.maximum(a.amax(-1).float().abs(), a.amin(-1).float().abs())
        return h.norm(dim=-1) * self.w_factor + a_abs * self.out_factor + self.bias_range


def outscored(
    model: HookedTransformer,
    resid_end: Float[Tensor, "rows d_model"],
    answer_ids: Int[Tensor, "rows"],
    rivals: Int[Tensor, "k"],
) -> Bool[Tensor, "rows"]:
    """Per row: does one of the ``rivals`` tokens, or another row's answer, outscore the row's answer by more than
    float32 rounding explains?

    A True row's answer is not the argmax of :func:`unembed_end` (a rival beats it in any summation order), found
    from a few columns instead of the whole vocabulary; a False row is undecided (the answer may or may not be
    the argmax). Two float32 sums of ``h . w_t`` differ by at most ``2 gamma_n |h| |w_t|``, and the soft-cap, if
    any, is 1-Lipschitz, so a lead larger than the two tokens' bounds (and a relative ``TIE_MARGIN``) is certain.
    """
    answer_ids = answer_ids.to(resid_end.device)
    ids = torch.unique(torch.cat([rivals.to(resid_end.device).flatten(), answer_ids]))
    h = _normed(model, resid_end)
    W, b = model.W_U[:, ids], model.b_U[ids]
    logits = apply_softcap(h @ W + b, model.cfg.output_logits_soft_cap)
    # [rows, k]: how far each logit can be from any other float32 sum of the same products
    slack = 2 * _gamma(W.shape[0]) * (h.abs() @ W.abs())
    at = torch.searchsorted(ids, answer_ids)[:, None]
    answer, answer_slack = logits.gather(1, at), slack.gather(1, at)
    lead = logits - answer - slack - answer_slack - TIE_MARGIN * (1 + answer.abs()) * 2
    return (lead > 0).any(-1)


@functools.lru_cache(maxsize=None)
def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (oneDNN's AVX512-BF16 / AMX kernels), so that the
    bfloat16 screen is faster than the float32 unembedding it replaces (module docstring)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN: bfloat16 is emulated
        return False


_SCREENS: "weakref.WeakKeyDictionary[HookedTransformer, _Screen]" = weakref.WeakKeyDictionary()


def _screen_for(model: HookedTransformer) -> Optional[_Screen]:
    """The model's screen (rebuilt when its unembedding changed), or None where screening does not apply."""
    if model.W_U.dtype != torch.float32 or softcap_enabled(model.cfg.output_logits_soft_cap) \
            or model.W_U.device.type != "cpu":  # on a GPU the float32 product is cheap and bfloat16 reductions vary
        return None
    W_U, b_U = model.W_U, model.b_U
    screen = _SCREENS.get(model)
    if screen is None or screen.key != (W_U.data_ptr(), W_U._version, b_U.data_ptr(), b_U._version):
        screen = _SCREENS[model] = _Screen(model)
    return screen if screen.checked is not False else None


@torch.no_grad()
def end_argmax(
    model: HookedTransformer,
    resid_end: Float[Tensor, "rows d_model"],
    *,
    screen: Optional[bool] = None,
    stats: Optional[dict] = None,
) -> Int[Tensor, "rows"]:
    """``unembed_end(model, resid_end).argmax(-1)``, computed by a certified bfloat16 screen (module docstring).

    ``screen``: None (default) screens where the CPU multiplies bfloat16 natively (:func:`native_bfloat16`),
    True always, False never (the plain float32 unembedding). ``stats``, a dict, receives ``rows`` and ``full``
    (rows that needed the full float32 unembedding).
    """
    stats = stats if stats is not None else {}
    stats["rows"] = stats.get("rows", 0) + resid_end.shape[0]
    if screen is None:
        screen = native_bfloat16()
    screener = _screen_for(model) if screen else None
    if screener is None or resid_end.shape[0] == 0:
        stats["full"] = stats.get("full", 0) + resid_end.shape[0]
        return torch.cat([unembed_end(model, chunk).argmax(-1) for chunk in resid_end.split(SCREEN_ROWS)]) \
            if resid_end.shape[0] else torch.zeros(0, dtype=torch.long, device=resid_end.device)
    out = torch.empty(resid_end.shape[0], dtype=torch.long, device=resid_end.device)
    full_rows = []
    W_U, b_U = model.W_U, model.b_U
    for start in range(0, resid_end.shape[0], SCREEN_ROWS):
        h = _normed(model, resid_end[start:start + SCREEN_ROWS])
        a = h.to(torch.bfloat16) @ screener.W
        bound = screener.bound(h, a)
        if screener.checked is None:  # the bound assumes float32 accumulation: check it once on real rows
            exact = (h[:8] @ W_U)
            ok = bool(((a[:8].float() - exact).abs() <= bound[:8, None]).all())
            screener.checked = ok
            if not ok:
                warnings.warn("bfloat16 screening of the unembedding exceeded its error bound on this machine; "
                              "the full float32 unembedding is used instead.", RuntimeWarning, stacklevel=2)
                return end_argmax(model, resid_end, screen=False, stats=stats)
        threshold = a.amax(-1).float() - 2 * bound
        threshold = threshold - threshold.abs() * 2.0**-7  # rounded to bfloat16 below, never above
        candidates = a >= threshold.to(torch.bfloat16)[:, None]
        rows, tokens = candidates.nonzero(as_tuple=True)
        counts = torch.bincount(rows, minlength=h.shape[0])
        exact = (h[rows] * W_U[:, tokens].T).sum(-1) + b_U[tokens]
        best = torch.full((h.shape[0],), float("-inf"), device=h.device).scatter_reduce(0, rows, exact, "amax")
        at_best = exact == best[rows]
        winner = torch.zeros(h.shape[0], dtype=torch.long, device=h.device).scatter_reduce(
            0, rows[at_best], tokens[at_best], "amin", include_self=False)
        second = torch.full_like(best, float("-inf")).scatter_reduce(
            0, rows, exact.masked_fill(tokens == winner[rows], float("-inf")), "amax")
        close = (best - second) <= screener.tie_factor * h.norm(dim=-1) + TIE_MARGIN * (1 + best.abs())
        out[start:start + h.shape[0]] = winner
        undecided = (close | (counts > MAX_CANDIDATES) | (counts == 0)).nonzero()[:, 0]
        full_rows += (undecided + start).tolist()
    if full_rows:
        index = torch.tensor(full_rows, device=resid_end.device)
        out[index] = torch.cat([unembed_end(model, chunk).argmax(-1) for chunk in resid_end[index].split(SCREEN_ROWS)])
    stats["full"] = stats.get("full", 0) + len(full_rows)
    return out
