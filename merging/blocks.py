"""Submodules of a TransformerLens block, evaluated functionally on cached inputs.

Closed-form merging and the linearity analysis need ``f_m(x; θ)`` for a
submodule ``m`` under many parameter sets θ (base, each expert, interpolations)
on the *same* inputs ``x``. Rerunning the whole model for each would cost
``O(n_layers)`` times more; instead the submodule's inputs are cached once
through hooks (:func:`collect_inputs`) and the TL module is called with swapped
parameters through ``torch.func.functional_call``, so the computation is the
model's own code (rotary, GQA, gemma's extra norms included).

Submodule functions (``kind``), all mapping a block's input to an additive
contribution to the residual stream:

* ``"layer"``: the whole block, ``block(resid_pre) − resid_pre``.
* ``"attn"``: input ``resid_pre``, output ``hook_attn_out``: ``ln1`` → attention
  → ``ln1_post`` (gemma-style models). The norms belong to the attention
  submodule: their weights are merged with the attention's α.
* ``"mlp"``: input ``resid_mid`` (``resid_pre`` for parallel attn/MLP blocks),
  output ``hook_mlp_out``: ``ln2`` → MLP → ``ln2_post``.
* ``"heads"``: every head's own contribution ``z_h @ W_O[h]`` at once, shape
  ``[batch, pos, head, d_model]`` (read through ``attn.hook_z``). It leaves out
  ``b_O`` and ``ln1_post``, which act on the sum of heads; those are merged at
  attention level. Only the per-head slices of ``W_Q, b_Q, W_O`` (and
  ``W_K, b_K, W_V, b_V`` when every head has its own) belong to a head; shared
  K/V of grouped/multi-query attention, q/k norms and ``ln1`` are attention-level.

Unsupported block layouts (post-norm OLMo-2 style, ``use_attn_in``,
shortformer positions) are refused for ``attn``/``mlp``/``heads``; ``layer``
works for any block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from torch.func import functional_call
from transformer_lens import HookedTransformer
from transformer_lens import utils as tl_utils

from circuits.errors import InputError

KINDS = ("layer", "attn", "mlp", "heads")
HEAD_PARAM_NAMES = ("W_Q", "b_Q", "W_O", "W_K", "b_K", "W_V", "b_V", "_W_K", "_b_K", "_W_V", "_b_V")
ATTN_PREFIXES = ("ln1.", "ln1_post.", "attn.")
MLP_PREFIXES = ("ln2.", "ln2_post.", "mlp.")


def block_prefix(layer: int) -> str:
    """State-dict prefix of block ``layer``."""
    return f"blocks.{layer}."


def head_param_names(model: HookedTransformer, layer: int) -> list[str]:
    """Block-relative names of the parameters sliced per query head (dim 0 = head)."""
    attn = model.blocks[layer].attn
    return [
        f"attn.{n}"
        for n, p in attn.named_parameters(recurse=False)
        if n in HEAD_PARAM_NAMES and p.shape[0] == model.cfg.n_heads
    ]


def kind_param_names(model: HookedTransformer, layer: int, kind: str) -> list[str]:
    """Block-relative names of the parameters that ``kind`` swaps when evaluated."""
    names = [n for n, _ in model.blocks[layer].named_parameters()]
    if kind == "layer":
        return names
    if kind == "attn":
        return [n for n in names if n.startswith(ATTN_PREFIXES)]
    if kind == "mlp":
        return [n for n in names if n.startswith(MLP_PREFIXES)]
    if kind == "heads":
        return head_param_names(model, layer)
    raise InputError(f"Unknown submodule kind {kind!r}; use one of {KINDS}.")


def check_block_layout(model: HookedTransformer) -> None:
    """Refuse block layouts whose attention/MLP pieces this module cannot evaluate separately."""
    cfg = model.cfg
    problems = []
    if cfg.use_attn_in:
        problems.append("use_attn_in=True")
    if cfg.positional_embedding_type == "shortformer":
        problems.append("shortformer positional embeddings")
    from transformer_lens.components.transformer_block import POST_NORM_ARCHITECTURES

    if cfg.original_architecture in POST_NORM_ARCHITECTURES:
        problems.append(f"post-norm architecture {cfg.original_architecture}")
    if problems:
        raise InputError(
            f"Attention/MLP/head-level evaluation does not support {', '.join(problems)}; "
            "use level='layer' (whole blocks) or level='model' for this model."
        )


def mlp_input_hook(model: HookedTransformer, layer: int) -> str:
    """Hook whose value feeds the MLP of ``layer`` (``resid_mid``, or ``resid_pre`` for parallel blocks)."""
    return tl_utils.get_act_name("resid_pre" if model.cfg.parallel_attn_mlp else "resid_mid", layer)


def input_hook(model: HookedTransformer, layer: int, kind: str) -> str:
    """Hook whose cached value is the input of submodule ``kind`` in ``layer``."""
    return mlp_input_hook(model, layer) if kind == "mlp" else tl_utils.get_act_name("resid_pre", layer)


class _Piece(nn.Module):
    """Wraps a block so ``functional_call`` can run one piece of it; parameter names stay ``block.*``."""

    def __init__(self, block: nn.Module, kind: str):
        super().__init__()
        self.block, self.kind = block, kind

    def forward(self, x: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        b, cfg = self.block, self.block.cfg
        if self.kind == "layer":
            return b(x, attention_mask=attention_mask) - x
        if self.kind in ("attn", "heads"):
            normed = b.ln1(x)
            out = b.attn(normed, normed, normed, attention_mask=attention_mask)
            if self.kind == "attn" and cfg.use_normalization_before_and_after:
                out = b.ln1_post(out)
            return out
        normed = b.ln2(x)
        return b.apply_mlp(normed)


def submodule_output(
    model: HookedTransformer,
    layer: int,
    kind: str,
    params: Mapping[str, Tensor],
    x: Float[Tensor, "batch pos d_model"],
    attention_mask: Int[Tensor, "batch pos"] | None = None,
) -> Tensor:
    """``f_m(x; θ)`` for submodule ``kind`` of block ``layer`` with block parameters ``params``.

    ``params`` maps block-relative names (``"attn.W_Q"``) to tensors; missing
    ones come from the model. Returns ``[batch, pos, d_model]``, or
    ``[batch, pos, head, d_model]`` for ``kind="heads"``.
    """
    block = model.blocks[layer]
    piece = _Piece(block, kind)
    swapped = {f"block.{k}": v for k, v in params.items()}
    if kind != "heads":
        return functional_call(piece, swapped, (x,), {"attention_mask": attention_mask})
    store: dict[str, Tensor] = {}

    def keep_z(z: Tensor, *, hook) -> None:
        store["z"] = z

    with model.hooks(fwd_hooks=[(tl_utils.get_act_name("z", layer), keep_z)]):
        functional_call(piece, swapped, (x,), {"attention_mask": attention_mask})
    w_o = params.get("attn.W_O", block.attn.W_O)
    return torch.einsum("bphd,hdm->bphm", store["z"], w_o)


def collect_inputs(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None,
    hook_names: Sequence[str],
    params: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Run the model (with state-dict ``params`` swapped in, if given) and cache ``hook_names``."""
    cache: dict[str, Tensor] = {}

    def save(act: Tensor, *, hook) -> None:
        cache[hook.name] = act.detach()

    with model.hooks(fwd_hooks=[(name, save) for name in hook_names]):
        if params is None:
            model(tokens, attention_mask=attention_mask, return_type=None)
        else:
            functional_call(model, dict(params), (tokens,), {"attention_mask": attention_mask, "return_type": None})
    return cache


