"""Circuit evaluation: run the model with every edge outside a circuit ablated.

A circuit ``C`` is a set of edges of the model's graph (:mod:`circuits.graph`). Running
``C`` on the reference prompts means: every receiver ``r`` reads

    in_r(C) = Σ_{s: (s, r) ∈ C} o_s(current run) + Σ_{s: (s, r) ∉ C} ã_s + constant biases,

where ``o_s`` is sender ``s``'s output under :mod:`patching.edges.engine`' convention and
``ã_s`` its *ablated* output. As hannamw/EAP-IG's ``evaluate_graph`` does, this is done
by a hook at each receiver that adds ``Σ_{s ∉ C} (ã_s − o_s(current))`` to the input the
model computed; senders' current outputs are recorded as the forward produces them, so
an in-circuit edge carries what its sender outputs *in this run* (changed, if the
sender's own inputs were ablated upstream).

Ablations (``ablation=``):

* ``"counterfactual"``: ``ã_s`` = the sender's output on the prompt's counterfactual twin.
  The empty circuit is then exactly the counterfactual run, the full graph the reference run.
* ``"mean"``: the sender's output averaged over the prompts and positions of a separate
  pool (``means_from``); ``"positional-mean"``: averaged over the pool's prompts per
  position (the pool needs prompts of the evaluated lengths).
* ``"zero"``: ``ã_s = 0``.

Mean ablations must not take their means from the evaluated prompts themselves (the
circuit would be scored partly on its own answers): a pool sharing a prompt with the
evaluated set is refused.

Speed: several circuits run in one forward (stacked along the batch, chunked to a
memory budget); logits are computed at END only, for the vocabulary columns the metric
reads; with counterfactual ablation the positions before the first one where reference
and counterfactual differ hold identical senders in both runs, so ablating them changes
nothing: only the later positions are run, reading the prefix's keys/values from a cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence, Union

import torch
from datasets import Dataset
from jaxtyping import Bool, Float
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.graph import QKV, Graph, GraphLayout
from circuits.graph_io import check_graph_fits
from circuits.prefix_cache import TiledKVCache
from circuits.tasks import TaskBatch, iter_batches
from patching.edges.catalogue import ABLATIONS  # declared with the methods: the command line reads them there
from patching.sweeps import forward, inputs
from patching.edges.engine import SenderRecorder, edge_mode, edge_prefix_kv, run_suffix
from patching.edges.mixing import Ablated, MixingHooks, check_norm, record_ablated, record_outputs
from patching.edges.positions import check_schema, span_ids
from patching.sweeps.metrics import PatchMetric, get_metric, score_end
from patching.sweeps.options import SweepOptions, sweep_options

CircuitInput = Union[Graph, Bool[Tensor, "n_forward n_backward"]]


class MeanPoolError(InputError):
    """The prompts for a mean ablation are missing, overlap the evaluated prompts, or lack their lengths."""


@dataclass
class CircuitEvaluation:
    """The metric of one circuit run, per evaluated prompt (in the order the prompts were grouped)."""

    per_prompt: Float[Tensor, "prompt"]
    metric: str
    ablation: str
    n_edges: int
    n_total_edges: int
    info: dict = field(default_factory=dict)

    @property
    def mean(self) -> float:
        return float(self.per_prompt.double().mean())

    @property
    def n_prompts(self) -> int:
        return int(self.per_prompt.numel())

    def to_dict(self) -> dict:
        return {"metric": self.metric, "ablation": self.ablation, "mean": self.mean, "n_prompts": self.n_prompts,
                "n_edges": self.n_edges, "n_total_edges": self.n_total_edges,
                "per_prompt": self.per_prompt.tolist(), **self.info}


def circuit_mask(layout: GraphLayout, circuit: CircuitInput, n_spans: Optional[int] = None) -> Tensor:
    """The circuit's edges as a boolean ``[n_forward, n_backward]`` mask (only real edges kept); with ``n_spans``,
    a position-aware ``[n_forward, n_backward, n_spans]`` mask."""
    if n_spans is not None:
        shape = (layout.n_forward, layout.n_backward, n_spans)
        if not isinstance(circuit, Tensor) or tuple(circuit.shape) != shape:
            got = tuple(circuit.shape) if isinstance(circuit, Tensor) else type(circuit).__name__
            raise InputError(f"A position-aware circuit is a bool tensor {shape} (n_forward, n_backward, n_spans), "
                             f"got {got}.")
        return circuit.detach().cpu().bool() & layout.real_edge_mask[:, :, None]
    if isinstance(circuit, Graph):
        if circuit.layout != layout:
            raise InputError(f"The graph is for {circuit.layout}, the model's is {layout}: build it with Graph.from_model(model).")
        mask = circuit.in_graph
    elif isinstance(circuit, Tensor):
        mask = circuit
    else:
        raise InputError(f"A circuit is a circuits.graph.Graph or a bool tensor [n_forward, n_backward], got {type(circuit).__name__}.")
    shape = (layout.n_forward, layout.n_backward)
    if tuple(mask.shape) != shape:
        raise InputError(f"The circuit mask has shape {tuple(mask.shape)}; this model's graph needs {shape} (n_forward, n_backward).")
    return mask.detach().cpu().bool() & layout.real_edge_mask


@torch.no_grad()
def evaluate_circuit(
    model: HookedTransformer,
    circuit: CircuitInput,
    reference,
    counterfactual: Optional[Tensor] = None,
    **kwargs,
) -> CircuitEvaluation:
    """The metric with every edge outside ``circuit`` ablated (see the module docstring).

    Args and keywords are those of :func:`evaluate_circuits`, for one circuit.
    """
    return evaluate_circuits(model, [circuit], reference, counterfactual, **kwargs)[0]


@torch.no_grad()
def evaluate_circuits(
    model: HookedTransformer,
    circuits: Sequence[CircuitInput],
    reference,
    counterfactual: Optional[Tensor] = None,
    *,
    ablation: str = "counterfactual",
    means_from=None,
    norm: str = "frozen",
    spans=None,
    answer_ids=None,
    alt_ids=None,
    options: Optional[SweepOptions] = None,
) -> list[CircuitEvaluation]:
    """Evaluate several circuits on the same prompts, several per batched forward.

    Args:
        model: a HookedTransformer the edge graph can represent (:func:`patching.edges.engine.check_edge_model`).
        circuits: each a :class:`circuits.graph.Graph` (its ``in_graph``) or a bool mask ``[n_forward, n_backward]``.
        reference, counterfactual, answer_ids, alt_ids: prompts, as in :func:`patching.path_patch`.
        ablation: one of :data:`ABLATIONS`.
        means_from: the pool for ``"mean"`` / ``"positional-mean"``: a ``Dataset`` from
            :func:`circuits.tasks.make_dataset`, a ``TaskBatch`` or token ids ``[n, pos]``; none of its
            prompts may be an evaluated one.
        norm: ``"frozen"`` (each head at its own run's scale) or ``"recompute"`` (each receiver re-normalises
            the mixture of kept and ablated heads, as hannamw/EAP-IG's ``evaluate_graph``; see
            :mod:`patching.edges.mixing`); the same on models without norms after attention.
        spans: a span schema of :mod:`patching.edges.positions`: the circuits are position-aware masks
            ``[n_forward, n_backward, n_spans]`` (needs a Dataset or TaskBatch).
        options: :class:`patching.SweepOptions`, None for its defaults (``reuse_prefix``
            applies to counterfactual ablation; no progress bar unless asked).
    Returns:
        One :class:`CircuitEvaluation` per circuit, in order.
    """
    opts = sweep_options(options, "evaluate_circuits")
    metric, batch_size = opts.metric, opts.batch_size
    if ablation not in ABLATIONS:
        raise InputError(f"Unknown ablation {ablation!r}: use one of {ABLATIONS}.")
    check_norm(norm)
    metric = get_metric(metric)
    layout = GraphLayout.of(model)
    if len(circuits) == 0:
        raise InputError("No circuits to evaluate: pass at least one Graph or mask.")
    schema = check_schema(spans)
    for i, circuit in enumerate(circuits):  # a graph of another model size (its meta's d_model) is refused too
        if isinstance(circuit, Graph):
            check_graph_fits(circuit, model, f"circuit {i}")
    masks = torch.stack([circuit_mask(layout, c, None if schema is None else len(schema)) for c in circuits])
    groups = inputs.prompt_groups(model, reference, counterfactual, answer_ids=answer_ids, alt_ids=alt_ids,
                                 batch_size=batch_size,
                                 span_of=None if schema is None else (lambda masks: span_ids(masks, schema)))
    with edge_mode(model):
        recompute = norm == "recompute" and bool(model.cfg.use_normalization_before_and_after)
        means = group_pool_means(model, ablation, means_from, groups, batch_size, recompute)
        per_group = []
        bar = tqdm(total=len(groups) * len(circuits), desc=f"evaluating circuits ({ablation})",
                   disable=not opts.shows_progress(default=False), leave=False)
        for group in groups:
            per_group.append(_evaluate_group(model, layout, masks, group, ablation, means, metric, opts.budget(),
                                             opts.reuse_prefix, bar, norm))
        bar.close()
    values = torch.cat(per_group, dim=1).double().cpu()  # [n_circuits, n_prompts]
    n_total = layout.n_edges * (1 if schema is None else len(schema))
    return [CircuitEvaluation(values[i], metric.name, ablation, int(masks[i].sum()), n_total, {"norm": norm})
            for i in range(len(circuits))]


# ---------------------------------------------------------------------------- ablated outputs


def _pool_groups(model, pool, batch_size) -> list[Tensor]:
    empty = len(pool) == 0 if isinstance(pool, (Dataset, TaskBatch)) else \
        isinstance(pool, Tensor) and pool.ndim == 2 and pool.numel() == 0
    if empty:
        what = f"token ids of shape {tuple(pool.shape)}" if isinstance(pool, Tensor) else f"a {type(pool).__name__} of 0 rows"
        raise MeanPoolError(f"means_from is empty ({what}): a mean ablation averages the senders' outputs over the "
                            "pool's prompts. Pass a non-empty pool of prompts that are not the evaluated ones "
                            "(e.g. make_dataset(model, n_prompts=..., seed=<another seed>)).")
    if isinstance(pool, Dataset):
        return [b.tokens.to(model.cfg.device) for b in iter_batches(pool, batch_size or len(pool))]
    if isinstance(pool, TaskBatch):
        return [pool.tokens.to(model.cfg.device)]
    if isinstance(pool, Tensor) and pool.ndim == 2:
        return [pool.to(model.cfg.device)]
    raise MeanPoolError(f"means_from must be a Dataset, a TaskBatch or token ids [n, pos], got {type(pool).__name__}.")


def group_pool_means(model, ablation, pool, groups, batch_size, recompute: bool = False) -> Optional[dict]:
    """Mean sender outputs over the pool: ``{None: [n, d_model]}`` or ``{length: [n, pos, d_model]}``, ``n`` being
    the senders followed (``recompute``) by every layer's heads' pre-norm results."""
    if not ablation.endswith("mean"):
        if pool is not None:
            raise InputError(f"means_from is only used by mean ablations; with ablation={ablation!r} pass means_from=None.")
        return None
    if pool is None:
        raise MeanPoolError(
            f"ablation={ablation!r} needs means_from: a pool of prompts that are not the evaluated ones "
            f"(e.g. make_dataset(model, n_prompts=..., seed=<another seed>))."
        )
    pool_tokens = _pool_groups(model, pool, batch_size)
    for tokens in pool_tokens:
        inputs.check_token_ids(model, tokens, "means_from's tokens")
    evaluated = {tuple(row.tolist()) for g in groups for row in g.tokens}
    shared = sum(tuple(row.tolist()) in evaluated for tokens in pool_tokens for row in tokens)
    if shared:
        raise MeanPoolError(
            f"means_from shares {shared} prompt(s) with the evaluated prompts: the ablation would leak the evaluated "
            f"prompts' own activations. Draw the pool with another seed or split the dataset."
        )
    sums: dict = {}
    counts: dict = {}
    for tokens in pool_tokens:
        outputs, raw = record_outputs(model, tokens, raw=recompute)  # [n_forward, batch, pos, d_model]
        stacked = outputs if raw is None else torch.cat([outputs] + raw)  # senders, then every layer's raw heads
        stacked = stacked.double()
        key = None if ablation == "mean" else tokens.shape[1]
        total = stacked.sum((1, 2)) if key is None else stacked.sum(1)
        sums[key] = sums.get(key, 0) + total
        counts[key] = counts.get(key, 0) + (stacked.shape[1] * stacked.shape[2] if key is None else stacked.shape[1])
    means = {k: (sums[k] / counts[k]).to(model.cfg.dtype) for k in sums}
    if ablation == "positional-mean":
        missing = sorted({g.tokens.shape[1] for g in groups} - set(means))
        if missing:
            raise MeanPoolError(
                f"positional-mean needs pool prompts of every evaluated length; the pool has lengths {sorted(means)}, "
                f"missing {missing}. Use ablation='mean' or a pool built with the same templates."
            )
    return means


# ---------------------------------------------------------------------------- one group


def _evaluate_group(model, layout, masks, group, ablation, means, metric, memory_mb, reuse_prefix, bar,
                    norm: str) -> Tensor:
    """Metric [n_circuits, batch] of every circuit on one group of equal-length prompts."""
    prepared = prepare_group(model, layout, group, ablation, means, reuse_prefix, norm)
    out = []
    for C, resid_end in circuit_end_residuals(model, layout, masks, prepared, memory_mb):
        answers = group.answer_ids.repeat(C)
        alts = None if group.alt_ids is None else group.alt_ids.repeat(C)
        out.append(score_end(model, resid_end, answers, alts, metric).view(C, len(group.tokens)))
        bar.update(C)
    return torch.cat(out)


@dataclass
class PreparedGroup:
    """One group of equal-length prompts made ready for circuit runs: what every circuit of it shares.

    ``start``: the positions before it are the shared prefix, run once into ``kv``; ``ablated``: every sender's
    ablated output. Preparing once and running many circuits is what a search over circuits (ACDC) reuses.
    """

    group: object  # a patching.sweeps.inputs prompt group
    start: int
    kv: Optional[list]
    ablated: Ablated
    norm: str
    #: the reference run at the suffix: every block's input residual [n_layers, B, P, d] and every sender's
    #: output [n_forward, B, P, d] (:meth:`reference_run`, for forwards that start at a later layer)
    reference: Optional[tuple[Tensor, Tensor]] = None

    def reference_run(self, model) -> tuple[Tensor, Tensor]:
        """The reference run's block inputs and sender outputs at the suffix, recorded once."""
        if self.reference is None:
            recorder = SenderRecorder(model)
            inputs_of: dict[int, Tensor] = {}

            def keep(act, *, hook):
                inputs_of[int(hook.name.split(".")[1])] = act

            hooks = recorder.hooks() + [(f"blocks.{layer}.hook_resid_pre", keep) for layer in range(model.cfg.n_layers)]
            run_suffix(model, self.group.tokens, self.start, self.kv, hooks)
            self.reference = torch.stack([inputs_of[layer] for layer in range(model.cfg.n_layers)]), recorder.stacked()
        return self.reference


