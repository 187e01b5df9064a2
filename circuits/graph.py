"""The computational graph of a ``HookedTransformer`` as edges, laid out as hannamw/EAP-IG lays it out.

The residual stream is a sum: the input embedding, every attention head's output and
every MLP's output are added into it, so the input of any later component is a sum of
earlier components' outputs. Each term of that sum is an **edge**.

* **Senders** ("forward" nodes, whose outputs we record): ``input`` (the embeddings),
  every head ``a{L}.h{H}`` and every MLP ``m{L}``.
* **Receivers** ("backward" nodes, whose inputs we differentiate or patch): each head's
  query, key and value input ``a{L}.h{H}<q>`` / ``<k>`` / ``<v>``, each MLP's input
  ``m{L}``, and ``logits`` (the final residual stream).
* An edge ``s -> r`` exists when ``s`` writes to the residual stream before ``r`` reads
  it: heads of layer L feed the MLP of layer L and everything from layer L + 1 on; the
  MLP of layer L feeds layer L + 1 on (parallel attention/MLP blocks: both read the same
  residual). Edge names follow EAP-IG: ``a3.h1->a7.h0<q>``, ``m2->logits``, ``input->m0``.

Grouped- and multi-query attention: receivers are per **query** head (k/v inputs
ungrouped, as TransformerLens' ``ungroup_grouped_query_attention`` gives them), so every
query head reads its own copy of the key/value input and the graph has the same edge
count as EAP-IG's (gemma-3-270m: 10,342 edges). A shared K/V head's input gradient is the
sum over the query heads that use it; scoring per query head says *which* head's use of
the shared key or value matters.

Indices (identical to EAP-IG's, so score matrices move between the two unchanged):
forward ``input`` = 0, head (L, H) = 1 + L·(n_heads + 1) + H, MLP L = 1 + L·(n_heads + 1) +
n_heads; backward head (L, H, x) = L·(3·n_heads + 1) + "qkv".index(x)·n_heads + H, MLP L =
L·(3·n_heads + 1) + 3·n_heads, ``logits`` = n_layers·(3·n_heads + 1). Scores and membership
are dense ``[n_forward, n_backward]`` tensors; :attr:`Graph.real_edge_mask` marks the
entries that are edges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

import torch
from jaxtyping import Bool, Float
from torch import Tensor
from transformer_lens import HookedTransformer, HookedTransformerConfig

from circuits.errors import InputError

QKV = "qkv"
_EDGE_RE = re.compile(r"^(input|a\d+\.h\d+|m\d+)->(logits|m\d+|a\d+\.h\d+<[qkv]>)$")


@dataclass(frozen=True)
class GraphLayout:
    """Sizes and index arithmetic of a model's edge graph (no tensors)."""

    n_layers: int
    n_heads: int
    parallel_attn_mlp: bool = False

    @classmethod
    def of(cls, model_or_cfg: HookedTransformer | HookedTransformerConfig) -> "GraphLayout":
        cfg = model_or_cfg.cfg if isinstance(model_or_cfg, HookedTransformer) else model_or_cfg
        return cls(cfg.n_layers, cfg.n_heads, bool(cfg.parallel_attn_mlp))

    @property
    def n_forward(self) -> int:
        return 1 + self.n_layers * (self.n_heads + 1)

    @property
    def n_backward(self) -> int:
        return self.n_layers * (3 * self.n_heads + 1) + 1

    # --- indices --------------------------------------------------------------------
    def head_forward(self, layer: int, head: int) -> int:
        return 1 + layer * (self.n_heads + 1) + head

    def mlp_forward(self, layer: int) -> int:
        return 1 + layer * (self.n_heads + 1) + self.n_heads

    def head_backward(self, layer: int, head: int, qkv: str) -> int:
        return layer * (3 * self.n_heads + 1) + QKV.index(qkv) * self.n_heads + head

    def mlp_backward(self, layer: int) -> int:
        return layer * (3 * self.n_heads + 1) + 3 * self.n_heads

    @property
    def logits_backward(self) -> int:
        return self.n_backward - 1

    def forward_limit(self, receiver: int) -> int:
        """Senders with forward index < this value feed backward node ``receiver``."""
        if receiver == self.logits_backward:
            return self.n_forward
        layer, offset = divmod(receiver, 3 * self.n_heads + 1)
        start = 1 + layer * (self.n_heads + 1)
        is_mlp = offset == 3 * self.n_heads
        return start + self.n_heads if is_mlp and not self.parallel_attn_mlp else start

    def receiver_owner(self) -> Tensor:
        """For each backward index, the forward index of the node it belongs to (``-1`` for logits)."""
        owner = torch.full((self.n_backward,), -1, dtype=torch.long)
        for layer in range(self.n_layers):
            for head in range(self.n_heads):
                for qkv in QKV:
                    owner[self.head_backward(layer, head, qkv)] = self.head_forward(layer, head)
            owner[self.mlp_backward(layer)] = self.mlp_forward(layer)
        return owner

    # --- names ----------------------------------------------------------------------
    @cached_property
    def forward_names(self) -> list[str]:
        names = ["input"]
        for layer in range(self.n_layers):
            names += [f"a{layer}.h{h}" for h in range(self.n_heads)] + [f"m{layer}"]
        return names

    @cached_property
    def backward_names(self) -> list[str]:
        names = []
        for layer in range(self.n_layers):
            names += [f"a{layer}.h{h}<{x}>" for x in QKV for h in range(self.n_heads)] + [f"m{layer}"]
        return names + ["logits"]

    def forward_index(self, name: str) -> int:
        try:
            return self._forward_lookup[name]
        except KeyError:
            raise InputError(
                f"{name!r} is not a sender of this graph: use 'input', 'a{{L}}.h{{H}}' or 'm{{L}}' "
                f"with L < {self.n_layers}, H < {self.n_heads}."
            ) from None

    def backward_index(self, name: str) -> int:
        try:
            return self._backward_lookup[name]
        except KeyError:
            raise InputError(
                f"{name!r} is not a receiver of this graph: use 'a{{L}}.h{{H}}<q|k|v>', 'm{{L}}' or 'logits' "
                f"with L < {self.n_layers}, H < {self.n_heads}."
            ) from None

    @cached_property
    def _forward_lookup(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.forward_names)}

    @cached_property
    def _backward_lookup(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.backward_names)}

    def edge_index(self, edge_name: str) -> tuple[int, int]:
        """(forward, backward) index of an EAP-IG edge name such as ``'a3.h1->a7.h0<q>'``."""
        match = _EDGE_RE.match(edge_name)
        if match is None:
            raise InputError(f"{edge_name!r} is not an edge name; edges look like 'a3.h1->a7.h0<q>' or 'm2->logits'.")
        f, b = self.forward_index(match.group(1)), self.backward_index(match.group(2))
        if not self.real_edge_mask[f, b]:
            raise InputError(f"{edge_name!r} is not an edge: its sender does not come before its receiver.")
        return f, b

    def edge_name(self, forward: int, backward: int) -> str:
        return f"{self.forward_names[forward]}->{self.backward_names[backward]}"

    # --- masks ----------------------------------------------------------------------
    @cached_property
    def real_edge_mask(self) -> Bool[Tensor, "n_forward n_backward"]:
        limits = torch.tensor([self.forward_limit(b) for b in range(self.n_backward)])
        return torch.arange(self.n_forward)[:, None] < limits[None, :]

    @property
    def n_edges(self) -> int:
        return int(self.real_edge_mask.sum())


