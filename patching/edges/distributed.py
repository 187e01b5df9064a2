"""Edge sweeps split over several processes (``accelerate launch``, ``torchrun``, or any torch.distributed group).

Each sweep of the edge graph is a sum of independent pieces, so it splits without
approximation; every process computes its share with the ordinary single-process
function and the shares are combined, the same on every rank:

* :func:`distributed_edge_attribution`: the prompts are split. A score is a mean over prompts, so
  the combined score is ``Σ_r n_r · score_r / Σ_r n_r`` (each shard weighted by its
  prompt count; the reference metric likewise).
* :func:`distributed_edge_patch`: the edges are split (every ``world``-th edge to a rank, so each
  rank gets receivers of every layer and the same work); each rank runs all prompts on
  its edges, and the per-prompt effects are gathered back into the order given.
* :func:`distributed_evaluate_circuits` and :func:`distributed_faithfulness_curve`: the circuits (the curve's
  points plus the full and empty circuits) are split; the per-prompt metrics are
  gathered and the curve, CPR, CMD and their bootstrap intervals are computed from the
  whole table on every rank, so they equal the single-process ones.

Inside a launched run (``WORLD_SIZE > 1`` in the environment) the process group is set up
through ``accelerate.PartialState`` on first use; an already initialised group is used as
it is; with one process every function is the plain call. Pass ``shard=Shard(0, 1)`` to
run unsplit inside a group. The model must sit on each rank's own device (``PartialState().device``).

Usage (four processes on one machine, each on its own GPU)::

    accelerate launch --num_processes 4 -m experiments.edge_sweeps --device cuda

Only results travel between processes (tensors of ``n_forward x n_backward`` or
``edges x prompts``), through ``all_reduce`` / ``all_gather``; gloo (CPU) and NCCL (GPU)
both work.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence, Union

import torch
from datasets import Dataset
from torch import Tensor
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.process_group import rank_and_world_size
from circuits.tasks import TaskBatch
from patching.edges import curves, evaluate
from patching.edges.evaluate import CircuitEvaluation
from patching.edges.attribute import edge_attribution, node_scores_of_edges
from patching.edges.patch import EdgeEffects, EdgesInput, edge_patch, resolve_edges
from patching.sweeps.options import sweep_options
from patching.sweeps.results import NodeScores

__all__ = ["Shard", "current_shard", "distributed_edge_attribution", "distributed_edge_patch",
           "distributed_evaluate_circuits", "distributed_faithfulness_curve", "shard_prompts"]


@dataclass(frozen=True)
class Shard:
    """This process's place among ``world_size`` processes (rank 0 .. world_size − 1)."""

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise InputError(f"A shard needs 0 <= rank < world_size, got rank {self.rank} of {self.world_size}.")

    def block(self, n: int) -> range:
        """This rank's contiguous block of ``n`` items (block sizes differ by at most one)."""
        return range(self.rank * n // self.world_size, (self.rank + 1) * n // self.world_size)

    def strided(self, n: int) -> range:
        """Every ``world_size``-th of ``n`` items, starting at ``rank``."""
        return range(self.rank, n, self.world_size)


def current_shard() -> Shard:
    """The running process's shard: from torch.distributed, set up through accelerate when launched.

    :func:`circuits.process_group.rank_and_world_size` sets the group up (the same way the trainer does).
    """
    return Shard(*rank_and_world_size())


def _resolve(shard: Optional[Shard]) -> Shard:
    shard = current_shard() if shard is None else shard
    if shard.world_size > 1:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() != shard.world_size:
            raise InputError(f"shard={shard} needs an initialised torch.distributed group of {shard.world_size} "
                             f"processes: start the run with accelerate launch or torchrun.")
    return shard


# ---------------------------------------------------------------------------- collectives


def _wire_device() -> torch.device:
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _all_reduce_sum(t: Tensor) -> Tensor:
    import torch.distributed as dist

    wire = t.to(_wire_device()).contiguous()
    dist.all_reduce(wire, op=dist.ReduceOp.SUM)
    return wire.to(t.device)


def _all_gather_rows(t: Tensor) -> list[Tensor]:
    """Every rank's ``t`` (equal trailing shape, any number of rows), in rank order, on ``t``'s device."""
    import torch.distributed as dist

    device = _wire_device()
    world = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([t.shape[0]], device=device))
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, *t.shape[1:], dtype=t.dtype, device=device)
    padded[: t.shape[0]] = t.to(device)
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return [p[: int(s.item())].to(t.device) for p, s in zip(parts, sizes)]


