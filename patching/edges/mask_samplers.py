"""What each learned-circuit method learns: its parameters, the masks it samples each step, its own penalty, and
its final edge scores (the methods and their papers: :mod:`patching.edges.learn`, which trains them).

* :class:`EdgePruning`: hard-concrete gates (Louizos et al. 2018; Bhaskar et al. 2024) with a Lagrangian on the
  expected L0;
* :class:`UGS`: MIB's uniform gradient sampling;
* :class:`Matryoshka`: soft top-k masks at random budgets;
* :class:`TopN`: the hard top-n circuits at the reported sizes with the soft top-n's gradient (straight through).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from circuits.graph import GraphLayout

#: each method's learning rate when LearnConfig.lr is None. top-n's was chosen on validation prompts
#: (``python -m experiments.learned_circuit``, docs/results.md): Adam moves every score by about lr a step whatever
#: its gradient, so a larger lr lets the noisy edges near a size's threshold random-walk past each other and two
#: prompt sets give two circuits; the others were set before any held-out evaluation.
DEFAULT_LR = {"edge-pruning": 0.1, "ugs": 0.1, "matryoshka": 0.05, "top-n": 0.02}

# hard-concrete constants (Louizos et al. 2018, as Edge Pruning uses them)
BETA, LEFT, RIGHT, EPS = 2.0 / 3.0, -0.1, 1.1, 1e-6


class MaskMethod:
    """One method's parameters, the masks it runs each step, its extra loss, and its final scores."""

    def __init__(self, layout: GraphLayout, cfg, init: Optional[Tensor], device, generator):
        """``cfg``: the run's :class:`patching.edges.learn.LearnConfig` (read for its method's fields); ``init``: warm
        start scores of the real edges' graph, or None; ``generator``: the run's seeded stream."""
        self.layout, self.cfg, self.generator = layout, cfg, generator
        self.real = layout.real_edge_mask.to(device)
        self.n_edges = int(self.real.sum())
        start = self._initial(init, device)
        self.param = torch.nn.Parameter(start)
        self.optimizer = torch.optim.Adam([self.param], lr=cfg.lr if cfg.lr is not None else DEFAULT_LR[cfg.method])

    def _initial(self, init: Optional[Tensor], device) -> Tensor:
        if init is None:  # the default, plus a little seeded noise so no two edges tie
            noise = 1e-3 * torch.randn(self.n_edges, generator=self.generator)
            return (self.default_init + noise).to(device)
        values = init.detach().float().to(device)[self.real].abs().nan_to_num(0.0)
        return self.from_warm(((values - values.mean()) / values.std().clamp_min(1e-12)))

    default_init = 0.0

    def from_warm(self, z: Tensor) -> Tensor:
        return z

    def dense(self, flat: Tensor) -> Tensor:
        """``[C, n_edges]`` -> ``[C, n_forward, n_backward]`` (zeros where no edge exists)."""
        out = flat.new_zeros(flat.shape[0], *self.real.shape)
        out[:, self.real] = flat
        return out

    def _uniform(self, shape) -> Tensor:
        return torch.rand(shape, generator=self.generator).to(self.param.device)

    def masks(self, step: int, n: int) -> Tensor:
        raise NotImplementedError

    def penalty(self, step: int) -> Tensor:
        return self.param.new_zeros(())

    def scores(self) -> Tensor:
        """Final edge scores, >= 0 and increasing with how much the method keeps an edge (so ranking by
        |score|, MIB's default, is ranking by the method's preference)."""
        s = self.param.detach()
        return s - s.min()

    def after_step(self, step: int) -> None:
        pass


class EdgePruning(MaskMethod):
    default_init = 3.0  # gates start (almost) open, as in Edge Pruning

    def __init__(self, *args):
        super().__init__(*args)
        self.lambdas = torch.zeros(2, device=self.param.device, requires_grad=True)
        self.lambda_optimizer = torch.optim.Adam([self.lambdas], lr=self.cfg.lagrangian_lr, maximize=True)

    def from_warm(self, z: Tensor) -> Tensor:
        return 2.0 * z + 1.0  # the warm start's best edges open, its worst ones nearly closed

    def masks(self, step, n):
        u = self._uniform((n, self.n_edges)).clamp(EPS, 1 - EPS)
        s = torch.sigmoid((u.log() - (1 - u).log() + self.param) / BETA)
        return (s * (RIGHT - LEFT) + LEFT).clamp(0, 1)

    def expected_fraction(self) -> Tensor:
        """Expected share of open gates: P(z > 0) per edge, averaged."""
        return torch.sigmoid(self.param - BETA * math.log(-LEFT / RIGHT)).mean()

    def target(self, step: int) -> float:
        ramp = max(1, int(self.cfg.warmup * self.cfg.steps))
        return 1.0 - min(1.0, step / ramp) * (1.0 - self.cfg.target_fraction)

    def penalty(self, step):
        gap = self.expected_fraction() - self.target(step)
        return self.lambdas[0] * gap + self.lambdas[1] * gap ** 2

    def after_step(self, step):
        self.lambda_optimizer.step()
        self.lambda_optimizer.zero_grad()

    def scores(self):
        return torch.sigmoid(self.param.detach() - BETA * math.log(-LEFT / RIGHT))  # P(gate open)


