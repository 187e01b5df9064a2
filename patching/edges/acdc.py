"""ACDC (Conmy et al., NeurIPS 2023): prune the edge graph greedily, from the output backwards, by exact runs.

Starting from the full graph, every receiver is visited in reverse topological order (the logits
first, then each layer's MLP input and its heads' q/k/v inputs, from the last layer down). For each
of the receiver's incoming edges still in the circuit (its senders taken latest first), the edge is
removed, the circuit is run (:func:`patching.edges.evaluate_circuit`: edges outside it ablated as the
evaluation's ``ablation`` says), and the removal is kept when the *damage* it does is below the
threshold τ::

    damage = KL(full ‖ circuit without e) − KL(full ‖ circuit)      (objective "kl": END distributions)
    damage = m(circuit) − m(circuit without e)                      (objective "metric": the task metric drops)

Edges once removed stay removed, so each test is against the circuit as pruned so far. Every tested
edge's score is its damage (an edge ACDC keeps scores at least τ), so ranking by score orders the
edges by how much their removal hurt when it was tested; :class:`ACDCResult` also holds the circuit
ACDC kept at τ.

**Batched and exact.** Testing edge by edge costs one run per edge. The tests of one receiver differ
only in which of its incoming edges are gone, so several run in one batched forward (the prompts'
shared prefix and their ablated outputs computed once for the whole search,
:func:`patching.edges.evaluate.prepare_group`). They are *speculative*: the batch holds the circuits
with the receiver's next edges removed cumulatively (the first one, the first two, ...), which are
exactly the circuits edge-by-edge ACDC tests as long as each removal is kept. At the first edge that is
kept, the rest of the batch assumed it gone, so those results are dropped and the next batch starts
after it from the circuit as it stands. The result is therefore the edge-by-edge one (the same circuits
are evaluated in the same order), with one batched run per edge kept rather than one run per edge tested;
ACDC removes most edges, so the batches are long. ``batch_edges=False`` runs one circuit per forward.

**Batches as long as the runs.** A batch longer than the run of removals it meets wastes its tail; a shorter
one costs a forward more. Where the objective keeps many edges (the task metric, whose damages are not
bounded below by 0 as the KL's are), fixed batches of 64 ran 16.6 circuits per decision. So each batch is
sized to the run expected from the decisions so far: with p̂ the recent share of removals (an exponential
average over decisions, weight 0.1, starting at 0.5), the number of tests up to and including the next kept
edge is 1 / (1 − p̂) on average, and that, rounded up and capped at ``max_batch``, is the next batch's length
(``adaptive_batch=False``: always ``max_batch``). Only the batching changes, not which circuits are
evaluated or in what order.

**From the receiver's layer.** While a receiver of layer L is tested, no receiver below L has lost an
edge, so every block below L computes what the reference run computes: the forwards start at block L from
the reference run's residual, with the senders below L at their reference outputs (recorded once per
prompt group), as auto-circuit's ACDC does. Also exact; ``from_receiver_layer=False`` runs every block
(and ``norm="recompute"`` on post-norm models always does: its receivers re-normalise mixtures of heads).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.end_logits import unembed_end
from circuits.graph import Graph, GraphLayout
from patching.edges.catalogue import ACDC_OBJECTIVES as OBJECTIVES
from patching.edges.catalogue import check_acdc_threshold
from patching.sweeps import inputs
from patching.edges.evaluate import ABLATIONS, group_pool_means, circuit_end_residuals, prepare_group
from patching.edges.engine import edge_mode
from patching.edges.mixing import check_norm
from patching.sweeps.metrics import get_metric, score_end
from patching.sweeps.options import SweepOptions, sweep_options

#: what ACDC's damage measures (module docstring)


@dataclass(frozen=True)
class ACDCConfig:
    """ACDC's settings: the threshold τ, what a removal's damage is measured by, how edges are ablated."""

    threshold: float = 0.01  # τ: a removal is kept when its damage is below it
    objective: str = "kl"  # one of OBJECTIVES
    ablation: str = "counterfactual"  # one of patching.edges.evaluate.ABLATIONS
    norm: str = "frozen"  # patching.edges.mixing.NORMS
    #: run the speculative tests of a receiver's edges several per forward (False: one circuit per forward; the
    #: result is the same)
    batch_edges: bool = True
    #: at most this many circuits speculated per batch (they are chunked further to the memory budget)
    max_batch: int = 64
    #: size each batch to the run of removals expected from the recent decisions (module docstring), at most
    #: max_batch (False: always max_batch)
    adaptive_batch: bool = True
    #: visit only this many receivers, from the output back (None: all); the others keep every incoming edge
    max_receivers: Optional[int] = None
    #: start each test's forwards at its receiver's layer (the same result; False: from the first layer)
    from_receiver_layer: bool = True

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise InputError(f"Unknown ACDC objective {self.objective!r}: use one of {OBJECTIVES} ('kl': the END "
                             "distribution's KL from the full model; 'metric': the task metric's drop).")
        if self.ablation not in ABLATIONS:
            raise InputError(f"Unknown ablation {self.ablation!r} for ACDC: use one of {ABLATIONS}.")
        check_norm(self.norm)
        check_acdc_threshold(self.threshold)
        if not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise InputError(f"max_batch must be a positive integer, got {self.max_batch!r}.")
        if not isinstance(self.adaptive_batch, bool):
            raise InputError(f"adaptive_batch must be True or False, got {self.adaptive_batch!r}.")
        if self.max_receivers is not None and (not isinstance(self.max_receivers, int) or self.max_receivers < 1):
            raise InputError(f"max_receivers must be a positive integer or None (every receiver), "
                             f"got {self.max_receivers!r}.")


@dataclass
class ACDCResult:
    """What :func:`acdc` found: every edge's damage (``graph.scores``) and the circuit it kept (``graph.in_graph``)."""

    graph: Graph
    config: ACDCConfig
    n_tested: int  # edge removals tested
    n_circuits_run: int  # circuits evaluated, speculative ones included
    n_batches: int  # batched forwards over every prompt group
    seconds: float
    objective_full: float  # the objective of the full graph (0 for "kl")
    objective_kept: float  # and of the circuit kept
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        c = self.config
        return {"threshold": c.threshold, "objective": c.objective, "ablation": c.ablation,
                "max_receivers": c.max_receivers, "max_batch": c.max_batch, "adaptive_batch": c.adaptive_batch,
                "n_edges_kept": int(self.graph.in_graph.sum()), "n_edges": self.graph.layout.n_edges,
                "n_tested": self.n_tested, "n_circuits_run": self.n_circuits_run, "n_batches": self.n_batches,
                "seconds": round(self.seconds, 2), "objective_full": self.objective_full,
                "objective_kept": self.objective_kept, **self.info}


