"""Names for the nodes of a transformer's computational graph: attention heads and MLPs.

A node knows the TransformerLens hook point that carries its output:

* ``Head(layer, head)`` writes through ``blocks.{layer}.attn.hook_z`` (its slice
  ``[..., head, :]``); under grouped- or multi-query attention ``hook_z`` is still
  per *query* head, so every head is a separate node.
* ``MLP(layer)`` writes through ``blocks.{layer}.hook_mlp_out``.

Hook names come from ``transformer_lens.utils.get_act_name`` and are checked
against ``model.hook_dict`` by :func:`validate_nodes` at public entry points.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Union

from transformer_lens import HookedTransformer
from transformer_lens import utils as tl_utils

from circuits.errors import InputError, InputTypeError


@dataclass(frozen=True, order=True)
class Head:
    """Attention head ``head`` of layer ``layer`` (both 0-based)."""

    layer: int
    head: int

    @property
    def hook_name(self) -> str:
        return tl_utils.get_act_name("z", self.layer)

    def __str__(self) -> str:
        return f"L{self.layer}H{self.head}"


@dataclass(frozen=True, order=True)
class MLP:
    """The MLP of layer ``layer`` (0-based)."""

    layer: int

    @property
    def hook_name(self) -> str:
        return tl_utils.get_act_name("mlp_out", self.layer)

    def __str__(self) -> str:
        return f"MLP{self.layer}"


Node = Union[Head, MLP]


def all_heads(model: HookedTransformer) -> list[Head]:
    """Every attention head of ``model``, layer-major."""
    return [Head(l, h) for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]


def all_mlps(model: HookedTransformer) -> list[MLP]:
    """Every MLP of ``model`` (none for attention-only models)."""
    if model.cfg.attn_only:
        return []
    return [MLP(l) for l in range(model.cfg.n_layers)]


def all_nodes(model: HookedTransformer) -> list[Node]:
    """Every head, then every MLP."""
    return [*all_heads(model), *all_mlps(model)]


def parse_node(text: str) -> Node:
    """Parse ``"L3H1"`` into ``Head(3, 1)`` and ``"MLP5"`` into ``MLP(5)``."""
    cleaned = text.strip().upper()
    try:
        if cleaned.startswith("MLP"):
            return MLP(int(cleaned[3:]))
        if cleaned.startswith("L") and "H" in cleaned:
            layer, head = cleaned[1:].split("H")
            return Head(int(layer), int(head))
    except ValueError:
        pass
    raise InputError(f"Cannot parse node {text!r}: write heads as 'L<layer>H<head>' (e.g. 'L3H1') and MLPs as 'MLP<layer>'.")


def validate_nodes(model: HookedTransformer, nodes: Iterable[Node]) -> list[Node]:
    """Check that each node exists in ``model`` and its hook point is present; return them as a list."""
    checked = []
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    for node in nodes:
        if not isinstance(node, (Head, MLP)):
            raise InputTypeError(f"Expected Head or MLP nodes, got {node!r} of type {type(node).__name__}: write "
                                 f"Head(layer, head) / MLP(layer), or parse names with circuits.nodes.parse_node('L3H1').")
        if not 0 <= node.layer < n_layers:
            raise InputError(f"{node!r}: layer {node.layer} is out of range; the model has layers 0..{n_layers - 1}.")
        if isinstance(node, Head) and not 0 <= node.head < n_heads:
            raise InputError(f"{node!r}: head {node.head} is out of range; the model has heads 0..{n_heads - 1} per layer.")
        if isinstance(node, MLP) and model.cfg.attn_only:
            raise InputError(f"{node!r}: the model is attention-only and has no MLPs.")
        if node.hook_name not in model.hook_dict:
            raise InputError(f"{node!r}: hook point {node.hook_name!r} not found on the model.")
        checked.append(node)
    return checked