class UGS(MaskMethod):
    default_init = 1.0  # p ≈ 0.73, as MIB's runs start

    def masks(self, step, n):
        p = torch.sigmoid(self.param)
        width = (p * (1 - p)).detach().clamp_min(1e-6)
        u = self._uniform((n, self.n_edges))
        # value: the Bernoulli/uniform sample; gradient into p scaled by the window (d m / d θ = p(1 − p) inside it)
        sample = (0.5 - (u - p.detach()) / width).clamp(0, 1)
        inside = ((sample > 0) & (sample < 1)).to(p.dtype)
        # each edge's gradient is the mean over its in-window samples (MIB's normalize_empirical_mask)
        share = n / inside.sum(0).clamp_min(1)
        return sample + inside * share * (p - p.detach())

    def penalty(self, step):
        return self.cfg.ugs_lambda * torch.sigmoid(self.param).sum()

    def scores(self):
        return torch.sigmoid(self.param.detach())


def soft_threshold(scores: Tensor, k: float, width: float, iterations: int = 50) -> Tensor:
    """The threshold ``τ`` with ``Σ sigmoid((scores − τ) / width) = k`` (by bisection): a soft top-k."""
    lo, hi = scores.min() - 30 * width, scores.max() + 30 * width
    for _ in range(iterations):
        mid = (lo + hi) / 2
        too_many = torch.sigmoid((scores - mid) / width).sum() > k
        lo, hi = torch.where(too_many, mid, lo), torch.where(too_many, hi, mid)
    return (lo + hi) / 2


class Matryoshka(MaskMethod):
    def budgets(self, n: int) -> list[int]:
        """``n`` edge counts, log-uniform between ``min_fraction`` of the edges and all of them."""
        lo = math.log(max(1, self.cfg.min_fraction * self.n_edges))
        ks = torch.exp(lo + self._uniform((n,)) * (math.log(self.n_edges) - lo)).long().clamp(1, self.n_edges)
        return ks.tolist()

    def width(self, step: int) -> Tensor:
        """The relaxation's width: from ``temperature`` to ``final_temperature`` standard deviations of the scores,
        geometrically over the steps (soft masks first, so chains of edges can form; nearly hard top-k at the end)."""
        share = step / max(1, self.cfg.steps - 1)
        tau = self.cfg.temperature * (self.cfg.final_temperature / self.cfg.temperature) ** share
        return tau * self.param.detach().std().clamp_min(1e-6)

    def soft_mask(self, k: int, width: Tensor) -> Tensor:
        """The soft top-k mask ``sigmoid((s − τ_k) / width)``, which sums to ``k``."""
        s = self.param
        return torch.sigmoid((s - soft_threshold(s.detach(), k, width)) / width)

    def masks(self, step, n):
        width = self.width(step)
        return torch.stack([self.soft_mask(k, width) for k in self.budgets(n)])


class TopN(Matryoshka):
    """Hard top-n circuits at the reported sizes, with straight-through gradients from the soft top-n."""

    def budgets(self, n: int) -> list[int]:
        """``n`` of the configured sizes as edge counts (all of them when ``n`` is at least their number), drawn
        without replacement so each step trains distinct sizes."""
        ks = sorted({max(1, min(self.n_edges, int(x * self.n_edges))) for x in self.cfg.fractions})  # as the curves count
        if n >= len(ks):
            return ks
        take = torch.randperm(len(ks), generator=self.generator)[:n]
        return [ks[int(i)] for i in take]

    def masks(self, step, n):
        width = self.width(step)
        order = torch.argsort(self.param.detach(), descending=True)
        rows = []
        for k in self.budgets(n):
            soft = self.soft_mask(k, width)
            hard = torch.zeros_like(soft)
            hard[order[:k]] = 1.0  # exactly the top-k edges: the circuit the curves evaluate at this size
            rows.append(hard + (soft - soft.detach()))  # value: exactly hard; gradient: the soft top-k's
        return torch.stack(rows)


#: each learned method's sampler by name (patching.edges.catalogue.LEARNED_METHODS)
SAMPLERS = {"edge-pruning": EdgePruning, "ugs": UGS, "matryoshka": Matryoshka, "top-n": TopN}
