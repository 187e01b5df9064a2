"""Edge attribution patching: EAP, EAP-IG, EAP-GP and CEAP scores for every edge of the graph, from a few backward passes.

An edge s -> r carries sender s's output into receiver r's input (a head's q, k or v
input, an MLP's input, or the final residual; see :mod:`circuits.graph`). Patching
that one edge, i.e. giving r the counterfactual output of s in place of its reference
output, changes the metric m by, to first order,

    score(s -> r) = (o_s(X_cf) - o_s(X_ref)) · ∂m/∂in_r,

summed over positions and averaged over prompts (Syed et al. 2023). One backward pass
gives ∂m/∂in_r for every receiver at once, so every edge is scored together. The methods
(as hannamw/EAP-IG defines them, ``eap.attribute.attribute``) differ only in where the
gradient is taken:

* ``"EAP"``: on the reference run.
* ``"EAP-IG-inputs"`` (Hanna et al. 2024): averaged over ``ig_steps`` runs whose input
  embeddings are interpolated from the counterfactual toward the reference,
  ``emb_cf + (k / steps)(emb_ref - emb_cf)`` for k = 0 .. steps - 1 (EAP-IG's left Riemann
  sum: k = 0 is the counterfactual run itself, so one step is *not* EAP but the gradient
  at the counterfactual input).
* ``"EAP-IG-activations"``: for each layer component in turn (the input, each layer's
  attention output, each MLP output), that component's output is interpolated,
  ``a·out_ref + (1 - a)·out_cf`` with a = k / steps, k = 1 .. steps, inside the reference
  run; the gradient is averaged over all these (1 + 2·n_layers)·steps runs.
* ``"clean-corrupted"``: the mean of the gradients on the reference and on the
  counterfactual run.
* ``"EAP-GP"`` (GradPath, Zhang et al. 2025, arXiv 2502.06852): the gradient is averaged
  over ``ig_steps`` points of a path that starts at the reference input and is steered by
  the gradient instead of running straight: each step goes down the gradient of
  ½(m(x) − m(x_cf))² (the way the metric approaches the counterfactual's fastest, around
  regions where it saturates), with length ‖x_cf − x‖ / (steps left), and the gradient is
  taken at each point reached. Only the positions after the shared prefix move. Where the
  gradient is zero a step goes straight at the counterfactual; with every step straight,
  the points are EAP-IG-inputs' (the tests check this). The paper's text was not at hand:
  this reading of its path follows its abstract, and ``ig_steps`` (default 5, as EAP-IG)
  is the number of points; it costs ``ig_steps + 2`` backward passes.
* ``"CEAP"`` (conductance EAP): EAP-IG-inputs' path, but each point's gradient is paired
  with the senders' output change from that point to the next rather than a share of the
  total change,

      score(s -> r) = Σ_k (o_s(x_k) − o_s(x_{k+1})) · ∂m/∂in_r(x_k),   x_k = x_cf + (k/steps)(x_ref − x_cf),

  the layer conductance of Dhamdhere et al. 2018 applied to edges (the CEAP paper's text
  was not at hand; this is its stated idea, conductance in place of EAP-IG's straight-line
  share). The input's edges score as EAP-IG-inputs' (the input moves linearly); the
  senders' outputs sum to the final residual, so the edges into the logits add up to
  m(x_cf) − m(x_ref) up to the Riemann sum's error. Heads' outputs are taken as each run
  computes them, so only ``norm="frozen"`` applies on models with norms after attention.

The output difference uses the toolkit's norm convention: a sender's output is what it
adds to the residual in the run that produced it. On models with norms after attention
(gemma), a head's output is its ``hook_result`` slice times ``ln1_post.w`` over that run's
``ln1_post`` scale; EAP-IG takes the raw ``hook_result`` there, so the head-sender scores
differ on gemma (they agree on gpt2- and llama-style models, and for every other sender).

Speed: reference and counterfactual prompts share a prefix (few-shot lines, the first
operand's leading tokens); every output difference is zero there, so it is run once,
without gradient, and cached as keys/values; only the later positions are run and
differentiated. The metric reads the END position only, and unembeds only the columns
it needs (:func:`patching.sweeps.metrics.score_end`). Rows are chunked to ``memory_mb``.
``level="node"`` sums each sender's edges over its receivers (a node's score: the
first-order effect of patching its output everywhere downstream).

A metric that does not depend on the run (a constant, or one that ignores the logits) gives every
receiver a zero gradient and every edge a score of 0, which would look like a circuit of nothing;
it is refused with an :class:`InputError` after the first chunk's gradients, before the other chunks run.
(An identical counterfactual is different: the gradients are real, the output changes are zero, and the
zero scores are the right answer.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator, Iterator, NamedTuple, Optional, Union

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer
from transformer_lens import utils as tl_utils

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.prefix_cache import TiledKVCache
from patching.sweeps import forward, inputs
from patching.edges.engine import SenderRecorder, edge_mode, edge_prefix_kv, receiver_hooks, run_suffix
from patching.sweeps.metrics import PatchMetric, get_metric, score_end
from patching.edges.mixing import record_outputs, rms_norm
from patching.edges.positions import PositionalScores, check_schema, span_ids
from patching.sweeps.options import SweepOptions, sweep_options
from patching.sweeps.results import NodeScores

__all__ = ["edge_attribution", "EDGE_ATTRIBUTION_METHODS", "HEAD_CHANGES", "PATH_METHODS"]

#: what a head sender's output change is, on models with norms after attention (``edge_attribution(norm=)``)
HEAD_CHANGES = ("frozen", "recompute", "pre-norm")

Resid = Float[Tensor, "rows suffix d_model"]


@dataclass
class _Chunk:
    """One chunk of prompt rows: suffix embeddings, the shared prefix's keys/values, the scored tokens."""

    emb_ref: Resid
    emb_cf: Resid
    prefix_kv: Optional[list]
    answer_ids: Tensor
    alt_ids: Optional[Tensor]
    raw_ref: dict[str, Tensor]  # component outputs as hooked (EAP-IG-activations interpolates these)
    raw_cf: dict[str, Tensor]


