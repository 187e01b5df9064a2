"""Position-aware edges: an edge per (sender, receiver, span of the prompt), as PEAP (Haklay et al., ACL 2025).

A **span schema** names the parts of the toolkit's prompt layouts (:mod:`circuits.tasks`: few-shot
problems, multi-digit numbers, word problems, zero-shot formats all carry the positions of the queried
operands and operator):

======== =====================================================================
``bos``    the first token
``shots``  the solved examples before the queried problem
``a``      the first operand's tokens
``op``     the operator's tokens (the word, in word problems)
``b``      the second operand's tokens
``equals`` the tokens after the second operand and before the last (``" ="`` and spaces)
``end``    the last token, where the answer is predicted
``other``  every other token of the queried problem (spaces, words between the parts)
======== =====================================================================

The position-aware edge ``(s, r, span)`` is sender ``s``'s output entering receiver ``r``'s input at the
positions of ``span``: where ``r`` *reads* it. For MLP, query and logits receivers this is PEAP's
within-span edge. For key and value receivers it is the sender's output at ``span`` entering the keys
or values there, which every later query reads (PEAP further splits such edges by the query's span;
here the attention pattern stays the model's, which keeps every circuit an exact run of the model).
In the mixing of :mod:`patching.edges.mixing`, the weight of an edge is looked up by the span of the
position being read. Merging every span (:data:`MERGED`, one span over all positions) gives the
position-free graph exactly.

**Counting.** There are ``n_edges × n_spans`` position-aware edges (gemma-3-270m, 8 spans:
10,342 × 8 = 82,736). Curve sizes are fractions of that total; each point also records the count, so
a position-aware circuit of ``n`` edges can be set beside a position-free circuit of ``n`` edges. Under
counterfactual ablation the positions before the first one where prompt and twin differ (BOS, the
shots, and often the first operand) carry no change, so their edges never matter: they rank last.
"""

from __future__ import annotations

from typing import Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from circuits.errors import InputError

SPANS = ("bos", "shots", "a", "op", "b", "equals", "end", "other")
MERGED = ("all",)


def span_ids(role_masks: dict[str, Tensor], schema: Sequence[str] = SPANS) -> Int[Tensor, "batch pos"]:
    """The span index of every position of a :class:`circuits.tasks.TaskBatch` (its ``role_masks``)."""
    schema = tuple(schema)
    bos = role_masks["bos"]
    if schema == MERGED:
        return torch.zeros(bos.shape, dtype=torch.long, device=bos.device)
    if schema != SPANS:
        raise InputError(f"Unknown span schema {schema}: use patching.edges.positions.SPANS or MERGED.")
    ids = torch.full(bos.shape, SPANS.index("other"), dtype=torch.long, device=bos.device)
    b = role_masks["b"]
    positions = torch.arange(bos.shape[1], device=bos.device)[None]
    last_b = torch.where(b, positions, -1).max(1, keepdim=True).values
    ids[(positions > last_b) & (last_b >= 0)] = SPANS.index("equals")
    for name in ("shots", "a", "op", "b", "bos", "end"):  # later ones win where roles overlap
        ids[role_masks[name]] = SPANS.index(name)
    return ids


def check_schema(schema: Sequence[str] | None) -> tuple[str, ...] | None:
    """``schema`` as a tuple if it is :data:`SPANS` or :data:`MERGED` (None stays None)."""
    if schema is None:
        return None
    schema = tuple(schema)
    if schema not in (SPANS, MERGED):
        raise InputError(f"Unknown span schema {schema}: use patching.edges.positions.SPANS or MERGED.")
    return schema


class PositionalScores:
    """Scores of every position-aware edge: ``scores[f, b, k]`` for edge (f, b) read at span ``spans[k]``."""

    def __init__(self, layout, spans: Sequence[str], scores: Tensor, meta: dict | None = None):
        self.layout, self.spans, self.meta = layout, tuple(spans), dict(meta or {})
        shape = (layout.n_forward, layout.n_backward, len(self.spans))
        if tuple(scores.shape) != shape:
            raise InputError(f"Position-aware scores must have shape {shape}, got {tuple(scores.shape)}.")
        self.scores = scores

    @property
    def real(self) -> Tensor:
        return self.layout.real_edge_mask[:, :, None].expand(-1, -1, len(self.spans))

    @property
    def n_edges(self) -> int:
        """Position-aware edges: every edge of the graph at every span."""
        return self.layout.n_edges * len(self.spans)

    def top(self, n: int, absolute: bool = True) -> Tensor:
        """The ``n`` position-aware edges of largest (|) score (ties in index order): a bool ``[F, R, S]`` mask."""
        if not 0 <= n <= self.n_edges:
            raise InputError(f"n={n} position-aware edges requested, but there are {self.n_edges}.")
        values = self.scores.detach().float().cpu()
        if torch.isnan(values[self.real]).any():
            raise InputError("Some position-aware edges have no score (NaN): score every edge first.")
        ranked = torch.where(self.real, values.abs() if absolute else values, torch.tensor(-torch.inf)).flatten()
        mask = torch.zeros_like(ranked, dtype=torch.bool)
        mask[torch.argsort(ranked, descending=True, stable=True)[:n]] = True
        return mask.view(values.shape)

    def merged(self):
        """The position-free scores: each edge's scores summed over the spans (a :class:`circuits.graph.Graph`)."""
        from circuits.graph import Graph

        summed = torch.where(self.layout.real_edge_mask, self.scores.nan_to_num(0.0).sum(-1), torch.nan)
        return Graph(self.layout, summed, meta=dict(self.meta, spans="merged"))

    def by_span(self) -> dict[str, float]:
        """Σ |score| per span: where the circuit's information is read."""
        total = self.scores.nan_to_num(0.0).abs().sum((0, 1))
        return {name: float(v) for name, v in zip(self.spans, total)}
