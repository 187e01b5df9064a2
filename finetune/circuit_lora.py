"""Circuit LoRA: low-rank adapters on a circuit's heads and MLPs only, merged back for evaluation.

Precise SFT (:mod:`finetune.masks`) trains the key heads' slices in full rank; LoRA
(:mod:`finetune.lora`) trains rank-r adapters on every weight. Circuit LoRA sits between them: rank-r
adapters on exactly the slices precise SFT would tune, nothing else.

Which entries get an adapter (the same as :func:`finetune.masks.precise_selection` with K/V tuned,
restricted to the weight matrices of :attr:`finetune.lora.LoraSettings.targets`):

* head ``(l, h)``: its own slice of each attention target, ``W_Q[l][h]`` and ``W_O[l][h]``, and the
  slice of ``W_K``/``W_V`` it reads (under grouped/multi-query attention the stored ``_W_K``/``_W_V``
  row of its KV group, shared with the other query heads of that group, as in precise SFT);
* MLP ``l``: each whole MLP target matrix (``W_in``, ``W_gate``, ``W_out``).

Each adapted slice ``W`` (a ``d_in x d_out`` matrix, used as ``x @ W``) gets its own factors and becomes
``W + (alpha / r) * A @ B`` with ``A`` (``d_in x r``) drawn uniformly in ``±1/sqrt(d_in)`` (peft's
Kaiming init) and ``B`` (``r x d_out``) zero, so training starts from the base model. This is peft's
per-head LoRA of the ``lora`` arm (peft treats a ``[n_heads, d_in, d_out]`` tensor as a stack of
per-head matrices, each with its own factors), kept for the selected heads only: the choice of *per-head
factors on the selected heads' slices*, rather than one adapter on a layer's whole attention matrix with
its update masked to some rows, means the unselected heads have no factors at all, so their weights
cannot move and the trained-entry count is the adapters' own. Biases get no adapter (as in LoRA), and
there is no ``H / h`` gradient rescaling (a LoRA update is not a slice of a shared tensor's gradient).

The adapters are ``torch.nn.utils.parametrize`` parametrizations of the TransformerLens parameters (its
attention calls its module with keywords only, which peft's wrapper does not accept for a subset of
rows): while attached, ``blocks.l.attn.W_Q`` reads as the base tensor with ``A @ B`` added to the
selected rows (``index_add``, so the other rows are the stored values themselves). :func:`merge_circuit_lora`
folds the deltas into the selected rows and removes the parametrizations: the model is a plain
`HookedTransformer` with the base model's parameter names, every entry outside the selected slices
bit-identical to the base.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn
from torch.nn.utils import parametrize
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.nodes import MLP, Head
from finetune.lora import LoraSettings
from finetune.masks import Selection, TunableSlice, precise_selection


class SliceLora(nn.Module):
    """The parametrization of one adapted parameter: per slice (row of dim 0, or the whole 2-D matrix) a pair of
    rank-r factors whose scaled product is added to that slice."""

    def __init__(self, weight: torch.Tensor, rows: tuple[int, ...] | None, r: int, scaling: float,
                 generator: torch.Generator):
        super().__init__()
        d_in, d_out = weight.shape[-2:]
        n_slices = 1 if rows is None else len(rows)
        self.rows = rows
        self.scaling = scaling
        bound = 1.0 / math.sqrt(d_in)
        a = (torch.rand(n_slices, d_in, r, generator=generator, dtype=torch.float32) * 2 - 1) * bound
        self.lora_A = nn.Parameter(a.to(device=weight.device, dtype=weight.dtype))
        self.lora_B = nn.Parameter(torch.zeros(n_slices, r, d_out, device=weight.device, dtype=weight.dtype))

    def delta(self) -> torch.Tensor:
        """The update of the adapted slices, ``[n_slices, d_in, d_out]``."""
        return self.scaling * (self.lora_A @ self.lora_B)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        if self.rows is None:
            return weight + self.delta().reshape(weight.shape)
        rows = torch.tensor(self.rows, device=weight.device)
        return weight.index_add(0, rows, self.delta().to(weight.dtype))


def _target_names(settings: LoraSettings) -> set[str]:
    """Parameter-name suffixes the targets mean, K/V also in their stored (grouped-query) spelling."""
    names = set()
    for target in settings.targets:
        module, _, param = target.rpartition(".")
        names |= {target, f"{module}._{param}"}
    return names


def circuit_lora_slices(model: HookedTransformer, heads: Sequence[Head], mlps: Sequence[MLP] = (),
                        settings: LoraSettings = LoraSettings()) -> Selection:
    """The weight slices circuit LoRA adapts (rows of dim 0 per head, whole MLP matrices), as a
    :class:`finetune.masks.Selection`: the entries the merged model may differ in."""
    if settings.layers is not None:
        raise InputError(f"Circuit LoRA adapts the layers of its heads and MLPs; LoraSettings.layers="
                         f"{settings.layers} is for LoRA on every head: leave it None.")
    precise = precise_selection(model, heads, mlps, tune_kv=True, rescale=False)
    targets = _target_names(settings)
    params = dict(model.named_parameters())
    slices = tuple(TunableSlice(s.name, s.index) for s in precise.slices
                   if s.name.split(".", 2)[2] in targets and params[s.name].ndim in (2, 3))
    if not slices:
        raise InputError(f"No weight of the given heads/MLPs matches the LoRA targets {settings.targets}: add "
                         "attention targets (attn.W_Q, ...) for heads, MLP targets (mlp.W_in, ...) for MLPs.")
    nodes = precise.description.split(": ", 1)[1]
    return Selection(slices, f"circuit lora r={settings.r} on {len(slices)} tensors of {nodes}")


def attach_circuit_lora(model: HookedTransformer, selection: Selection, settings: LoraSettings = LoraSettings(), *,
                        seed: int = 0) -> list[str]:
    """Adapt each slice of ``selection`` (from :func:`circuit_lora_slices`) in place; freeze everything else;
    return the factors' parameter names (two per adapted tensor, each holding every slice's factor)."""
    if any(isinstance(m, SliceLora) for m in model.modules()):
        raise InputError("The model already carries circuit LoRA adapters; merge_circuit_lora() it first.")
    for p in model.parameters():
        p.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    for s in selection.slices:
        module_name, _, param_name = s.name.rpartition(".")
        module = model.get_submodule(module_name)
        adapter = SliceLora(getattr(module, param_name), s.index, settings.r, settings.alpha / settings.r, generator)
        parametrize.register_parametrization(module, param_name, adapter)
    names = [n for n, _ in model.named_parameters() if ".lora_" in n]
    for n, p in model.named_parameters():
        p.requires_grad_(".lora_" in n)
    return names


@torch.no_grad()
def merge_circuit_lora(model: nn.Module) -> nn.Module:
    """Fold every circuit LoRA delta into its slices and remove the parametrizations (in place; returns ``model``)."""
    merged = 0
    for module in list(model.modules()):
        if not parametrize.is_parametrized(module):
            continue
        for param_name in list(module.parametrizations.keys()):
            adapters = [p for p in module.parametrizations[param_name] if isinstance(p, SliceLora)]
            if not adapters:
                continue
            (adapter,) = adapters
            delta = adapter.delta()
            parametrize.remove_parametrizations(module, param_name, leave_parametrized=False)
            weight = getattr(module, param_name)
            if adapter.rows is None:
                weight.add_(delta.reshape(weight.shape).to(weight.dtype))
            else:  # only the adapted rows are written: the others stay bit-identical
                weight.index_add_(0, torch.tensor(adapter.rows, device=weight.device), delta.to(weight.dtype))
            merged += 1
    if merged == 0:
        raise InputError("The model carries no circuit LoRA adapters to merge.")
    for p in model.parameters():
        p.requires_grad_(True)
    return model