def _unstride(parts: Sequence[Tensor], n: int) -> Tensor:
    """Undo :meth:`Shard.strided`: rank r's rows are items r, r + world, ...; back into item order."""
    world = len(parts)
    out = torch.empty(n, *parts[0].shape[1:], dtype=parts[0].dtype)
    for rank, part in enumerate(parts):
        out[rank::world] = part.cpu()
    return out


# ---------------------------------------------------------------------------- prompts


def _n_prompts(reference) -> int:
    if isinstance(reference, (Dataset, TaskBatch)):
        return len(reference)
    if isinstance(reference, Tensor):
        return reference.shape[0]
    raise TypeError(f"reference must be a Dataset, a TaskBatch or a token tensor, got {type(reference).__name__}.")


def _take_ids(ids, rows: Tensor, n: int):
    if ids is None or isinstance(ids, int):
        return ids
    ids = torch.as_tensor(ids)
    return ids[rows] if ids.ndim == 1 and ids.shape[0] == n else ids  # a wrong shape is left for prompt_groups to report


def shard_prompts(shard: Shard, reference, counterfactual=None, answer_ids=None, alt_ids=None) -> tuple:
    """This rank's contiguous block of the prompts, in any form :func:`patching.path_patch` accepts.

    Returns ``(reference, counterfactual, answer_ids, alt_ids)`` for the block; per-prompt ids are
    cut with their prompts, a single int id is kept.
    """
    n = _n_prompts(reference)
    rows = torch.tensor(list(shard.block(n)), dtype=torch.long)
    if isinstance(reference, Dataset):
        part = reference.select(rows.tolist())
    elif isinstance(reference, TaskBatch):
        part = TaskBatch(reference.tokens[rows], reference.cf_tokens[rows], reference.answer_ids[rows],
                         {k: v[rows] for k, v in reference.role_masks.items()},
                         [reference.indices[i] for i in rows.tolist()],
                         [reference.prompts[i] for i in rows.tolist()] if reference.prompts else [])
    else:
        part = reference[rows.to(reference.device)]
        counterfactual = counterfactual[rows.to(counterfactual.device)] if isinstance(counterfactual, Tensor) else counterfactual
    return part, counterfactual, _take_ids(answer_ids, rows, n), _take_ids(alt_ids, rows, n)


# ---------------------------------------------------------------------------- the sweeps


def _on_rank(kwargs: dict, shard: Shard, where: str) -> dict:
    """A wrapped sweep's keywords with its :class:`patching.SweepOptions` as one record; a bar on rank 0 only
    unless the caller chose."""
    options = sweep_options(kwargs.get("options"), where)
    if options.progress is None:
        options = replace(options, progress=shard.rank == 0)
    return {**kwargs, "options": options}