class _Pass(NamedTuple):
    """A gradient pass: the suffix input residual of a run, forward hooks that change the run, and whether its
    gradients join the scores (a pass that only steers a path does not)."""

    resid: Resid
    hooks: list
    counted: bool = True


# A pass maker yields passes (or (resid, hooks) pairs); after each it is sent that pass's receiver gradients
# [rows, suffix, n_backward, d_model] and per-row metric, which a path that steers by the gradient reads.
_PassMaker = Callable[[HookedTransformer, _Chunk, int], Generator[tuple, Optional[tuple[Tensor, Tensor]], None]]


def _eap(model, chunk, steps):
    yield chunk.emb_ref, []


def _eap_ig_inputs(model, chunk, steps):
    for k in range(steps):
        yield chunk.emb_cf + (k / steps) * (chunk.emb_ref - chunk.emb_cf), []


def _clean_corrupted(model, chunk, steps):
    yield chunk.emb_ref, []
    yield chunk.emb_cf, []


def _eap_ig_activations(model, chunk, steps):
    # EAP-IG interpolates each layer's hook_result (all heads at once); result = z · W_O is linear in
    # z, so interpolating hook_z is the same run without materialising the per-head results.
    for name in [None] + _component_hook_names(model):
        for k in range(1, steps + 1):
            alpha = k / steps
            if name is None:
                yield chunk.emb_cf + alpha * (chunk.emb_ref - chunk.emb_cf), []
                continue
            mixed = alpha * chunk.raw_ref[name] + (1 - alpha) * chunk.raw_cf[name]

            def interpolate(act, *, hook, mixed=mixed):
                return mixed

            yield chunk.emb_ref, [(name, interpolate)]


def gradient_direction(input_grad: Resid, gap: Tensor, x: Resid, target: Resid) -> Resid:
    """GradPath's direction: down the gradient of ½(m(x) − m(x_cf))², which moves the metric toward the
    counterfactual's by the steepest way (``input_grad``: ∂m/∂x per row; ``gap``: m(x) − m(x_cf) per row)."""
    return -gap.to(input_grad.dtype)[:, None, None] * input_grad