class _Objective:
    """The objective of circuits on every prepared prompt group: the mean over prompts, one value per circuit."""

    def __init__(self, model, layout, prepared: list, config: ACDCConfig, metric, memory_mb: float):
        self.model, self.layout, self.prepared, self.config = model, layout, prepared, config
        self.metric, self.memory_mb = metric, memory_mb
        self.n_prompts = sum(len(p.group.tokens) for p in prepared)
        self.full_probs, self.full_neg_entropy = [], []
        if config.objective == "kl":  # the full graph's END distribution of every prompt (the model's, when frozen)
            full = layout.real_edge_mask[None]
            for p in prepared:
                logprobs = torch.cat([self._logprobs(r) for _, r in self._residuals(full, p)])
                self.full_probs.append(logprobs.exp())
                self.full_neg_entropy.append((self.full_probs[-1] * logprobs).sum(-1))
        self.n_batches = 0

    def _residuals(self, masks, prepared, from_layer: int = 0):
        return circuit_end_residuals(self.model, self.layout, masks, prepared, self.memory_mb, from_layer)

    def _logprobs(self, resid_end: Tensor) -> Tensor:
        return torch.log_softmax(unembed_end(self.model, resid_end).double(), dim=-1)

    def _kl(self, g: int, resid_end: Tensor) -> Tensor:
        """KL(full ‖ circuit) of every row of ``resid_end`` [C, B, d_model], as ``Σ p log p − Σ p z + logsumexp z``
        (p the full graph's END distribution, z the circuit's logits): a few circuits' vocabularies at a time, so
        that a batch of speculative circuits never holds all of its [C·B, d_vocab] logits (in float64) at once."""
        C, B = resid_end.shape[:2]
        probs, neg_entropy = self.full_probs[g], self.full_neg_entropy[g]
        row_bytes = probs.shape[-1] * probs.element_size() * 3  # the logits, their exponentials and one product
        per_chunk = max(1, int(self.memory_mb * 2 ** 20 // (row_bytes * B)))
        values = []
        for start in range(0, C, per_chunk):
            chunk = resid_end[start:start + per_chunk]
            logits = unembed_end(self.model, chunk.reshape(-1, chunk.shape[-1])).double().view(len(chunk), B, -1)
            expected = torch.einsum("cbv,bv->cb", logits, probs)
            values.append(neg_entropy[None] - expected + torch.logsumexp(logits, dim=-1))
        return torch.cat(values).view(-1)

    def __call__(self, masks: Tensor, from_layer: int = 0) -> Tensor:
        """The objective of each circuit of ``masks``, the forwards started at ``from_layer``
        (:func:`patching.edges.evaluate.circuit_end_residuals`)."""
        total = torch.zeros(len(masks), dtype=torch.float64)
        for g, prepared in enumerate(self.prepared):
            group, B = prepared.group, len(prepared.group.tokens)
            done = 0
            for C, resid_end in self._residuals(masks, prepared, from_layer):
                if self.config.objective == "kl":
                    values = self._kl(g, resid_end.view(C, B, -1))
                else:
                    alts = None if group.alt_ids is None else group.alt_ids.repeat(C)
                    values = score_end(self.model, resid_end, group.answer_ids.repeat(C), alts, self.metric).double()
                total[done:done + C] += values.view(C, B).sum(1).cpu()
                done += C
                self.n_batches += 1
        return total / self.n_prompts

    def damage(self, before: float, after: float) -> float:
        """How much worse ``after`` is than ``before`` (KL grows; the task metric drops)."""
        return after - before if self.config.objective == "kl" else before - after


@torch.no_grad()
def acdc(model: HookedTransformer, reference, counterfactual=None, *, config: ACDCConfig = ACDCConfig(),
         means_from=None, answer_ids=None, alt_ids=None, options: Optional[SweepOptions] = None) -> ACDCResult:
    """ACDC's circuit at ``config.threshold`` and every tested edge's damage (module docstring).

    ``reference`` / ``counterfactual`` / ``answer_ids`` / ``alt_ids``: prompts as in :func:`patching.path_patch`;
    ``means_from``: the pool of a mean ablation (:func:`patching.edges.evaluate_circuits`); ``options``: the task
    metric (objective ``"metric"``), batching, memory budget and progress (:class:`patching.SweepOptions`).
    """
    started = time.perf_counter()
    opts = sweep_options(options, "acdc")
    metric = get_metric(opts.metric)
    layout = GraphLayout.of(model)
    groups = inputs.prompt_groups(model, reference, counterfactual, answer_ids=answer_ids, alt_ids=alt_ids,
                                 batch_size=opts.batch_size)
    mask = layout.real_edge_mask.clone()
    scores = torch.full((layout.n_forward, layout.n_backward), torch.nan)
    n_tested = n_run = 0
    with edge_mode(model):
        recompute = config.norm == "recompute" and bool(model.cfg.use_normalization_before_and_after)
        means = group_pool_means(model, config.ablation, means_from, groups, opts.batch_size, recompute)
        prepared = [prepare_group(model, layout, g, config.ablation, means, opts.reuse_prefix, config.norm)
                    for g in groups]
        objective = _Objective(model, layout, prepared, config, metric, opts.budget())
        full_value = current = float(objective(mask[None])[0])
        visited = list(reversed(range(layout.n_backward)))[:config.max_receivers]
        bar = tqdm(total=int(layout.real_edge_mask[:, visited].sum()), desc="ACDC",
                   disable=not opts.shows_progress(default=False), leave=False)
        # below the receiver's layer nothing is ablated yet: the forwards can start there (not when each receiver
        # re-normalises a mixture of heads, which the preset senders do not record)
        skip_layers = config.from_receiver_layer and not recompute
        removal_rate = 0.5  # p̂: recent share of tested edges removed (module docstring)
        for receiver in visited:
            from_layer = min(receiver // (3 * layout.n_heads + 1), layout.n_layers - 1) if skip_layers else 0
            senders = [int(s) for s in reversed(mask[:, receiver].nonzero()[:, 0])]
            i = 0
            while i < len(senders):
                longest = config.max_batch if config.batch_edges else 1
                if config.adaptive_batch:
                    longest = min(longest, math.ceil(1 / max(1 - removal_rate, 1 / config.max_batch)))
                size = min(longest, len(senders) - i)
                candidates = mask[None].repeat(size, 1, 1)
                for j in range(size):  # candidate j: the next j + 1 edges removed
                    candidates[j:, senders[i + j], receiver] = False
                values = objective(candidates, from_layer)
                n_run += size
                for j in range(size):
                    sender = senders[i + j]
                    damage = objective.damage(current, float(values[j]))
                    scores[sender, receiver] = damage
                    n_tested += 1
                    bar.update(1)
                    kept = damage >= config.threshold
                    removal_rate = 0.9 * removal_rate + 0.1 * (not kept)
                    if kept:  # the later candidates of the batch assumed it gone
                        break
                    mask[sender, receiver] = False
                    current = float(values[j])
                i += j + 1
        bar.close()
    graph = Graph(layout, scores, in_graph=mask,
                  meta={"method": "ACDC", "threshold": config.threshold, "objective": config.objective,
                        "metric": metric.name, "ablation": config.ablation, "n_prompts": objective.n_prompts,
                        "d_model": model.cfg.d_model})
    return ACDCResult(graph, config, n_tested, n_run, objective.n_batches, time.perf_counter() - started,
                      full_value, current)
