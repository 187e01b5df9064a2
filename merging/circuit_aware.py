"""Circuit-aware closed-form merging: fine-grained α where the circuit lives, coarse α elsewhere.

Closed-form submodule merging (:func:`merging.merge_submodules`, Dai et al. ICLR 2025)
fits one α per expert for every submodule. The finer the submodules, the more
freedom the fit has, but also the fewer constraints per α (and the more it
can overfit ~30 samples). Circuit-aware merging spends that freedom only where
a task's circuit is: in every layer that holds a *key head* (found e.g. by path
patching the base model on the math tasks, :mod:`patching`), each head gets its
own α (level ``"head"``); in the other layers the attention and the MLP get one
α each (level ``"attn_mlp"``).

This module takes the key heads as plain :class:`circuits.nodes.Head` objects
(it does not import :mod:`patching`), builds the per-layer level plan with
:func:`circuit_levels` and hands it to :func:`merging.merge_submodules` via its
``levels=`` argument (:func:`merge_circuit_aware`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.nodes import Head
from circuits.arguments import check_option
from merging.state_dicts import SourceLike
from merging.submodule import LayerLevel, SubmoduleMergeConfig, SubmoduleMergeResult, merge_submodules


def circuit_levels(
    key_heads: Iterable[Head], n_layers: int, inside: LayerLevel = "head", outside: LayerLevel = "attn_mlp"
) -> dict[int, LayerLevel]:
    """The per-layer level plan: ``inside`` for every layer holding a key head, ``outside`` for the rest.

    Returns ``{layer: level}`` for all ``n_layers`` layers (a mapping accepted by
    ``merge_submodules(..., levels=...)``). Raises ``ValueError`` for a key head
    outside ``range(n_layers)`` or a level that is not a per-layer level.
    """
    for level in (inside, outside):
        check_option("per-layer level", level, LayerLevel)
    layers = set()
    for h in key_heads:
        if not 0 <= h.layer < n_layers:
            raise InputError(f"Key head {h} is outside the model's {n_layers} layers.")
        layers.add(h.layer)
    return {layer: inside if layer in layers else outside for layer in range(n_layers)}


def merge_circuit_aware(
    model: HookedTransformer,
    experts: Sequence[SourceLike],
    tasks: Sequence,
    key_heads: Iterable[Head],
    config: SubmoduleMergeConfig = SubmoduleMergeConfig(),
    *,
    inside: str = "head",
    outside: str = "attn_mlp",
    expert_names: Sequence[str] | None = None,
    progress: bool = True,
) -> SubmoduleMergeResult:
    """Closed-form merge with ``inside`` level in the key heads' layers and ``outside`` elsewhere.

    Arguments as in :func:`merging.merge_submodules`; ``model`` holds the base θ0.
    """
    levels = circuit_levels(key_heads, model.cfg.n_layers, inside, outside)
    return merge_submodules(model, experts, tasks, config, levels=levels, expert_names=expert_names,
                            progress=progress)
