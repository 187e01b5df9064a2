"""Selections beyond a single score: ensembles of rankings, bootstrapped sign-stable scores, an ILP circuit.

The MIB shared task (2025) gained over single attribution scores in three ways, all here:

* **Ensembles** (Mondorf et al., arXiv 2510.06811): several rankings of the same edges (EAP, EAP-IG,
  exact effects, learned masks) are put on one scale and combined edge by edge.
  :func:`normalise` puts a ranking on ``[0, 1]`` by rank (``"rank"``: the edge's rank among all edges by
  |score|, 1 = best) or by scale (``"scale"``: |score| / max |score|); :func:`ensemble` takes the mean,
  the min (an edge must rank high everywhere) or the max (anywhere) of the normalised rankings. An
  ensemble of identical rankings ranks as that ranking.
* **Bootstrapped scores** (Nikankin et al., arXiv 2510.25786): the attribution is recomputed on ``B``
  resamples of the prompts (with replacement); each edge gets the mean and a normal 95% interval
  ``mean ± z · sd / sqrt(B)``; an edge is *sign-stable* when that interval excludes 0
  (:func:`bootstrap_scores`). Unstable edges rank below every stable one (:meth:`BootstrapScores.graph`).
* **An ILP circuit** (:func:`ilp_selector`): at budget ``n``, the edge set that maximises the summed score
  subject to every chosen edge's endpoints being in the circuit and every circuit node (but ``input``)
  having a chosen incoming edge and every node (but ``logits``) a chosen outgoing one: on the DAG of
  the model this is "every edge lies on an input-to-logits path", the property MIB's pruning enforces
  after the fact, here enforced while choosing (scipy's ``milp``, HiGHS). Optionally at least a share
  ``positive_ratio`` of the chosen edges have a positive signed score (the positive/negative ratio rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout

HOWS = ("mean", "min", "max")
NORMALISATIONS = ("rank", "scale")

ScoresLike = Union[Graph, Tensor, object]


def _scores(layout: GraphLayout, scores: ScoresLike) -> Tensor:
    scores = scores.scores if not isinstance(scores, Tensor) else scores
    if tuple(scores.shape) != (layout.n_forward, layout.n_backward):
        raise InputError(f"Scores must be [n_forward, n_backward] = {(layout.n_forward, layout.n_backward)}, "
                         f"got {tuple(scores.shape)}.")
    real = scores.detach().float().cpu()[layout.real_edge_mask]
    if not torch.isfinite(real).all():
        raise InputError("A ranking to combine has NaN or infinite scores on real edges: score every edge first.")
    return scores.detach().float().cpu()


def normalise(layout: GraphLayout, scores: ScoresLike, how: str = "rank") -> Tensor:
    """``[n_forward, n_backward]`` in [0, 1], NaN off the graph: by rank of |score| (``"rank"``) or by scale."""
    if how not in NORMALISATIONS:
        raise InputError(f"Unknown normalisation {how!r}: use one of {NORMALISATIONS}.")
    real = layout.real_edge_mask
    values = _scores(layout, scores)[real].abs()
    if how == "scale":
        top = values.max()
        normed = values / top if top > 0 else torch.zeros_like(values)
    else:  # 1 for the best edge, 1/n for the worst; ties share the average of their ranks
        order = torch.argsort(values, stable=True)
        ranks = torch.empty_like(values)
        ranks[order] = torch.arange(1, len(values) + 1, dtype=values.dtype)
        unique, inverse = torch.unique(values, return_inverse=True)
        mean_rank = torch.zeros(len(unique)).index_add_(0, inverse, ranks) / torch.bincount(inverse).float()
        normed = mean_rank[inverse] / len(values)
    out = torch.full(real.shape, float("nan"))
    out[real] = normed
    return out


def ensemble(layout: GraphLayout, rankings: Sequence[ScoresLike], how: str = "mean",
             normalisation: str = "rank") -> Graph:
    """One Graph whose scores combine the normalised ``rankings`` edge by edge (module docstring)."""
    if how not in HOWS:
        raise InputError(f"Unknown ensemble rule {how!r}: use one of {HOWS}.")
    if not rankings:
        raise InputError("An ensemble needs at least one ranking.")
    stacked = torch.stack([normalise(layout, r, normalisation) for r in rankings])
    combined = {"mean": stacked.mean(0), "min": stacked.min(0).values, "max": stacked.max(0).values}[how]
    return Graph(layout, combined, meta={"method": f"ensemble:{how}:{normalisation}", "n_rankings": len(rankings)})


# ---------------------------------------------------------------------------- bootstrap


@dataclass
class BootstrapScores:
    """Per-edge mean score over ``n_resamples`` prompt resamples, its 95% interval, and which edges are sign-stable."""

    layout: GraphLayout
    mean: Tensor
    low: Tensor
    high: Tensor
    n_resamples: int

    @property
    def stable(self) -> Tensor:
        """Edges whose interval excludes 0 (NaN-free, real edges only)."""
        return ((self.low > 0) | (self.high < 0)) & self.layout.real_edge_mask

    def graph(self) -> Graph:
        """Scores for selection: |mean| shifted so every sign-stable edge ranks above every unstable one."""
        magnitude = self.mean.abs().nan_to_num(0.0)
        shifted = torch.where(self.stable, magnitude + float(magnitude.max()) + 1.0, magnitude)
        scores = torch.where(self.layout.real_edge_mask, shifted, torch.nan)
        return Graph(self.layout, scores, meta={"method": "bootstrap sign-stable", "n_resamples": self.n_resamples,
                                                "n_stable": int(self.stable.sum())})


def bootstrap_scores(score: Callable[[Sequence[int]], ScoresLike], n_prompts: int, layout: GraphLayout, *,
                     n_resamples: int = 10, seed: int = 0, confidence: float = 0.95) -> BootstrapScores:
    """``score(rows)`` (the attribution of the prompts ``rows``) on ``n_resamples`` resamples with replacement."""
    if n_resamples < 2:
        raise InputError(f"A bootstrap needs at least 2 resamples, got {n_resamples}.")
    g = torch.Generator().manual_seed(seed)
    draws = torch.stack([_scores(layout, score(torch.randint(n_prompts, (n_prompts,), generator=g).tolist()))
                         for _ in range(n_resamples)]).double()
    mean, sd = draws.mean(0), draws.std(0, unbiased=True)
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    half = z * sd / math.sqrt(n_resamples)
    return BootstrapScores(layout, mean.float(), (mean - half).float(), (mean + half).float(), n_resamples)


# ---------------------------------------------------------------------------- ILP


def _incidence(layout: GraphLayout):
    """Edges as (sender node, receiver node) indices; nodes are the forward nodes plus ``logits`` (last)."""
    real = layout.real_edge_mask
    owner = layout.receiver_owner()  # backward -> forward node, -1 for logits
    logits = layout.n_forward
    f_idx, b_idx = real.nonzero(as_tuple=True)
    receiver_node = owner[b_idx]
    receiver_node = torch.where(receiver_node < 0, torch.tensor(logits), receiver_node)
    return f_idx, b_idx, receiver_node, logits + 1


def ilp_select(layout: GraphLayout, scores: ScoresLike, n: int, *, absolute: bool = True,
               positive_ratio: Optional[float] = None, time_limit: float = 60.0) -> Tensor:
    """The ILP circuit of at most ``n`` edges (module docstring) as a bool mask ``[n_forward, n_backward]``."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix, vstack

    signed = _scores(layout, scores)
    f_idx, b_idx, to_node, n_nodes = _incidence(layout)
    s = signed[f_idx, b_idx].double().numpy()
    weight = np.abs(s) if absolute else s
    E = len(weight)
    if not 0 <= n <= E:
        raise InputError(f"n={n} edges requested, but the graph has {E}.")
    out = torch.zeros(layout.n_forward, layout.n_backward, dtype=torch.bool)
    if n == 0:
        return out
    # variables: x (E edges), then y (n_nodes nodes)
    cost = np.concatenate([-(weight / max(weight.max(), 1e-30) + 1e-9), np.zeros(n_nodes)])  # prefer more edges on ties
    rows, cols, vals, lower, upper = [], [], [], [], []
    r = 0

    def add(entries, lo, hi):
        nonlocal r
        for c, v in entries:
            rows.append(r), cols.append(c), vals.append(v)
        lower.append(lo), upper.append(hi)
        r += 1

    add([(e, 1.0) for e in range(E)], 0, n)  # the budget
    src, dst = f_idx.numpy(), to_node.numpy()
    for e in range(E):  # an edge needs both its nodes
        add([(e, 1.0), (E + src[e], -1.0)], -np.inf, 0)
        add([(e, 1.0), (E + dst[e], -1.0)], -np.inf, 0)
    incoming = [[] for _ in range(n_nodes)]
    outgoing = [[] for _ in range(n_nodes)]
    for e in range(E):
        outgoing[src[e]].append(e)
        incoming[dst[e]].append(e)
    logits = n_nodes - 1
    for v in range(n_nodes):  # a node in the circuit has a chosen edge in (but input) and out (but logits)
        if v != 0:
            add([(e, 1.0) for e in incoming[v]] + [(E + v, -1.0)], 0, np.inf)
        if v != logits:
            add([(e, 1.0) for e in outgoing[v]] + [(E + v, -1.0)], 0, np.inf)
    if positive_ratio is not None:
        positive = [e for e in range(E) if s[e] > 0]
        add([(e, 1.0) for e in positive], min(math.floor(positive_ratio * n), len(positive)), np.inf)
    A = coo_matrix((vals, (rows, cols)), shape=(r, E + n_nodes)).tocsr()
    lb = np.zeros(E + n_nodes)
    ub = np.ones(E + n_nodes)
    lb[E + 0] = lb[E + logits] = 1  # input and logits are always in the circuit
    result = milp(cost, constraints=LinearConstraint(A, lower, upper), integrality=np.ones(E + n_nodes),
                  bounds=Bounds(lb, ub), options={"time_limit": time_limit, "disp": False})
    if result.x is None:
        raise InputError(f"The ILP found no circuit of {n} edges within {time_limit:g} s ({result.message}).")
    chosen = torch.from_numpy(result.x[:E] > 0.5)
    out[f_idx[chosen], b_idx[chosen]] = True
    return out


def ilp_selector(layout: GraphLayout, *, absolute: bool = True, positive_ratio: Optional[float] = None,
                 time_limit: float = 60.0):
    """``(scores, n) -> bool mask``: :func:`ilp_select`, for ``select=`` of :func:`patching.edges.faithfulness_curve`.

    Solutions are remembered per (scores, n), so the curves of both halves of the prompts solve each size once.
    """
    solved: dict[tuple, Tensor] = {}

    def select(scores: Tensor, n: int) -> Tensor:
        key = (scores.data_ptr(), tuple(scores.shape), scores._version, n)
        if key not in solved:
            solved[key] = ilp_select(layout, scores, n, absolute=absolute, positive_ratio=positive_ratio,
                                     time_limit=time_limit)
        return solved[key].clone()

    return select
