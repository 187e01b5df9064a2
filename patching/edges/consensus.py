"""The consensus circuit: stability selection over learned circuits (Meinshausen & Bühlmann, JRSS-B 2010).

One learned top-n circuit is faithful, but a second one learned on other prompts keeps a different 40% of its
edges, and the part two such circuits share is not faithful on its own: optimiser noise moves the edges near each
size's threshold in or out. Stability selection fits the selector on many subsamples and keeps what it selects
often. Here:

1. ``runs`` learned top-n circuits (:mod:`patching.edges.learn`), each on its own resample of the selection half
   (a half-sample without replacement by default, or a bootstrap sample, either stratified by prompt length) and
   with its own seed
   (:func:`patching.edges.learn.restart_seed`); one warm start (the search's attribution of the whole selection
   half) is shared by every run, and the runs train together, their circuits rows of each step's one forward
   (:func:`patching.edges.learn.learn_circuits`; one stream picks every run's prompt length each step);
2. at every circuit size n, each edge's **share** is the fraction of runs whose own size-n circuit (MIB's pruned
   top-n of that run's scores) keeps it;
3. the consensus circuit at size n is MIB's pruned top-n of the share, ties broken by the edge's mean standardised
   score over the runs.

The scores of the returned graph are the share at 5% of the edges (plus the tie-break, below one run's step of
1/runs), so an edge with score >= 1 is kept by every run there: CIRCUS (arXiv 2603.00523) calls those the *core*,
the others with a share above 0 *contingent*. The method is the record ``"consensus"`` of
:data:`patching.edges.catalogue.CATALOGUE`, with its settings :class:`patching.edges.catalogue.ConsensusSettings`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import mib_selector
from patching.edges.circuit_methods import ComparisonRun, MethodScores
from patching.edges.learn import LearnConfig, learn_circuits, restart_seed

#: the size at which the graph's scores hold each edge's share (MIB's 5% point, where the circuits are compared)
SHARE_FRACTION = 0.05


def resample_rows(lengths: Sequence[int], resampling: str, seed: int) -> list[int]:
    """The rows of one run, stratified by prompt length (``lengths[i]``: prompt ``i``'s token count): of each
    length's ``n`` prompts, ``max(n // 2, 1)`` drawn without replacement (``"half"``) or ``n`` with replacement
    (``"bootstrap"``), from a generator seeded ``seed``. Stratified, every run holds as many prompts of each length,
    so the runs' steps line up and share forwards (:func:`patching.edges.learn.learn_circuits`)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for length in sorted(set(lengths)):
        members = torch.tensor([i for i, n in enumerate(lengths) if n == length])
        if resampling == "half":
            picked = members[torch.randperm(len(members), generator=generator)[: max(len(members) // 2, 1)]]
        else:
            picked = members[torch.randint(len(members), (len(members),), generator=generator)]
        rows += picked.tolist()
    return sorted(rows)


def standardised(scores: Tensor, layout: GraphLayout) -> Tensor:
    """``scores`` standardised over the real edges (mean 0, sd 1), NaN elsewhere."""
    real = layout.real_edge_mask
    values = scores[real].double()
    out = torch.full(scores.shape, float("nan"), dtype=torch.float64)
    out[real] = (values - values.mean()) / values.std().clamp_min(1e-12)
    return out


@dataclass
class Consensus:
    """The learned runs' scores (``[runs, n_forward, n_backward]``) and the consensus order built from them."""

    layout: GraphLayout
    run_scores: Tensor

    @property
    def runs(self) -> int:
        """How many learned runs the consensus counts."""
        return self.run_scores.shape[0]

    def shares(self, n: int) -> Tensor:
        """Each edge's share of runs whose own pruned top-n circuit keeps it (float, 0 on the fake edges)."""
        select = mib_selector(self.layout)
        kept = torch.stack([select(scores, n) for scores in self.run_scores])
        return kept.double().mean(0)

    def tie_break(self) -> Tensor:
        """The mean standardised score of every edge, mapped into [0, 1 / (runs + 1)): below one run's share step,
        so it orders edges of equal share and never reorders different shares."""
        mean = torch.stack([standardised(s, self.layout) for s in self.run_scores]).mean(0)
        real = self.layout.real_edge_mask
        ranks = torch.zeros_like(mean)
        order = torch.argsort(mean[real], stable=True)
        ranks_real = torch.empty(len(order), dtype=torch.float64)
        ranks_real[order] = torch.arange(len(order), dtype=torch.float64)
        ranks[real] = ranks_real / max(len(order), 1) / (self.runs + 1)
        return ranks

    def ordered_scores(self, n: int) -> Tensor:
        """The consensus order at size ``n``: share plus tie-break, NaN on the fake edges (as every score graph)."""
        scores = self.shares(n) + self.tie_break()
        scores[~self.layout.real_edge_mask] = float("nan")
        return scores.float()

    def select(self, scores: Tensor, n: int) -> Tensor:
        """The consensus circuit of ``n`` edges (a selector for the curves: ``scores`` is ignored, the order is
        rebuilt from the runs at that size)."""
        return mib_selector(self.layout)(self.ordered_scores(n), n)

    def circuit(self, fraction: float) -> Graph:
        """The consensus circuit at ``fraction`` of the edges, as a graph of the consensus scores at that size."""
        n = int(fraction * self.layout.n_edges)
        scores = self.ordered_scores(n)
        return Graph(self.layout, scores, in_graph=mib_selector(self.layout)(scores, n))

    def graph(self) -> Graph:
        """The scores at :data:`SHARE_FRACTION` of the edges, as a graph."""
        n = int(SHARE_FRACTION * self.layout.n_edges)
        return Graph(self.layout, self.ordered_scores(n), meta={"consensus_runs": self.runs})

    def split(self, fraction: float = SHARE_FRACTION) -> dict:
        """CIRCUS's split at ``fraction`` of the edges: the core (every run keeps the edge), the contingent edges
        (some runs) and how many edges the union of the runs holds."""
        share = self.shares(int(fraction * self.layout.n_edges))
        return {"fraction": fraction, "n_core": int((share >= 1).sum()),
                "n_contingent": int(((share > 0) & (share < 1)).sum()), "n_union": int((share > 0).sum())}


def learn_consensus(model, prompts, *, runs: int, resampling: str, config: LearnConfig, init=None,
                    on_step: Optional[Callable[[int], None]] = None, metric="logit") -> Consensus:
    """``runs`` learned top-n circuits on resamples of ``prompts`` (a Dataset of prompts with their twins and
    answers; module docstring, step 1), trained by :func:`patching.edges.learn.learn_circuits` from the warm start
    ``init``, and the consensus built from them. ``config``: every run's settings (``method`` is set to top-n, and
    one stream of prompt lengths to ``config.seed``, so that the runs' steps line up); run ``k`` has seed
    ``restart_seed(config.seed, k)`` and resample seed the same; ``metric``: what the runs' ``"metric"`` objective
    scores (:func:`patching.edges.learn.learn_circuit`)."""
    if runs < 1:
        raise InputError(f"The consensus circuit counts at least 1 run, got runs={runs!r}.")
    config = dataclasses.replace(config, method="top-n", length_seed=config.seed, restarts=1)
    seeds = [restart_seed(config.seed, k) for k in range(runs)]
    lengths = [len(tokens) for tokens in prompts["tokens"]]
    prompt_sets = [prompts.select(resample_rows(lengths, resampling, seed)) for seed in seeds]
    learned = learn_circuits(model, prompt_sets, seeds=seeds, config=config, init=init, on_step=on_step,
                             metric=metric)
    return Consensus(GraphLayout.of(model), torch.stack([circuit.graph.scores for circuit in learned]))


def learn_runs(run: ComparisonRun, runs: int, resampling: str, steps: int, init) -> tuple[Consensus, float]:
    """:func:`learn_consensus` on ``run``'s selection half with its learned methods' settings (``steps``: each
    run's, 0 for theirs), with a progress bar; the consensus and the wall seconds its runs took."""
    config = dataclasses.replace(run.learn, steps=steps or run.learn.steps, progress=False)
    started = time.perf_counter()
    bar = tqdm(total=runs * config.steps, desc=f"consensus: {runs} learned runs", unit="step", leave=False)
    consensus = learn_consensus(run.model, run.selection, runs=runs, resampling=resampling, config=config, init=init,
                                on_step=lambda _: bar.update(), metric=run.search.sweep.metric)
    bar.close()
    return consensus, round(time.perf_counter() - started, 1)


def consensus_scores(run: ComparisonRun, name: str) -> MethodScores:
    """The ``"consensus"`` record's scoring: the learned runs, their consensus graph and selector, CIRCUS's split."""
    own = run.settings_of(name)
    init = run.cached_attribution(run.warm_start) if run.warm_start else None  # computed before the clock started
    consensus, seconds = learn_runs(run, own.runs, own.resampling, own.steps, init)
    info = {"consensus": {"runs": own.runs, "resampling": own.resampling,
                          "steps": own.steps or run.learn.steps, "seconds": seconds, **consensus.split()}}
    return MethodScores(consensus.graph(), select=consensus.select, info=info, warm_scores=init)