def straight_direction(input_grad: Resid, gap: Tensor, x: Resid, target: Resid) -> Resid:
    """Straight at the counterfactual: with it, GradPath's points are EAP-IG-inputs' straight-line points."""
    return target - x


def gradpath_step(direction: Resid, x: Resid, target: Resid, steps_left: int) -> Resid:
    """A step of length ‖x_cf − x‖ / steps_left along ``direction`` (per row; straight at x_cf where it is 0)."""
    def norm(t):
        return t.flatten(1).norm(dim=1)[:, None, None]

    straight = target - x
    length = norm(straight) / steps_left
    size = norm(direction)
    unit = torch.where(size > 0, direction / size.clamp_min(torch.finfo(size.dtype).tiny),
                       straight / norm(straight).clamp_min(torch.finfo(size.dtype).tiny))
    return length * unit


def _gradpath(direction: Callable = gradient_direction) -> _PassMaker:
    """EAP-GP's passes: from the reference input, ``steps`` steps along ``direction``, scored at each point
    reached (two uncounted passes first: the metric at the counterfactual, the gradient at the start)."""

    def passes(model, chunk, steps):
        _, metric_cf = yield _Pass(chunk.emb_cf, [], False)
        x = chunk.emb_ref
        grads, values = yield _Pass(x, [], False)
        for k in range(steps):
            input_grad = grads.sum(2)  # the input feeds every receiver's input: ∂m/∂x = Σ_r ∂m/∂in_r
            x = x + gradpath_step(direction(input_grad, values - metric_cf, x, chunk.emb_cf), x, chunk.emb_cf,
                                  steps - k)
            grads, values = yield _Pass(x, [], True)

    return passes


@dataclass(frozen=True)
class _Method:
    passes: _PassMaker
    n_passes: Callable[[HookedTransformer, int], int]
    needs_raw_outputs: bool = False
    #: score each pass by the senders' output change to the next point (conductance), not the total change
    conductance: bool = False


EDGE_ATTRIBUTION_METHODS: dict[str, _Method] = {
    "EAP": _Method(_eap, lambda model, steps: 1),
    "EAP-IG-inputs": _Method(_eap_ig_inputs, lambda model, steps: steps),
    "EAP-IG-activations": _Method(_eap_ig_activations, lambda model, steps: (1 + 2 * model.cfg.n_layers) * steps,
                                  needs_raw_outputs=True),
    "clean-corrupted": _Method(_clean_corrupted, lambda model, steps: 2),
    "EAP-GP": _Method(_gradpath(), lambda model, steps: steps + 2),
    "CEAP": _Method(_eap_ig_inputs, lambda model, steps: steps, conductance=True),
}
#: the methods that integrate along a path of ``ig_steps`` points
PATH_METHODS = ("EAP-IG-inputs", "EAP-IG-activations", "EAP-GP", "CEAP")


# ---------------------------------------------------------------------------- runs


def _run_suffix(model: HookedTransformer, resid: Resid, prefix_kv, hooks: list) -> Float[Tensor, "rows suffix d_model"]:
    """Final residual of a run whose first-block input at the suffix positions is ``resid``."""
    cache = None if prefix_kv is None else TiledKVCache(prefix_kv, 1)
    return model.run_with_hooks(resid, start_at_layer=0, stop_at_layer=model.cfg.n_layers, fwd_hooks=hooks,
                                past_kv_cache=cache)


def _component_hook_names(model: HookedTransformer) -> list[str]:
    return [name for layer in range(model.cfg.n_layers)
            for name in (tl_utils.get_act_name("z", layer), tl_utils.get_act_name("mlp_out", layer))]