def distributed_edge_attribution(model: HookedTransformer, reference, counterfactual: Optional[Tensor] = None, *,
                                 level: str = "edge", answer_ids=None, alt_ids=None, shard: Optional[Shard] = None,
                                 **kwargs) -> Union[Graph, NodeScores]:
    """:func:`patching.edges.attribute` with the prompts split over the processes (module docstring).

    Keywords are those of :func:`patching.edges.edge_attribution`; the progress bar shows on rank 0 only.
    """
    if level not in ("edge", "node"):
        raise InputError(f"level must be 'edge' or 'node', got {level!r}.")
    shard = _resolve(shard)
    kwargs = _on_rank(kwargs, shard, "distributed_edge_attribution")
    if shard.world_size == 1 or _n_prompts(reference) < shard.world_size:  # too few prompts to split: all run all
        return edge_attribution(model, reference, counterfactual, level=level, answer_ids=answer_ids,
                                alt_ids=alt_ids, **kwargs)
    part = shard_prompts(shard, reference, counterfactual, answer_ids, alt_ids)
    local = edge_attribution(model, part[0], part[1], answer_ids=part[2], alt_ids=part[3], level="edge", **kwargs)
    n = local.meta["n_prompts"]
    sums = torch.cat([torch.nan_to_num(local.scores.double()).flatten() * n,
                      torch.tensor([local.meta["reference_metric"] * n, n], dtype=torch.float64)])
    sums = _all_reduce_sum(sums)
    layout = local.layout
    n_total = float(sums[-1])
    scores = (sums[:-2].view(layout.n_forward, layout.n_backward) / n_total).float()
    scores = torch.where(layout.real_edge_mask, scores, torch.nan)
    meta = dict(local.meta, n_prompts=int(n_total), reference_metric=float(sums[-2]) / n_total,
                n_processes=shard.world_size)
    if level == "node":
        return node_scores_of_edges(layout, scores, meta)
    return Graph(layout, scores, meta=meta)


def distributed_edge_patch(model: HookedTransformer, edges: EdgesInput, reference,
                           counterfactual: Optional[Tensor] = None, *, shard: Optional[Shard] = None,
                           **kwargs) -> EdgeEffects:
    """:func:`patching.edges.edge_patch` with the edges split over the processes (module docstring); edges in the order given.

    Keywords are those of :func:`patching.edges.edge_patch`; the progress bar shows on rank 0 only.
    """
    shard = _resolve(shard)
    kwargs = _on_rank(kwargs, shard, "distributed_edge_patch")
    pairs = resolve_edges(GraphLayout.of(model), edges)
    if shard.world_size == 1 or len(pairs) < shard.world_size:
        return edge_patch(model, pairs, reference, counterfactual, **kwargs)
    mine = [pairs[i] for i in shard.strided(len(pairs))]
    local = edge_patch(model, mine, reference, counterfactual, **kwargs)
    per_prompt = _unstride(_all_gather_rows(local.per_prompt), len(pairs))
    return replace(local, edges=pairs, per_prompt=per_prompt)


def distributed_evaluate_circuits(model: HookedTransformer, circuits: Sequence, reference,
                                  counterfactual: Optional[Tensor] = None, *, shard: Optional[Shard] = None,
                                  **kwargs) -> list[CircuitEvaluation]:
    """:func:`patching.edges.evaluate_circuits` with the circuits split over the processes; one result per circuit, in order."""
    shard = _resolve(shard)
    if shard.world_size == 1 or len(circuits) < shard.world_size:
        return evaluate.evaluate_circuits(model, circuits, reference, counterfactual, **kwargs)
    indices = list(shard.strided(len(circuits)))
    local = evaluate.evaluate_circuits(model, [circuits[i] for i in indices], reference, counterfactual, **kwargs)
    rows = torch.stack([e.per_prompt for e in local])  # [my circuits, prompts]
    table = _unstride(_all_gather_rows(rows), len(circuits))
    layout = GraphLayout.of(model)
    first = local[0]
    return [CircuitEvaluation(table[i], first.metric, first.ablation,
                              int(evaluate.circuit_mask(layout, c).sum()), first.n_total_edges)
            for i, c in enumerate(circuits)]


def distributed_faithfulness_curve(model: HookedTransformer, scores, reference, counterfactual: Optional[Tensor] = None,
                                   *, shard: Optional[Shard] = None, **kwargs) -> curves.FaithfulnessCurve:
    """:func:`patching.edges.faithfulness_curve` with its circuits (points, full, empty) split over the processes.

    The per-prompt table is gathered before the bootstrap, so every rank returns the single-process curve.
    """
    shard = _resolve(shard)
    kwargs = _on_rank(kwargs, shard, "distributed_faithfulness_curve")

    def evaluate_sharded(*args, **kw):
        return distributed_evaluate_circuits(*args, shard=shard, **kw)

    return curves.faithfulness_curve(model, scores, reference, counterfactual, evaluate=evaluate_sharded, **kwargs)