@dataclass
class Graph:
    """Edge scores and circuit membership of one model's graph.

    ``scores[f, b]`` is the score of edge (forward f -> backward b), NaN where no edge
    exists; ``in_graph[f, b]`` says whether the edge is in the circuit.
    """

    layout: GraphLayout
    scores: Float[Tensor, "n_forward n_backward"] = None  # type: ignore[assignment]
    in_graph: Bool[Tensor, "n_forward n_backward"] = None  # type: ignore[assignment]
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        shape = (self.layout.n_forward, self.layout.n_backward)
        if self.scores is None:
            self.scores = torch.where(self.layout.real_edge_mask, 0.0, torch.nan)
        if self.in_graph is None:
            self.in_graph = self.layout.real_edge_mask.clone()
        for name, tensor in (("scores", self.scores), ("in_graph", self.in_graph)):
            if tuple(tensor.shape) != shape:
                raise InputError(f"Graph.{name} must have shape {shape} (n_forward, n_backward), got {tuple(tensor.shape)}.")

    @classmethod
    def from_model(cls, model: HookedTransformer | HookedTransformerConfig) -> "Graph":
        return cls(GraphLayout.of(model))

    @property
    def n_edges(self) -> int:
        return self.layout.n_edges

    @property
    def n_edges_in_graph(self) -> int:
        return int((self.in_graph & self.layout.real_edge_mask).sum())