def logits(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None,
    params: Mapping[str, Tensor] | None = None,
) -> Float[Tensor, "batch pos d_vocab"]:
    """Model logits with the state-dict ``params`` swapped in (the model's own weights if None)."""
    if params is None:
        return model(tokens, attention_mask=attention_mask)
    return functional_call(model, dict(params), (tokens,), {"attention_mask": attention_mask})


def batches(
    model: HookedTransformer,
    task,
    attention_mask=None,
    *,
    n_samples: int,
    batch_size: int,
) -> list[tuple[Tensor, Tensor | None]]:
    """Normalise one task's data to at most ``n_samples`` prompts in ``(tokens, mask)`` chunks.

    ``task`` is an Int tensor ``[batch, pos]``, a list of such tensors, or a
    list of strings (tokenised with ``model.to_tokens``, right-padded, with a
    mask built by ``transformer_lens.utils.get_attention_mask``).
    ``attention_mask`` mirrors ``task`` (a tensor or a list of tensors).
    """
    device = model.cfg.device
    if isinstance(task, (list, tuple)) and task and isinstance(task[0], str):
        tokens = model.to_tokens(list(task)[:n_samples], padding_side="right")
        mask = tl_utils.get_attention_mask(model.tokenizer, tokens, model.cfg.default_prepend_bos)
        pairs = [(tokens, mask)]
    elif isinstance(task, Tensor):
        pairs = [(task, attention_mask)]
    elif isinstance(task, (list, tuple)) and task and all(isinstance(t, Tensor) for t in task):
        masks = attention_mask if attention_mask is not None else [None] * len(task)
        if len(masks) != len(task):
            raise InputError(f"{len(masks)} attention masks for {len(task)} token batches.")
        pairs = list(zip(task, masks))
    else:
        raise TypeError(
            "Each task must be an Int tensor [batch, pos], a list of such tensors, or a list of "
            f"strings; got {type(task).__name__}."
        )
    out, left = [], n_samples
    for tokens, mask in pairs:
        if tokens.dim() != 2 or tokens.is_floating_point():
            raise InputError(f"Token batches must be Int tensors [batch, pos], got {tuple(tokens.shape)} {tokens.dtype}.")
        if mask is not None and mask.shape != tokens.shape:
            raise InputError(f"Attention mask shape {tuple(mask.shape)} != tokens shape {tuple(tokens.shape)}.")
        for start in range(0, min(len(tokens), left), batch_size):
            stop = min(start + batch_size, left, len(tokens))
            out.append((tokens[start:stop].to(device), None if mask is None else mask[start:stop].to(device)))
        left -= min(len(tokens), left)
        if left <= 0:
            break
    if not out:
        raise InputError("A task has no samples: give at least one prompt per task.")
    return out


def position_mask(tokens: Tensor, attention_mask: Tensor | None) -> Tensor:
    """``[batch, pos, 1]`` float mask of real (non-padding) positions."""
    m = torch.ones_like(tokens, dtype=torch.float64) if attention_mask is None else attention_mask.double()
    return m.unsqueeze(-1)