@torch.no_grad()
def _sender_outputs(model: HookedTransformer, tokens, prefix: int, prefix_kv,
                    keep_raw: bool) -> tuple[Float[Tensor, "n_forward rows suffix d_model"], dict[str, Tensor]]:
    """Every sender's output at the suffix (:class:`patching.edges.engine.SenderRecorder`), and optionally the
    layer components' raw values (``hook_z``, ``hook_mlp_out``) that EAP-IG-activations interpolates."""
    raw: dict[str, Tensor] = {}

    def keep(act, *, hook):
        raw[hook.name] = act.detach().clone()

    recorder = SenderRecorder(model)
    extra = [(name, keep) for name in _component_hook_names(model)] if keep_raw else []
    run_suffix(model, tokens, prefix, prefix_kv, recorder.hooks() + extra)
    return recorder.stacked(), raw


def _receiver_gradients(model: HookedTransformer, chunk: _Chunk, resid: Resid, hooks: list,
                        metric: PatchMetric) -> tuple[Tensor, Tensor]:
    """∂(Σ_rows m)/∂in_r for every receiver ``[rows, suffix, n_backward, d_model]``, and the per-row metric."""
    captured: dict[str, Tensor] = {}

    def keep(act, *, hook):
        captured[hook.name] = act
        return act

    # receiver_hooks lists backward indices in order, grouped by hook with heads ascending
    names = list(dict.fromkeys(name for name, _ in receiver_hooks(model)))
    with torch.enable_grad():
        resid = resid.detach().requires_grad_(True)
        final = _run_suffix(model, resid, chunk.prefix_kv, hooks + [(n, keep) for n in names])
        values = score_end(model, final[:, -1], chunk.answer_ids, chunk.alt_ids, metric)
        if not values.requires_grad:
            raise _constant_metric(metric, "its values do not depend on the logits it is given")
        grads = torch.autograd.grad(values.sum(), [captured[n] for n in names], allow_unused=True)
    # receivers upstream of a component that a pass replaces (EAP-IG-activations) do not reach the metric
    grads = [torch.zeros_like(captured[n]) if g is None else g for n, g in zip(names, grads)]
    return torch.cat([g if g.ndim == 4 else g[:, :, None, :] for g in grads], dim=2), values.detach()


# ---------------------------------------------------------------------------- public entry point


