"""Interventions on number representations: frequency filters, helix-subspace patching, heuristic neurons.

All three act at END (the token before the answer) of arithmetic prompts, and are
scored on the first answer token.

**Frequency filter** (Zhou et al. 2024). Take a component's output h_i at END of
prompt i (an MLP's ``mlp_out`` or attention's ``attn_out`` at one layer) and the
prompt's result s_i = a + b. The sum-conditional mean m(s) over s = 0..S is a signal
over s; its discrete Fourier transform splits it into frequencies. The filter removes
(``mode="remove"``) or keeps only (``mode="keep"``) chosen frequencies of m and puts
the result back: ``h_i' = h_i − m(s_i) + m_filtered(s_i)``. What varies within a sum
is untouched, so the intervention removes exactly the chosen frequency components of
what the component writes about the sum. Zhou et al. find MLPs carry the
low-frequency (magnitude) part and attention the high-frequency (modular) part.

**Subspace patching** (Kantamneni & Tegmark 2025). Run a clean prompt and replace,
at END of one hook, only the projection of the activation onto a subspace with an
orthonormal basis Q by that of a counterfactual prompt (another a):
``h' = h + (h_cf − h) Q Qᵀ``. Q is the helix subspace (span of the fitted C), a PCA
subspace of the same dimension, or everything (the whole layer). The effect is the
fraction of the logit difference moved: ``(LD_clean − LD_patched) / (LD_clean − LD_cf)``
with LD = logit(clean answer) − logit(counterfactual answer), as a ratio of means over
pairs with a bootstrap interval.

**Heuristic neurons** (Nikankin et al. 2025). The MLP neurons (``mlp.hook_post``) at END
are ranked by attribution to the answer: per prompt, ``(act − mean act) · ∂LD/∂act``
(the first-order effect of mean-ablating the neuron), averaged in absolute value.
Their activation grids over (a, b) are classified by :mod:`circuits.analyze.heuristic_neurons`;
:func:`neuron_knockout_hooks` mean-ablates a set of neurons at END.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Literal, Sequence

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.utilities import get_act_name

from circuits.errors import InputError
from circuits.arguments import check_option
from circuits.answer_scoring import answer_is_argmax, answer_is_top1
from circuits.end_logits import unembed_end
from circuits.analyze.number_tokens import length_chunks
from circuits.stats import Estimate, bootstrap

HookList = list[tuple[str, Callable]]
EditFn = Callable[[list[int]], HookList]  # prompt indices of a batch -> hooks for that batch


def evaluate_end(
    model: HookedTransformer,
    token_lists: Sequence[Sequence[int]],
    answer_ids: Sequence[int],
    *,
    alt_ids: Sequence[int] | None = None,
    edit: EditFn | None = None,
    batch_size: int = 64,
) -> dict[str, Tensor]:
    """Per prompt: top-1 correct (full vocabulary) and, with ``alt_ids``, the logit difference answer − alt.

    ``edit(indices)`` returns the hooks for the batch holding those prompts (per-prompt
    edits need to know which prompts they touch; batches group prompts of one length).
    """
    if len(token_lists) != len(answer_ids):
        raise InputError(f"Got {len(token_lists)} prompts but {len(answer_ids)} answers.")
    device = model.cfg.device
    correct = torch.zeros(len(token_lists), dtype=torch.bool)
    diff = torch.full((len(token_lists),), float("nan"))
    with torch.no_grad():
        for chunk in length_chunks(token_lists, batch_size):
            tokens = torch.tensor([token_lists[i] for i in chunk], device=device)
            hooks = edit(chunk) if edit is not None else []
            resid = model.run_with_hooks(tokens, fwd_hooks=hooks, stop_at_layer=model.cfg.n_layers)[:, -1]
            answers = torch.tensor([answer_ids[i] for i in chunk])
            if alt_ids is None:  # the hit alone: the screened argmax spares the full unembedding
                correct[chunk] = answer_is_top1(model, resid, answers).cpu()
                continue
            logits = unembed_end(model, resid).float().cpu()
            correct[chunk] = answer_is_argmax(logits, answers)
            alts = torch.tensor([alt_ids[i] for i in chunk])
            diff[chunk] = logits.gather(1, answers[:, None])[:, 0] - logits.gather(1, alts[:, None])[:, 0]
    return {"correct": correct, "logit_diff": diff}


def end_edit_hook(name: str, new_rows: Callable[[Tensor, list[int]], Tensor]) -> EditFn:
    """An :data:`EditFn` that replaces the END row of hook ``name`` by ``new_rows(old_rows, indices)``."""
    def edit(chunk: list[int]) -> HookList:
        def hook(tensor, *, hook):
            tensor = tensor.clone()
            tensor[:, -1] = new_rows(tensor[:, -1], chunk).to(tensor.dtype)
            return tensor
        return [(name, hook)]
    return edit


# ---------------------------------------------------------------------------- frequency filter


def frequency_band(n_values: int, *, min_period: float = 0.0, max_period: float = float("inf")) -> list[int]:
    """Frequencies k (1..n_values//2) whose period n_values/k lies in [min_period, max_period]."""
    return [k for k in range(1, n_values // 2 + 1) if min_period <= n_values / k <= max_period]


FilterMode = Literal["remove", "keep"]


def fourier_filter(means: Float[Tensor, "v d"], frequencies: Sequence[int], mode: FilterMode = "remove") -> Float[Tensor, "v d"]:
    """Remove the chosen frequencies of ``means`` over its rows, or keep only them (and the mean, k = 0)."""
    check_option("mode", mode, FilterMode)
    n = means.shape[0]
    bad = [k for k in frequencies if not 1 <= k <= n // 2]
    if bad:
        raise InputError(f"Frequencies {bad} are outside 1..{n // 2} for a signal of {n} values.")
    spectrum = torch.fft.rfft(means.double(), dim=0)
    chosen = torch.zeros(spectrum.shape[0], dtype=torch.bool)
    chosen[list(frequencies)] = True
    keep = ~chosen if mode == "remove" else chosen
    keep[0] = True  # the mean over s is not a frequency we filter
    return torch.fft.irfft(spectrum * keep[:, None], n=n, dim=0).to(means.dtype)


def frequency_filter_edit(
    name: str, outputs: Float[Tensor, "n d"], results: Sequence[int], frequencies: Sequence[int], mode: str = "remove"
) -> tuple[EditFn, list[int]]:
    """The edit that filters ``outputs`` (the hook's END rows, one per prompt) over the result s = min..max.

    Every result in the range must occur (sample prompts stratified by result). Returns
    the edit and the result values, so callers can name the periods (len(values) / k).
    """
    results_t = torch.as_tensor(list(results))
    values = list(range(int(results_t.min()), int(results_t.max()) + 1))
    missing = sorted(set(values) - set(results_t.tolist()))
    if missing:
        raise InputError(f"Results {missing[:10]} never occur; the filter needs every result in "
                         f"{values[0]}..{values[-1]} (sample prompts per result).")
    means = torch.stack([outputs[results_t == v].mean(0) for v in values])
    shift = fourier_filter(means, frequencies, mode) - means  # [v, d]
    per_prompt = shift[results_t - values[0]]
    return end_edit_hook(name, lambda old, chunk: old + per_prompt[chunk].to(old.device)), values


# ---------------------------------------------------------------------------- subspace patching


def subspace_patch_edit(name: str, cf_rows: Float[Tensor, "n d"], basis: Float[Tensor, "d r"] | None) -> EditFn:
    """Replace the projection of the END row onto span(basis) by the counterfactual's (``None``: the whole row)."""
    if basis is None:
        return end_edit_hook(name, lambda old, chunk: cf_rows[chunk].to(old.device, old.dtype))
    if basis.ndim != 2 or basis.shape[0] != cf_rows.shape[1]:
        raise InputError(f"The basis must be [d_model={cf_rows.shape[1]}, rank], got {tuple(basis.shape)}.")
    projector = (basis @ basis.T).float()

    def new_rows(old, chunk):
        delta = cf_rows[chunk].to(old.device, torch.float32) - old.float()
        return old.float() + delta @ projector.to(old.device)
    return end_edit_hook(name, new_rows)


def fraction_moved(clean: Tensor, cf: Tensor, patched: Tensor, *, seed: int = 0) -> Estimate:
    """(mean LD_clean − mean LD_patched) / (mean LD_clean − mean LD_cf), bootstrapped over pairs."""
    columns = np.stack([clean.numpy(), cf.numpy(), patched.numpy()], 1).astype(np.float64)

    def statistic(rows):
        gap = rows[:, 0].mean() - rows[:, 1].mean()
        return float((rows[:, 0].mean() - rows[:, 2].mean()) / gap) if abs(gap) > 1e-9 else float("nan")
    return bootstrap(columns, statistic, n_resamples=1000, seed=seed)


# ---------------------------------------------------------------------------- heuristic neurons


def neuron_attribution(
    model: HookedTransformer,
    token_lists: Sequence[Sequence[int]],
    answer_ids: Sequence[int],
    layers: Sequence[int],
    *,
    candidate_ids: Sequence[int],
    batch_size: int = 32,
) -> tuple[Float[Tensor, "layer d_mlp"], Float[Tensor, "n layer d_mlp"]]:
    """Mean |(act − mean act) · ∂LD/∂act| per END neuron, and the END activations themselves.

    LD is the answer's logit minus the mean logit of ``candidate_ids`` (e.g. the ten digits).
    """
    names = [get_act_name("post", layer) for layer in layers]
    missing = [n for n in names if n not in model.hook_dict]
    if missing:
        raise InputError(f"This model has no MLP neuron hooks {missing}.")
    device = model.cfg.device
    acts = torch.zeros(len(token_lists), len(layers), model.cfg.d_mlp)
    grads = torch.zeros_like(acts)
    candidates = torch.tensor(list(candidate_ids), device=device)
    for chunk in length_chunks(token_lists, batch_size):
        stored: dict[str, Tensor] = {}

        def keep(tensor, *, hook):
            stored[hook.name] = tensor
            return tensor

        with torch.enable_grad():
            tokens = torch.tensor([token_lists[i] for i in chunk], device=device)
            resid = model.run_with_hooks(tokens, fwd_hooks=[(n, keep) for n in names],
                                         stop_at_layer=model.cfg.n_layers)[:, -1]
            logits = unembed_end(model, resid)
            answers = torch.tensor([answer_ids[i] for i in chunk], device=device)
            metric = logits.gather(1, answers[:, None])[:, 0] - logits[:, candidates].mean(1)
            grad = torch.autograd.grad(metric.sum(), [stored[n] for n in names])
        for j, name in enumerate(names):
            acts[chunk, j] = stored[name][:, -1].detach().float().cpu()
            grads[chunk, j] = grad[j][:, -1].float().cpu()
    scores = ((acts - acts.mean(0)) * grads).abs().mean(0)
    return scores, acts


def top_neurons(scores: Float[Tensor, "layer d_mlp"], layers: Sequence[int], k: int) -> list[tuple[int, int]]:
    """The ``k`` (layer, neuron) pairs with the largest score."""
    if not 1 <= k <= scores.numel():
        raise InputError(f"k must lie in 1..{scores.numel()}, got {k}.")
    flat = scores.reshape(-1).topk(k).indices
    return [(layers[int(i) // scores.shape[1]], int(i) % scores.shape[1]) for i in flat]


def neuron_knockout_edit(neurons: Sequence[tuple[int, int]], means: dict[int, Tensor]) -> EditFn:
    """Mean-ablate the given (layer, neuron) pairs at END; ``means[layer]`` is [d_mlp]."""
    by_layer: dict[int, list[int]] = defaultdict(list)
    for layer, index in neurons:
        by_layer[layer].append(index)

    def edit(chunk: list[int]) -> HookList:
        hooks = []
        for layer, indices in by_layer.items():
            def ablate(tensor, *, hook, indices=indices, layer=layer):
                tensor = tensor.clone()
                tensor[:, -1, indices] = means[layer][indices].to(tensor.device, tensor.dtype)
                return tensor
            hooks.append((get_act_name("post", layer), ablate))
        return hooks
    return edit
