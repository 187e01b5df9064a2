"""Context-aware mean ablation (CAMA): erase what tokens learned from each other.

Mamidanna, Rai, Yao & Zhou (2025, "All for One", arXiv 2509.09650) ask how long
the tokens of an arithmetic prompt can compute *alone* before they must share
information. CAMA answers it for the first ``L_wait`` layers: the residual
stream at each position is replaced by the mean of that position's residual
over task prompts that hold **the same token at that position**, the other
positions varying. What a token computes from itself (and from the fixed
template around it) survives, because every prompt in the mean shares it; what
it picked up from the *variable* tokens (the operands) averages out.

On "A+B=" the position of ``B`` gets the mean over all ``A`` for that ``B``, the
"=" position the mean over all operand pairs. Two positions are left alone:

* BOS, which sees only itself;
* positions whose context is only themselves: every earlier token (after BOS)
  is the same in all prompts, so the residual there already depends on its own
  token alone (the first operand of "A+B="). CAMA would be exact there anyway;
  keeping the prompt's own value also avoids a noisy mean.

Where one (position, token) pair occurs in fewer than ``min_count`` prompts,
its mean falls back to the plain mean of the position over all prompts; every
lookup reports how many prompts its mean used, and :meth:`CamaMeans.fallback_mask`
marks the fallbacks. A fallback erases the token itself (on "A+B=", operand B), so
fit on enough prompts that none occur (``patching.all_for_one.search`` cross-fits for this).

**Where it acts.** ``layer = L`` replaces the residual stream entering block
``L``: ``blocks.L.hook_resid_pre`` (= ``blocks.{L-1}.hook_resid_post``), i.e.
after ``L`` blocks have run. The authors' demo (``table_4_original.py``) patches
``blocks.{W}.hook_resid_post`` for ``wait_until_layer = W``, i.e. after ``W + 1``
blocks: their ``W`` is our ``L = W + 1`` (their Llama-3-8B setting ``W = 14`` is
our ``L_wait = 15``). ``L = 0`` acts on the embeddings (plus learned
positional embeddings, where the model has them), where every position already
depends on its own token only, so CAMA there changes nothing but BOS-free means;
``L = n_layers`` acts on the final residual (``blocks.{n-1}.hook_resid_post``).

**Alignment.** Positions must mean the same thing across the prompts of one
mean: fit on prompts of one template and one token layout. :func:`group_key`
puts a dataset row into such a group (template, token count, and the prompt
with digits masked, so few-shot prefixes with answers of different lengths do
not mix); :func:`fit_cama` fits one :class:`CamaMeans` per group. Fit on a
split disjoint from the prompts you evaluate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Sequence

import torch
from datasets import Dataset
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens import utils as tl_utils
from transformer_lens.hook_points import HookPoint

from circuits.arguments import check_positive_int
from circuits.errors import InputError
from patching.sweeps.options import SweepOptions, sweep_options


@dataclass(frozen=True)
class CamaConfig:
    """How the context-aware means are formed.

    ``min_count``: a (position, token) mean needs at least this many prompts, else the
    position mean is used. ``keep_bos``/``keep_self_context``: leave BOS and positions
    whose context is only themselves untouched (see the module docstring).
    """

    min_count: int = 2
    keep_bos: bool = True
    keep_self_context: bool = True

    def __post_init__(self) -> None:
        if self.min_count < 1:
            raise InputError(f"min_count must be >= 1, got {self.min_count}.")


def resid_hook_name(model: HookedTransformer, layer: int) -> str:
    """The hook point CAMA acts on for ``layer`` (see the module docstring)."""
    n_layers = model.cfg.n_layers
    if not 0 <= layer <= n_layers:
        raise InputError(f"CAMA layer {layer} is out of range: use 0..{n_layers} (the number of blocks run first).")
    if layer == n_layers:
        return tl_utils.get_act_name("resid_post", n_layers - 1)
    return tl_utils.get_act_name("resid_pre", layer)


@dataclass
class CamaMeans:
    """Context-aware means of one group of aligned prompts at one layer.

    For position ``t``: ``keys[t]`` are the token ids seen there (sorted),
    ``value_means[t]`` their mean residuals and ``value_counts[t]`` how many prompts
    each mean used; ``position_mean[t]`` is the fallback over all ``n_prompts``.
    ``kept`` marks positions left untouched.
    """

    layer: int
    position_mean: Float[Tensor, "pos d_model"]
    keys: list[Int[Tensor, "value"]]
    value_means: list[Float[Tensor, "value d_model"]]
    value_counts: list[Int[Tensor, "value"]]
    kept: Bool[Tensor, "pos"]
    n_prompts: int
    min_count: int

    @property
    def n_pos(self) -> int:
        return self.position_mean.shape[0]

    def lookup(
        self, tokens: Int[Tensor, "batch pos"]
    ) -> tuple[Float[Tensor, "batch pos d_model"], Int[Tensor, "batch pos"]]:
        """The mean for each (prompt, position) and how many fit prompts it used (0 where kept)."""
        if tokens.ndim != 2 or tokens.shape[1] != self.n_pos:
            raise InputError(
                f"These CAMA means are for prompts of {self.n_pos} tokens; got tokens of shape {tuple(tokens.shape)}."
            )
        device = self.position_mean.device
        tokens = tokens.to(device)
        batch = tokens.shape[0]
        means = self.position_mean[None].expand(batch, -1, -1).clone()
        n_used = torch.full((batch, self.n_pos), self.n_prompts, dtype=torch.long, device=device)
        for t in range(self.n_pos):
            if self.kept[t]:
                n_used[:, t] = 0
                continue
            keys = self.keys[t]
            idx = torch.searchsorted(keys, tokens[:, t].contiguous()).clamp(max=len(keys) - 1)
            found = keys[idx] == tokens[:, t]
            counts = torch.where(found, self.value_counts[t][idx], torch.zeros_like(idx))
            use_value = counts >= self.min_count
            means[:, t] = torch.where(use_value[:, None], self.value_means[t][idx], means[:, t])
            n_used[:, t] = torch.where(use_value, counts, n_used[:, t])
        return means, n_used

    def uses_value_mean(self, tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
        """True where the token-conditioned mean is used (False: kept position or position-mean fallback)."""
        tokens = tokens.to(self.position_mean.device)
        out = torch.zeros(tokens.shape, dtype=torch.bool, device=tokens.device)
        for t in range(self.n_pos):
            if self.kept[t]:
                continue
            keys = self.keys[t]
            idx = torch.searchsorted(keys, tokens[:, t].contiguous()).clamp(max=len(keys) - 1)
            out[:, t] = (keys[idx] == tokens[:, t]) & (self.value_counts[t][idx] >= self.min_count)
        return out

    def fallback_mask(self, tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
        """True where a replaced position falls back to the plain position mean (its token has fewer
        than ``min_count`` fit prompts): there CAMA erases the token itself, not only its context."""
        return ~self.uses_value_mean(tokens) & ~self.kept.to(tokens.device)[None]

    def apply(
        self, resid: Float[Tensor, "batch pos d_model"], tokens: Int[Tensor, "batch pos"]
    ) -> Float[Tensor, "batch pos d_model"]:
        """``resid`` with every non-kept position replaced by its context-aware mean."""
        means, _ = self.lookup(tokens)
        keep = self.kept.to(resid.device)[None, :, None]
        return torch.where(keep, resid, means.to(resid.device, resid.dtype))

    def hook(self, tokens: Int[Tensor, "batch pos"]) -> Callable[..., Tensor]:
        """A residual-stream hook applying :meth:`apply` for a batch of ``tokens``."""
        means, _ = self.lookup(tokens)
        keep = self.kept[None, :, None]

        def cama(resid: Float[Tensor, "batch pos d_model"], *, hook: HookPoint) -> Tensor:
            if resid.shape[:2] != tokens.shape:
                raise InputError(f"CAMA hook built for tokens {tuple(tokens.shape)} got a residual {tuple(resid.shape)}.")
            return torch.where(keep.to(resid.device), resid, means.to(resid.device, resid.dtype))

        return cama


def self_context_positions(tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "pos"]:
    """Positions whose earlier tokens (after BOS at 0) are identical in every prompt."""
    n_pos = tokens.shape[1]
    constant = (tokens == tokens[:1]).all(0)  # [pos]
    out = torch.zeros(n_pos, dtype=torch.bool, device=tokens.device)
    for t in range(1, n_pos):
        out[t] = bool(constant[1:t].all())
    return out


def fit_cama_means(
    tokens: Int[Tensor, "batch pos"],
    resid: Float[Tensor, "batch pos d_model"],
    layer: int,
    config: CamaConfig = CamaConfig(),
) -> CamaMeans:
    """Context-aware means from residuals ``resid`` of aligned prompts ``tokens`` (means in float32)."""
    if tokens.ndim != 2 or tokens.shape[0] == 0:
        raise InputError(f"Need a non-empty [batch, pos] token tensor to fit CAMA means, got {tuple(tokens.shape)}.")
    if resid.shape[:2] != tokens.shape:
        raise InputError(f"Residual {tuple(resid.shape)} does not match tokens {tuple(tokens.shape)}.")
    resid = resid.float()
    tokens = tokens.to(resid.device)
    keys, value_means, value_counts = [], [], []
    for t in range(tokens.shape[1]):
        values, inverse, counts = torch.unique(tokens[:, t], sorted=True, return_inverse=True, return_counts=True)
        sums = torch.zeros(len(values), resid.shape[-1], device=resid.device).index_add_(0, inverse, resid[:, t])
        keys.append(values)
        value_means.append(sums / counts[:, None])
        value_counts.append(counts)
    kept = torch.zeros(tokens.shape[1], dtype=torch.bool, device=resid.device)
    if config.keep_self_context:
        kept |= self_context_positions(tokens)
    if config.keep_bos:
        kept[0] = True
    return CamaMeans(layer, resid.mean(0), keys, value_means, value_counts, kept, tokens.shape[0], config.min_count)


def group_key(row: dict) -> Hashable:
    """The alignment group of a :mod:`circuits.tasks` row: template, token count, digit-masked prompt."""
    return (row.get("template_id"), len(row["tokens"]), re.sub(r"\d", "0", row["prompt"]))


def group_rows(dataset: Dataset) -> dict[Hashable, list[int]]:
    """Row indices of ``dataset`` per :func:`group_key`, in dataset order."""
    columns = [c for c in ("template_id", "tokens", "prompt") if c in dataset.column_names]
    groups: dict[Hashable, list[int]] = {}
    for i, row in enumerate(dataset.select_columns(columns).to_list()):
        groups.setdefault(group_key(row), []).append(i)
    return groups


@torch.no_grad()
def residuals(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    layers: Sequence[int],
    batch_size: int = 32,
    fwd_hooks: Sequence = (),
) -> dict[int, Float[Tensor, "batch pos d_model"]]:
    """The residual stream at each CAMA ``layer`` (see :func:`resid_hook_name`), batched, on the model's device."""
    check_positive_int(batch_size, "batch_size")
    names = {resid_hook_name(model, layer): layer for layer in layers}
    out: dict[int, list[Tensor]] = {layer: [] for layer in layers}
    # blocks.L.hook_resid_pre fires inside block L, so run blocks 0..L (stop_at_layer is exclusive).
    stop = min(max(layers) + 1, model.cfg.n_layers)

    def save(resid: Tensor, *, hook: HookPoint) -> None:
        out[names[hook.name]].append(resid.detach())

    for start in range(0, tokens.shape[0], batch_size):
        chunk = tokens[start:start + batch_size].to(model.cfg.device)
        model.run_with_hooks(chunk, fwd_hooks=[*fwd_hooks, *((name, save) for name in names)], stop_at_layer=stop)
    return {layer: torch.cat(parts) for layer, parts in out.items()}