def prepare_group(model, layout, group, ablation, means, reuse_prefix, norm: str) -> PreparedGroup:
    """The shared prefix's keys/values and the ablated outputs of one group (inside :func:`edge_mode`)."""
    n_pos = group.tokens.shape[1]
    start = forward.shared_prefix_length(group.tokens, group.cf_tokens) if reuse_prefix and ablation == "counterfactual" else 0
    kv = edge_prefix_kv(model, group.tokens[:, :start]) if start else None
    if ablation == "counterfactual":
        ablated = record_ablated(model, group.cf_tokens, start=start, prefix_kv=kv, norm=norm)
    elif ablation == "zero":
        ablated = Ablated.zero(model)
    else:
        mean = means[None] if ablation == "mean" else means[n_pos]  # [n, d] or [n, P, d]
        mean = mean[:, None, None, None, :] if ablation == "mean" else mean[:, None, None]  # broadcast over C, B (, P)
        F, H = layout.n_forward, layout.n_heads
        raw = None if mean.shape[0] == F else [mean[F + i * H: F + (i + 1) * H] for i in range(layout.n_layers)]
        ablated = Ablated(mean[:F], raw)
    return PreparedGroup(group, start, kv, ablated, norm)


def circuit_end_residuals(model, layout, masks: Tensor, prepared: PreparedGroup, memory_mb: float,
                          from_layer: int = 0) -> Iterator[tuple[int, Tensor]]:
    """``(C, END residuals [C * batch, d_model])`` of the circuits ``masks`` on a prepared group, C circuits per
    forward (chunked to ``memory_mb``); row ``c * batch + b`` is prompt ``b`` under circuit ``c``.

    ``from_layer``: the forwards start at that block, from the reference run's residual, with the senders below
    it at their reference outputs: exact when no receiver below that layer is ablated in any of ``masks``
    (checked), without gradients and under the ``"frozen"`` norm.
    """
    group, start = prepared.group, prepared.start
    B, n_pos = group.tokens.shape
    P = n_pos - start
    first_receiver = layout.head_backward(from_layer, 0, QKV[0]) if from_layer else 0
    if from_layer and not bool((masks | ~layout.real_edge_mask)[:, :, :first_receiver].all()):
        raise InputError(f"Forwards from layer {from_layer} need every receiver below it intact in every circuit: "
                         "run from layer 0.")
    weights = (~masks).to(model.cfg.dtype).to(model.cfg.device)  # 1 where the edge is ablated
    per_chunk = _circuits_per_chunk(model, layout, B, P, start, memory_mb)
    spans = None if group.spans is None else group.spans[:, start:]
    for sl in forward.chunks(len(masks), per_chunk):
        w = weights[sl]
        C = w.shape[0]
        mixing = MixingHooks(model, w, prepared.ablated, C, B, norm=prepared.norm, spans=spans)
        if from_layer:
            block_inputs, outputs = prepared.reference_run(model)
            mixing.preset_senders(layout.head_forward(from_layer, 0), outputs)
            cache = None if prepared.kv is None else TiledKVCache(prepared.kv, C)
            resid = model.run_with_hooks(block_inputs[from_layer].repeat(C, 1, 1), start_at_layer=from_layer,
                                         stop_at_layer=model.cfg.n_layers, fwd_hooks=mixing.hooks(),
                                         past_kv_cache=cache)
        else:
            resid = run_suffix(model, group.tokens, start, prepared.kv, mixing.hooks(), times=C)
        yield C, resid[:, -1]


def _circuits_per_chunk(model, layout, B, P, start, memory_mb) -> int:
    cfg = model.cfg
    # the (ablated − current) buffer of every sender, plus the forward's activations with per-head q/k/v inputs
    buffer = layout.n_forward * B * P * cfg.d_model * torch.finfo(cfg.dtype).bits // 8
    split_factor = (12 + 6 * cfg.n_heads) / 12  # split q/k/v inputs add ~6·n_heads residual copies per position
    rows = forward.rows_per_chunk(model, memory_mb / split_factor, P, cached_pos=start)
    return max(1, min(rows // B, int(memory_mb * 2**20 // max(buffer, 1))))