def _row_budget(model: HookedTransformer, memory_mb: float, n_suffix: int, n_prefix: int) -> int:
    cfg = model.cfg
    layout = GraphLayout.of(model)
    # forward activations kept for the backward (split q/k/v inputs add 3·n_heads residual copies per layer)
    per_pos = cfg.n_layers * (16 * cfg.d_model + 3 * cfg.n_heads * cfg.d_model + 3 * (cfg.d_mlp or 0)
                              + cfg.n_heads * (4 * cfg.d_head + 3 * cfg.d_model + 2 * (n_suffix + n_prefix)))
    per_pos += 3 * (layout.n_forward + layout.n_backward) * cfg.d_model  # output differences, gradients, their sum
    per_row = n_suffix * per_pos * torch.finfo(cfg.dtype).bits // 8
    per_row += 2 * n_prefix * cfg.n_layers * (cfg.n_key_value_heads or cfg.n_heads) * cfg.d_head * 4
    return max(1, int(memory_mb * 2**20 // per_row))


def edge_attribution(
    model: HookedTransformer,
    reference,
    counterfactual: Optional[Tensor] = None,
    *,
    method: str = "EAP-IG-inputs",
    ig_steps: int = 5,
    level: str = "edge",
    norm: str = "frozen",
    spans=None,
    answer_ids=None,
    alt_ids=None,
    options: Optional[SweepOptions] = None,
) -> Union[Graph, NodeScores]:
    """Score every edge (or node) by EAP / EAP-IG; see the module docstring for the methods.

    ``reference`` / ``counterfactual`` / ``answer_ids`` / ``alt_ids``: as in :func:`patching.path_patch`
    (a task Dataset, a TaskBatch, or token tensors). ``options`` (:class:`patching.SweepOptions`; None for
    its defaults): the metric on the END logits (:mod:`patching.sweeps.metrics`), batching, the memory
    budget (default 2048 MB: the backward keeps every layer's activations) and the progress bar.
    ``norm`` (models with norms after attention): a head sender's change is its output at each run's
    own scale (``"frozen"``, the toolkit's convention), its layer re-normalised with the head's pre-norm
    result swapped (``"recompute"``, the change :func:`patching.edges.evaluate_circuit` makes under that
    convention), or its raw pre-norm ``hook_result`` difference (``"pre-norm"``, hannamw/EAP-IG's
    ``attribute``); elsewhere all three are the same. ``spans`` (a schema of :mod:`patching.edges.positions`):
    score every position-aware edge instead, summing each edge's terms over the positions of each span
    (needs a Dataset or TaskBatch); returns :class:`patching.edges.positions.PositionalScores`.
    Returns a :class:`circuits.graph.Graph` whose ``scores`` are the mean over prompts of each edge's
    estimated effect on the metric (``level="edge"``), or :class:`patching.sweeps.results.NodeScores` of heads and MLPs
    (``level="node"``).
    """
    opts = sweep_options(options, "edge_attribution")
    spec, schema = _checked_method(model, method, level, norm, ig_steps, spans)
    metric = get_metric(opts.metric)
    groups = inputs.prompt_groups(model, reference, counterfactual, answer_ids=answer_ids, alt_ids=alt_ids,
                                 batch_size=opts.batch_size,
                                 span_of=None if schema is None else (lambda masks: span_ids(masks, schema)))
    plan = _chunk_plan(model, groups, opts.budget(2048.0))
    if model.cfg.parallel_attn_mlp:
        raise InputError("Parallel attention/MLP blocks are not supported by edge attribution yet.")
    with edge_mode(model):
        bar = tqdm(total=len(plan) * spec.n_passes(model, ig_steps), desc=f"edge attribution ({method})",
                   disable=not opts.shows_progress(), leave=False)
        total, metric_total, n_prompts = _attribute_chunks(model, plan, spec, ig_steps, norm, metric, schema, bar)
        bar.close()
    meta = {"method": method, "ig_steps": ig_steps if method in PATH_METHODS else None,
            "metric": metric.name, "n_prompts": n_prompts, "reference_metric": metric_total / n_prompts,
            "d_model": model.cfg.d_model, "norm": norm, "norm_convention": NORM_CONVENTIONS[norm]}
    return _returned_scores(GraphLayout.of(model), total / n_prompts, meta, level, schema)


#: what a head sender's change is under each ``norm`` of :func:`edge_attribution` (its results' ``meta``)
NORM_CONVENTIONS = {"frozen": "residual contribution (post-norm, run's own scale)",
                    "recompute": "layer re-normalised with the head's result swapped",
                    "pre-norm": "pre-norm hook_result difference (hannamw/EAP-IG attribute)"}


def _checked_method(model, method: str, level: str, norm: str, ig_steps, spans):
    """The method's spec and the span schema (None: whole edges), once every argument of
    :func:`edge_attribution` is one it can score with."""
    if method not in EDGE_ATTRIBUTION_METHODS:
        raise InputError(f"Unknown method {method!r}: use one of {sorted(EDGE_ATTRIBUTION_METHODS)}.")
    if level not in ("edge", "node"):
        raise InputError(f"level must be 'edge' or 'node', got {level!r}.")
    if norm not in HEAD_CHANGES:
        raise InputError(f"Unknown norm {norm!r} for edge attribution: use one of {HEAD_CHANGES}.")
    if not isinstance(ig_steps, int) or ig_steps < 1:
        raise InputError(f"ig_steps must be a positive integer, got {ig_steps!r}.")
    spec = EDGE_ATTRIBUTION_METHODS[method]
    if spec.conductance and norm != "frozen" and model.cfg.use_normalization_before_and_after:
        raise InputError(f"{method} follows each sender's output along the path as the forward computes it (the "
                         f"'frozen' convention); norm={norm!r} changes heads' outputs in a way no run computes. "
                         "Use norm='frozen'.")
    schema = check_schema(spans)
    if schema is not None and level != "edge":
        raise InputError("Position-aware scores are per edge: pass level='edge' with spans.")
    return spec, schema


def _chunk_plan(model, groups, memory_mb: float) -> list[tuple]:
    """``(group, shared prefix length, rows)`` per chunk: each group cut into as many prompts as a backward of its
    suffix fits in ``memory_mb``."""
    plan = []
    for group in groups:
        prefix = forward.shared_prefix_length(group.tokens, group.cf_tokens)
        n_suffix = group.tokens.shape[1] - prefix
        rows = min(len(group), _row_budget(model, memory_mb, n_suffix, prefix))
        plan += [(group, prefix, sl) for sl in forward.chunks(len(group), rows)]
    return plan


def _contraction(group, prefix: int, sl: slice, schema):
    """How a chunk's sender changes ``[f, b, p, d]`` and receiver gradients ``[b, p, k, d]`` become edge terms:
    summed over prompts and positions (``[f, k]``), or per span of ``schema`` (``[f, k, s]``)."""
    if schema is None:
        def contract(change, grads):
            return torch.einsum("fbpd,bpkd->fk", change.to(grads.dtype), grads)
        return contract
    onehot = torch.nn.functional.one_hot(group.spans[sl, prefix:], len(schema))

    def contract(change, grads, onehot=onehot):
        return torch.einsum("fbpd,bpkd,bps->fks", change.to(grads.dtype), grads, onehot.to(grads.dtype))
    return contract


def _attribute_chunks(model, plan: list[tuple], spec, ig_steps: int, norm: str, metric, schema,
                      bar) -> tuple[Tensor, float, int]:
    """Every chunk of ``plan`` scored: the edge terms summed over prompts (float64, on the CPU), the reference
    metric summed over prompts, and the number of prompts."""
    layout = GraphLayout.of(model)
    total = torch.zeros(layout.n_forward, layout.n_backward, *(() if schema is None else (len(schema),)),
                        dtype=torch.float64)
    metric_total, n_prompts = 0.0, 0
    for group, prefix, sl in plan:
        chunk, diff = _prepare_chunk(model, group, prefix, sl, spec.needs_raw_outputs, norm)
        contract = _contraction(group, prefix, sl, schema)
        grad_sum, chunk_total = _chunk_scores(model, chunk, diff, spec, ig_steps, metric, contract, bar)
        if n_prompts == 0 and not bool(grad_sum.any()):  # first chunk: no gradient at all reached a receiver
            raise _constant_metric(metric, f"every receiver's gradient is exactly zero on the first "
                                           f"{sl.stop - sl.start} prompts")
        total += chunk_total.double().cpu()
        metric_total += float(_reference_metric(model, chunk, metric).sum())
        n_prompts += sl.stop - sl.start
    return total, metric_total, n_prompts


def _returned_scores(layout: GraphLayout, mean: Tensor, meta: dict, level: str, schema):
    """The mean edge terms as :func:`edge_attribution` returns them (NaN where no edge is): a Graph, node scores
    (``level="node"``) or position-aware scores (``schema``)."""
    real = layout.real_edge_mask if schema is None else layout.real_edge_mask[:, :, None]
    scores = torch.where(real, mean, torch.nan).float()
    if level == "node":
        return node_scores_of_edges(layout, scores, meta)
    if schema is not None:
        return PositionalScores(layout, schema, scores, meta)
    return Graph(layout, scores, meta=meta)


def _chunk_scores(model, chunk: _Chunk, diff: Tensor, spec: _Method, steps: int, metric: PatchMetric,
                  contract: Callable, bar) -> tuple[Tensor, Tensor]:
    """The sum of a chunk's receiver gradients over the counted passes, and its summed edge scores.

    ``contract(change, grads)`` sums sender change × receiver gradient over rows and positions (per span).
    A path method scores ``contract(diff, mean gradient)``; conductance sums, pass by pass, the gradient at
    each point times the senders' change from that point to the next (the last step ends at the reference,
    whose outputs are the first point's minus ``diff``: the first point is the counterfactual run).
    """
    passes = spec.passes(model, chunk, steps)
    grad_sum, counted, feedback = None, 0, None
    conducted, first, before = 0.0, None, None
    while True:
        try:
            step = _Pass(*passes.send(feedback))
        except StopIteration:
            break
        recorder = SenderRecorder(model) if spec.conductance else None
        hooks = step.hooks + (recorder.hooks() if recorder else [])
        grads, values = _receiver_gradients(model, chunk, step.resid, hooks, metric)
        feedback = grads, values
        bar.update(1)
        if not step.counted:
            continue
        grad_sum = grads if grad_sum is None else grad_sum + grads
        counted += 1
        if recorder is not None:
            outputs = recorder.stacked().detach()
            if before is None:
                first = outputs
            else:
                conducted = conducted + contract(before[0] - outputs, before[1])
            before = outputs, grads
    if spec.conductance:
        return grad_sum, conducted + contract(before[0] - (first - diff.to(first.dtype)), before[1])
    return grad_sum, contract(diff, grad_sum) / counted


def _constant_metric(metric: PatchMetric, why: str) -> InputError:
    return InputError(
        f"Metric {metric.name!r} does not depend on the run ({why}), so every edge would score 0 and no edge could be "
        "told from another. Score with a metric of the END logits that changes with the model's computation "
        "(e.g. 'logit' or 'logit_diff'), not a constant.")


@torch.no_grad()
def _prepare_chunk(model, group, prefix: int, sl: slice, needs_raw: bool, norm: str):
    """The chunk's runs, and every sender's output change ``[n_forward, rows, suffix, d_model]`` under ``norm``."""
    tokens, cf_tokens = group.tokens[sl], group.cf_tokens[sl]
    prefix_kv = edge_prefix_kv(model, tokens[:, :prefix]) if prefix > 0 else None
    outputs_ref, raw_ref = _sender_outputs(model, tokens, prefix, prefix_kv, needs_raw)
    outputs_cf, raw_cf = _sender_outputs(model, cf_tokens, prefix, prefix_kv, needs_raw)
    emb_ref, emb_cf = outputs_ref[0], outputs_cf[0]  # sender 0, the input, is the first block's input
    alt = None if group.alt_ids is None else group.alt_ids[sl]
    chunk = _Chunk(emb_ref, emb_cf, prefix_kv, group.answer_ids[sl], alt, raw_ref, raw_cf)
    diff = outputs_cf - outputs_ref
    if norm != "frozen" and model.cfg.use_normalization_before_and_after:
        _, heads_ref = record_outputs(model, tokens, start=prefix, prefix_kv=prefix_kv, raw=True)
        _, heads_cf = record_outputs(model, cf_tokens, start=prefix, prefix_kv=prefix_kv, raw=True)
        layout = GraphLayout.of(model)
        for layer in range(layout.n_layers):
            first = layout.head_forward(layer, 0)
            change = heads_cf[layer] - heads_ref[layer]  # pre-norm: hannamw/EAP-IG's attribute
            if norm == "recompute":
                ln, total = model.blocks[layer].ln1_post, heads_ref[layer].sum(0)
                change = rms_norm(ln, total[None] + change) - rms_norm(ln, total)[None]
            diff[first:first + layout.n_heads] = change
    return chunk, diff


@torch.no_grad()
def _reference_metric(model, chunk: _Chunk, metric: PatchMetric) -> Tensor:
    final = _run_suffix(model, chunk.emb_ref, chunk.prefix_kv, [])
    return score_end(model, final[:, -1], chunk.answer_ids, chunk.alt_ids, metric)


def node_scores_of_edges(layout: GraphLayout, scores: Tensor, meta: dict) -> NodeScores:
    """Each sender's edge scores summed over its receivers (``level="node"``), as node scores."""
    per_sender = torch.nan_to_num(scores).sum(dim=1)
    heads = torch.stack([per_sender[[layout.head_forward(l, h) for h in range(layout.n_heads)]]
                         for l in range(layout.n_layers)])
    mlps = per_sender[[layout.mlp_forward(l) for l in range(layout.n_layers)]]
    info = dict(meta, input_score=float(per_sender[0]))
    return NodeScores(heads, mlps, meta["metric"], meta["reference_metric"], meta["n_prompts"],
                      method=f"edge_attribution:{meta['method']}", info=info)