def fit_cama(
    model: HookedTransformer,
    dataset: Dataset,
    layers: int | Iterable[int],
    config: CamaConfig = CamaConfig(),
    *,
    options: SweepOptions | None = None,
) -> dict[Hashable, dict[int, CamaMeans]]:
    """Fit CAMA means on ``dataset`` per alignment group and per layer: ``{group: {layer: means}}``.

    One forward per batch collects the residual at every requested layer; of ``options``
    (:class:`patching.SweepOptions`) only ``batch_size`` applies (default 32 prompts).
    """
    batch_size = sweep_options(options, "fit_cama", ("batch_size",)).batch(32)
    layers = [layers] if isinstance(layers, int) else sorted(set(layers))
    if not layers:
        raise InputError("No CAMA layers given.")
    for layer in layers:
        resid_hook_name(model, layer)  # range check with a clear message
    if len(dataset) == 0:
        raise InputError("Cannot fit CAMA means on an empty dataset.")
    fitted = {}
    for key, rows in group_rows(dataset).items():
        tokens = torch.tensor(dataset.select(rows)["tokens"], device=model.cfg.device)
        resid = residuals(model, tokens, layers, batch_size)
        fitted[key] = {layer: fit_cama_means(tokens, resid[layer], layer, config) for layer in layers}
    return fitted
