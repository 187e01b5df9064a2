"""Learned circuits: a mask over every edge at once, optimised so the circuit behaves like the model.

Attribution scores each edge alone; the circuits it gives at small sizes are often not faithful,
because what an edge does depends on which other edges are kept. The methods here learn a mask
``m`` over all edges together, with each receiver reading (:mod:`patching.edges.mixing`)

    in_r = Σ_s m_sr · o_s(this run) + (1 − m_sr) · ã_s,

the decomposition and counterfactual ablation of :func:`patching.edges.evaluate_circuit`, made
differentiable: ``m = 1`` everywhere is the model, ``m = 0`` the empty circuit, a binary ``m`` an
edge set. The loss compares the circuit with the full model at END:

* ``objective="kl"``: KL(p_model ‖ p_circuit) over the whole vocabulary (as Edge Pruning and UGS);
* ``objective="metric"``: ``((m(C) − m(full)) / (m(full) − m(∅)))²`` per prompt, the metric being the
  answer logit (what MIB's faithfulness reads), in units of the root mean square of ``m(full) − m(∅)``
  over the training prompts.

Methods (``method=``); each returns edge scores like :func:`patching.edges.edge_attribution`, so
:func:`patching.edges.faithfulness_curve`, the selections, figures and EAP-IG / MIB files take them as they are:

* ``"edge-pruning"`` (Bhaskar et al., NeurIPS 2024): a hard-concrete gate per edge (Louizos et al.
  2018: ``log α``, temperature β = 2/3, stretch (−0.1, 1.1)), sampled afresh each step; the expected
  L0 is pushed toward ``target_fraction`` of the edges by a Lagrangian ``λ₁(s − t) + λ₂(s − t)²`` whose
  λ's are trained by gradient ascent, the target ramped linearly from keeping everything over the first
  ``warmup`` of the steps. Scores: each gate's probability of being open.
* ``"ugs"`` (uniform gradient sampling, MIB's baseline, alestolfo/optimalablation): ``p = sigmoid(θ)``;
  ``samples`` masks per step, each edge ``m = clamp(0.5 − (u − p)/w, 0, 1)`` with ``u ~ U(0, 1)`` and
  window ``w = p(1 − p)``: Bernoulli(p) outside the window, uniform on (0, 1) inside it, whose
  gradient averages to an integrated-gradients estimate of the edge's effect; loss + ``ugs_lambda · Σ p``
  (MIB's λ = 1e-3 on the expected edge count).
  Scores: ``sigmoid(θ)``.
* ``"matryoshka"`` (random-budget masks): scores ``s``; each step draws ``samples`` budgets ``k``
  (log-uniform between ``min_fraction`` and all edges) and runs, for each, the soft top-k mask
  ``sigmoid((s − τ_k) / T)`` with ``τ_k`` set so the mask sums to ``k``; the width ``T`` shrinks from
  ``temperature`` to ``final_temperature`` standard deviations of ``s`` over the steps. Soft masks at
  first let chains of edges form (a hard mask gives a chain whose links are all absent no gradient
  at all); near the end the masks are almost the hard top-k circuits that are evaluated. Every size
  is trained, so one ranking serves every MIB size, and its circuits are nested by construction.
  Scores: ``s`` (shifted to start at 0).

Restarts (``restarts=``): the same method run that many times with its own seeds (batches, sizes, noise), each
run's scores standardised and averaged; what optimiser noise moves near a size's threshold averages out.

Warm starts (``init=``): any score tensor (EAP-IG, exact effects): ``|score|`` standardised becomes the
starting ``log α``, ``θ`` or ``s`` (so the first top-k circuits are those of the warm start).

Only counterfactual ablation is learned (the prompts' twins, as MIB's arithmetic tasks): every
activation before the first position where reference and twin differ is the same in both runs, so
the shared prefix runs once, without gradient, and only the positions after it are trained.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from circuits.seeds import derived_seed
from circuits.arguments import check_positive_int
from circuits.end_logits import unembed_end
from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.prefix_cache import StackedKVCache
from patching.sweeps import forward, inputs
from patching.edges.engine import edge_mode, edge_prefix_kv, run_suffix
from patching.edges.mixing import Ablated, MixingHooks, check_norm, record_ablated
from patching.edges.catalogue import LEARN_OBJECTIVES as OBJECTIVES
from patching.edges.catalogue import LEARNED_METHODS as METHODS
from patching.edges.mask_samplers import SAMPLERS, MaskMethod
from patching.sweeps.forward import frozen_weights
from patching.sweeps.metrics import MetricLike, get_metric, score_end


#: the sizes (fractions of the edges) the "top-n" method trains by default: MIB's, less the ends (f(∅) = 0 and
#: f(everything) = 1 whatever the scores)
TOP_N_FRACTIONS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)



@dataclass(frozen=True)
class LearnConfig:
    """Settings of :func:`learn_circuit` (defaults set before any held-out evaluation, docs/methods.md)."""

    method: str = "matryoshka"
    objective: str = "metric"
    steps: int = 200
    lr: Optional[float] = None  # Adam's learning rate (None: the method's, mask_samplers.DEFAULT_LR)
    batch_size: int = 8  # prompts per step
    samples: int = 2  # masks per prompt per step (sampled gates, UGS samples, or budgets)
    target_fraction: float = 0.05  # edge-pruning: the fraction of edges to keep
    warmup: float = 0.5  # edge-pruning: share of the steps over which the target is ramped in
    lagrangian_lr: float = 0.05  # edge-pruning: learning rate of the λ's (gradient ascent)
    ugs_lambda: float = 1e-3  # ugs: weight of Σ p (the expected edge count) in the loss (MIB's default)
    min_fraction: float = 0.001  # matryoshka: the smallest budget drawn
    temperature: float = 1.0  # matryoshka, top-n: width of the soft top-k at the first step, in standard deviations of the scores
    final_temperature: float = 0.05  # matryoshka, top-n: its width at the last step
    fractions: tuple[float, ...] = TOP_N_FRACTIONS  # top-n: the circuit sizes trained, as fractions of the edges
    faithfulness_penalty: float = 0.0  # weight of |1 − f| of every circuit on the step's prompts, added to the loss
    restarts: int = 1  # independent runs (own seeds: batches, sizes, noise) whose standardised scores are averaged
    norm: str = "frozen"
    seed: int = 0
    # the seed of the stream that picks each step's prompt length (None: the run's own): runs trained together that
    # share it and hold as many prompts of each length draw the same lengths, so they share every step's forward
    length_seed: Optional[int] = None
    memory_mb: float = 2048.0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InputError(f"Unknown learned-circuit method {self.method!r}: use one of {METHODS}.")
        if self.objective not in OBJECTIVES:
            raise InputError(f"Unknown objective {self.objective!r}: use 'kl' (the END distribution) or 'metric'.")
        for name in ("steps", "batch_size", "samples", "restarts"):
            check_positive_int(getattr(self, name), name)
        for name in ("lr", "lagrangian_lr", "temperature", "final_temperature", "memory_mb"):
            value = getattr(self, name)
            if name == "lr" and value is None:
                continue
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise InputError(f"LearnConfig.{name} must be a finite number > 0, got {value!r}.")
        for name in ("target_fraction", "min_fraction"):
            if not 0 < getattr(self, name) <= 1:
                raise InputError(f"LearnConfig.{name} must be in (0, 1], got {getattr(self, name)!r}.")
        if not self.fractions or not all(isinstance(x, (int, float)) and 0 < x <= 1 for x in self.fractions):
            raise InputError(f"LearnConfig.fractions must be a non-empty tuple of fractions in (0, 1], got "
                             f"{self.fractions!r}.")
        if not (math.isfinite(self.faithfulness_penalty) and self.faithfulness_penalty >= 0):
            raise InputError(f"LearnConfig.faithfulness_penalty must be a finite number >= 0, got "
                             f"{self.faithfulness_penalty!r}.")
        if not 0 <= self.warmup <= 1 or self.ugs_lambda < 0:
            raise InputError(f"LearnConfig.warmup must be in [0, 1] and ugs_lambda >= 0, got {self.warmup}, "
                             f"{self.ugs_lambda}.")
        check_norm(self.norm)
        if self.length_seed is not None and (not isinstance(self.length_seed, int) or self.length_seed < 0):
            raise InputError(f"LearnConfig.length_seed must be None or an integer >= 0, got {self.length_seed!r}.")


#: the learned circuit every command finds by default (``experiments.circuit``, the main job's edge stage,
#: ``experiments.loop``, precise SFT's circuit heads): the straight-through top-n at the reported sizes, all seven
#: sizes and four prompts per step, 100 steps from an EAP-IG-inputs warm start. Steps, prompts and sizes per step,
#: lr and penalty were chosen on validation prompts by ``experiments.learned_circuit`` (docs/results.md, "Settings
#: chosen on validation" and "Every size every step"): training three of the seven sizes a step left the curve
#: wandering between them (validation CMD 0.18 against 0.05), at half the cost a step. The experiments' flags
#: (``experiments.runtime.settings.LearnSettings``) default to these values.
DEFAULT_CIRCUIT = LearnConfig(method="top-n", steps=100, batch_size=4, samples=len(TOP_N_FRACTIONS),
                              faithfulness_penalty=1.0, progress=False)


@dataclass
class LearnedCircuit:
    """Learned edge scores (a :class:`circuits.graph.Graph`), the training curve and its cost."""

    graph: Graph
    losses: list[float]
    faithfulness: list[float]  # per step: mean over the step's masks of f on the step's prompts
    seconds: float
    cpu_seconds: float
    seconds_per_step: float  # the whole wall time (cached forwards included) over the steps
    peak_memory_mb: Optional[float] = None
    config: LearnConfig = field(default_factory=LearnConfig)
    step_seconds: list[float] = field(default_factory=list)  # wall time of each optimisation step alone
    step_lengths: list[int] = field(default_factory=list)  # the token length of each step's prompts

    @property
    def scores(self) -> Tensor:
        return self.graph.scores

    def brief(self, warm_start: Optional[str], warm_start_seconds: float) -> dict:
        """What a results row says of the run: its warm start (name and seconds), steps, seconds per step, and at
        most about 50 of its losses."""
        return {"warm_start": warm_start, "warm_start_seconds": round(warm_start_seconds, 1), "steps": self.config.steps,
                "seconds_per_step": self.seconds_per_step, "losses": self.losses[::max(1, len(self.losses) // 50)]}

    def to_dict(self) -> dict:
        return {"config": dataclasses.asdict(self.config), "losses": self.losses, "faithfulness": self.faithfulness,
                "seconds": self.seconds, "cpu_seconds": self.cpu_seconds, "seconds_per_step": self.seconds_per_step,
                "step_seconds": self.step_seconds, "step_lengths": self.step_lengths,
                "peak_memory_mb": self.peak_memory_mb}


# ---------------------------------------------------------------------------- prompts, cached once


@dataclass
class _Batch:
    """A group of equal-length prompts with everything that does not depend on the mask."""

    group: inputs.PromptGroup
    start: int
    prefix_kv: Optional[list]
    ablated: object
    full_logprobs: Tensor  # [B, vocab] (objective "kl")
    full_metric: Tensor  # [B]
    empty_metric: Tensor  # [B]


@torch.no_grad()
def _prepare(model, groups, layout, norm: str, metric, starts: Optional[dict[int, int]] = None) -> list[_Batch]:
    """Every group's cached runs, from its shared prefix's end (at most ``starts[length]`` for its token length, so
    that runs trained together split their prompts of one length at one position and can share forwards)."""
    batches = []
    for group in groups:
        start = forward.shared_prefix_length(group.tokens, group.cf_tokens)
        if starts is not None:
            start = min(start, starts[group.tokens.shape[1]])
        kv = edge_prefix_kv(model, group.tokens[:, :start]) if start else None
        ablated = record_ablated(model, group.cf_tokens, start=start, prefix_kv=kv, norm=norm)
        full = run_suffix(model, group.tokens, start, kv, [])[:, -1]
        empty = run_suffix(model, group.cf_tokens, start, kv, [])[:, -1]
        batches.append(_Batch(group, start, kv, ablated, unembed_end(model, full).float().log_softmax(-1),
                              score_end(model, full, group.answer_ids, group.alt_ids, metric),
                              score_end(model, empty, group.answer_ids, group.alt_ids, metric)))
    return batches


def _sub_batch(batch: _Batch, rows: Tensor) -> _Batch:
    g = batch.group
    group = inputs.PromptGroup(g.tokens[rows], g.cf_tokens[rows], g.answer_ids[rows],
                               None if g.alt_ids is None else g.alt_ids[rows])
    kv = None if batch.prefix_kv is None else [
        type(e)(e.past_keys[rows], e.past_values[rows], frozen=True) for e in batch.prefix_kv]
    ab = batch.ablated
    ablated = type(ab)(ab.outputs[:, :, rows], None if ab.raw_heads is None else [r[:, :, rows] for r in ab.raw_heads])
    return _Batch(group, batch.start, kv, ablated, batch.full_logprobs[rows], batch.full_metric[rows],
                  batch.empty_metric[rows])


def _circuits_end(model, batches: Sequence[_Batch], counts: Sequence[int], keep: Tensor, norm: str) -> Tensor:
    """END residual ``[C * B, d_model]`` of the circuits ``keep [C, n_forward, n_backward]`` (1 = kept), the first
    ``counts[0]`` on ``batches[0]``'s ``B`` prompts, the next ``counts[1]`` on ``batches[1]``'s, ... (batches that line
    up: same length, shared prefix and ``B``), in one forward whose rows are circuit-major (``c * B + b``)."""
    C, B = keep.shape[0], len(batches[0].group)
    if len(batches) == 1:
        batch = batches[0]
        hooks = MixingHooks(model, 1 - keep, batch.ablated, C, B, norm=norm)
        return run_suffix(model, batch.group.tokens, batch.start, batch.prefix_kv, hooks.hooks(), times=C)[:, -1]
    tokens = torch.cat([b.group.tokens.repeat(c, 1) for b, c in zip(batches, counts)])
    kv = None if batches[0].prefix_kv is None else StackedKVCache([(b.prefix_kv, c) for b, c in zip(batches, counts)])
    hooks = MixingHooks(model, 1 - keep, _stacked_ablated([b.ablated for b in batches], counts), C, B, norm=norm)
    return run_suffix(model, tokens, batches[0].start, kv, hooks.hooks())[:, -1]


def _stacked_ablated(parts: Sequence[Ablated], counts: Sequence[int]) -> Ablated:
    """Each part's ablated outputs (broadcast over circuits, ``[n, 1, B, P, d]``) for its ``count`` circuits, stacked
    along the circuits: what :class:`MixingHooks` reads when circuits run on different prompts."""
    def stack(tensors):
        return torch.cat([t.expand(t.shape[0], c, *t.shape[2:]) for t, c in zip(tensors, counts)], dim=1)

    outputs = None if parts[0].outputs is None else stack([p.outputs for p in parts])
    raw = None if parts[0].raw_heads is None else [stack(layer) for layer in zip(*[p.raw_heads for p in parts])]
    return Ablated(outputs, raw)


def _loss(model, batch: _Batch, end: Tensor, C: int, objective: str, metric, scale: float,
          penalty: float = 0.0) -> tuple[Tensor, float]:
    """The training loss of ``C`` circuits on ``batch``, and their mean faithfulness f (for the log).

    ``scale``: the root mean square over the training prompts of m(full) − m(∅) per prompt, the unit of the
    ``"metric"`` objective (a batch's mean difference can be near 0 even where every prompt's is not).
    ``penalty``: weight of each circuit's |1 − f| on ``batch`` (f as the curves compute it: from the batch's mean
    metric), added to the objective, so that neither undershooting nor overshooting the full model pays.
    """
    g = batch.group
    answers = g.answer_ids.repeat(C)
    alts = None if g.alt_ids is None else g.alt_ids.repeat(C)
    values = score_end(model, end, answers, alts, metric).view(C, -1)
    full, empty = batch.full_metric, batch.empty_metric
    gap = full.mean() - empty.mean()
    f = float(((values.detach().mean(1) - empty.mean()) / gap).mean()) if abs(float(gap)) > 1e-12 else float("nan")
    if objective == "metric":
        loss = (((values - full[None]) / scale) ** 2).mean()
    else:
        logp = unembed_end(model, end).float().log_softmax(-1)
        target = batch.full_logprobs.repeat(C, 1)
        loss = F.kl_div(logp, target, log_target=True, reduction="batchmean")
    if penalty:  # |1 − f| = |mean(m(C) − m(full))| / |gap|, measured in the objective's unit (scale) for the batch
        loss = loss + penalty * ((values - full[None]).mean(1) / scale).abs().mean()
    return loss, f


# ---------------------------------------------------------------------------- the loop


def learn_circuit(
    model: HookedTransformer,
    reference,
    counterfactual: Optional[Tensor] = None,
    *,
    config: LearnConfig = LearnConfig(),
    init: Union[None, Tensor, Graph, object] = None,
    answer_ids=None,
    alt_ids=None,
    on_step: Optional[Callable[[int], None]] = None,
    metric: MetricLike = "logit",
    **overrides,
) -> LearnedCircuit:
    """Learn edge scores by one of :data:`METHODS` (module docstring) on the prompts ``reference``.

    ``reference`` / ``counterfactual`` / ``answer_ids`` / ``alt_ids``: as in :func:`patching.path_patch`.
    ``config``: :class:`LearnConfig` (or its fields as keywords, which replace the record's).
    ``init``: a warm start: a score tensor ``[n_forward, n_backward]``, a Graph or EdgeEffects.
    ``on_step(step)``: called as each optimisation step ends (``steps x restarts`` calls in all), e.g. to advance a
    progress line over several learned circuits.
    ``metric``: what the ``"metric"`` objective scores at END (a name of :data:`patching.sweeps.metrics.METRICS` or a
    :class:`patching.sweeps.metrics.PatchMetric`, e.g. a task's logit difference; ``"kl"`` ignores it).
    """
    cfg = _settings(config, overrides)
    groups = inputs.prompt_groups(model, reference, counterfactual, answer_ids=answer_ids, alt_ids=alt_ids)
    seeds = [cfg.seed] if cfg.restarts == 1 else [restart_seed(cfg.seed, k) for k in range(cfg.restarts)]
    runs = _learn(model, [groups] * cfg.restarts, dataclasses.replace(cfg, restarts=1), seeds, init, on_step, None,
                  metric)
    return runs[0] if cfg.restarts == 1 else _averaged(runs, cfg)


def learn_circuits(
    model: HookedTransformer,
    references: Sequence,
    *,
    seeds: Sequence[int],
    config: LearnConfig = LearnConfig(),
    init: Union[None, Tensor, Graph, object] = None,
    on_step: Optional[Callable[[int], None]] = None,
    together: Optional[bool] = None,
    metric: MetricLike = "logit",
) -> list[LearnedCircuit]:
    """One learned circuit per prompt set in ``references`` (Datasets or TaskBatches: they carry their twins and
    answers), run ``k`` with seed ``seeds[k]``, all trained in one loop: each step, the runs whose prompts line up
    (same length, shared prefix and count) run their circuits as rows of one forward and one backward.

    Each run draws its prompts, sizes and noise from its own seeded stream in the order a lone run does, and Adam
    moves each parameter by its own gradient, so run ``k`` equals ``learn_circuit(model, references[k],
    config=replace(config, seed=seeds[k]), init=init)`` up to float rounding; only the wall time is shared. Runs
    share forwards when their steps draw prompts of one length: set ``config.length_seed`` (one stream of lengths
    for all) and give every set as many prompts of each length (e.g. resamples stratified by length,
    :func:`patching.edges.consensus.resample_rows`).

    ``together``: train the runs in one loop (True) or one after another (False, the same circuits); None: together
    on CUDA, apart on a CPU, where a forward's cost grows with its rows and stacking the runs' inputs only adds
    copies (``experiments.bench_learn``, docs/results.md: four runs together 0.92-0.99 times as fast as apart on a
    2-core CPU). ``metric``: as in :func:`learn_circuit`.
    """
    if len(references) != len(seeds) or not references:
        raise InputError(f"learn_circuits needs one seed per prompt set and at least one set, got {len(references)} "
                         f"sets and {len(seeds)} seeds.")
    if config.restarts != 1:
        raise InputError("learn_circuits runs one circuit per prompt set: restarts must be 1 (use more sets).")
    groups = [inputs.prompt_groups(model, reference) for reference in references]
    return _learn(model, groups, config, list(seeds), init, on_step, together, metric)


def _learn(model, groups_per_run: Sequence[list], cfg: LearnConfig, seeds: Sequence[int], init, on_step,
           together: Optional[bool], metric: MetricLike = "logit") -> list[LearnedCircuit]:
    """The runs trained together (one loop) or one after another (``together``; None: together on CUDA only)."""
    if together is None:
        together = torch.device(model.cfg.device).type == "cuda"
    if together or len(seeds) == 1:
        return _learn_batched(model, groups_per_run, cfg, seeds, init, on_step, metric)
    return [_learn_batched(model, [groups], cfg, [seed], init, on_step, metric)[0]
            for groups, seed in zip(groups_per_run, seeds)]


def _learn_batched(model, groups_per_run: Sequence[list], cfg: LearnConfig, seeds: Sequence[int], init,
                   on_step, metric: MetricLike = "logit") -> list[LearnedCircuit]:
    """The loop behind :func:`learn_circuit` and :func:`learn_circuits`: one run per prompt groups and seed."""
    layout = GraphLayout.of(model)
    init = _warm_start_scores(init, layout)
    metric = get_metric(metric)
    wall, cpu = time.perf_counter(), time.process_time()
    starts = _common_starts(groups_per_run)
    with frozen_weights(model), edge_mode(model):
        runs = [_start_run(model, groups, layout, dataclasses.replace(cfg, seed=seed), init, metric, starts)
                for groups, seed in zip(groups_per_run, seeds)]
        _optimise(model, runs, cfg, metric, on_step)
    meta = {"batched_runs": len(runs)} if len(runs) > 1 else {}
    return [_learned(model, run, layout, warm_started=init is not None, wall=wall, cpu=cpu, meta=meta) for run in runs]


def _settings(config: LearnConfig, overrides: dict) -> LearnConfig:
    """``config`` with the keyword ``overrides`` of :func:`learn_circuit` (fields of :class:`LearnConfig`) applied."""
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(LearnConfig)})
    if unknown:
        raise InputError(f"learn_circuit() got unexpected keyword argument(s) {', '.join(unknown)}; its settings "
                         f"are the fields of patching.edges.learn.LearnConfig.")
    return dataclasses.replace(config, **overrides)


def _warm_start_scores(init, layout: GraphLayout) -> Optional[Tensor]:
    """The warm start as a score tensor of this model's graph (a Graph's or EdgeEffects' scores), refused when its
    shape is another graph's or it holds no finite score (NaN, an edge never scored, is allowed: it starts at 0)."""
    if init is not None and not isinstance(init, Tensor):
        init = init.scores
    if init is None:
        return None
    if tuple(init.shape) != (layout.n_forward, layout.n_backward):
        raise InputError(f"init must be scores of this model's graph {(layout.n_forward, layout.n_backward)}, "
                         f"got {tuple(init.shape)}.")
    given = init.detach()[layout.real_edge_mask.to(init.device)]
    if torch.isinf(given).any() or not torch.isfinite(given).any():
        raise InputError(f"init holds {int(torch.isinf(given).sum())} infinite and {int(torch.isnan(given).sum())} "
                         f"NaN scores of {layout.n_edges} edges: a warm start needs finite scores (NaN only for "
                         "edges left unscored). Pass finite scores, or init=None for the default start.")
    return init


@dataclass
class _Trace:
    """What the optimisation recorded, one entry per step."""

    losses: list[float] = field(default_factory=list)
    faithfulness: list[float] = field(default_factory=list)  # mean f of the step's masks on the step's prompts
    step_seconds: list[float] = field(default_factory=list)  # wall time of the step alone
    step_lengths: list[int] = field(default_factory=list)  # token length of the step's prompts


@dataclass
class _Run:
    """One circuit of the loop: its settings, prompts (cached once), parameters, random stream and record."""

    cfg: LearnConfig
    batches: list[_Batch]
    method: MaskMethod
    generator: torch.Generator
    scale: float  # the root mean square of m(full) − m(∅) over the run's prompts: the loss's unit
    lengths: torch.Generator  # the stream that picks each step's prompt length (``generator`` unless length_seed)
    trace: _Trace = field(default_factory=_Trace)

    @property
    def sizes(self) -> Tensor:
        return torch.tensor([len(b.group) for b in self.batches], dtype=torch.float)


def _common_starts(groups_per_run: Sequence[list]) -> dict[int, int]:
    """For each token length, the shortest prefix that reference and twin share in any run's group of that length."""
    starts: dict[int, int] = {}
    for group in (g for groups in groups_per_run for g in groups):
        length = group.tokens.shape[1]
        start = forward.shared_prefix_length(group.tokens, group.cf_tokens)
        starts[length] = min(start, starts.get(length, start))
    return starts


def _start_run(model, groups, layout: GraphLayout, cfg: LearnConfig, init, metric, starts: dict[int, int]) -> _Run:
    generator = torch.Generator().manual_seed(cfg.seed)
    batches = _prepare(model, groups, layout, cfg.norm, metric, starts)
    _check_denominator(batches)
    gaps = torch.cat([b.full_metric - b.empty_metric for b in batches]).double()
    method = SAMPLERS[cfg.method](layout, cfg, init, model.cfg.device, generator)
    lengths = generator if cfg.length_seed is None else torch.Generator().manual_seed(cfg.length_seed)
    return _Run(cfg, batches, method, generator, float(gaps.pow(2).mean().sqrt()), lengths)


@dataclass
class _Draw:
    """One run's share of a step: the batch and rows it drew and its masks ``keep [C, n_forward, n_backward]``."""

    run: _Run
    batch: _Batch
    rows: Tensor
    keep: Tensor
    loss: float = 0.0
    f: float = 0.0

    @property
    def key(self) -> tuple:
        """Draws with one key line up row for row, so their circuits can share a forward."""
        return self.batch.group.tokens.shape[1], self.batch.start, len(self.rows)


def _optimise(model, runs: list[_Run], cfg: LearnConfig, metric, on_step: Optional[Callable[[int], None]]) -> None:
    """``cfg.steps`` steps of every run: each draws a batch in proportion to its prompts, its rows and masks (its own
    stream, in a lone run's order); the draws that line up share a forward and backward; each run's Adam steps."""
    bar = tqdm(range(cfg.steps), desc=f"learning {_circuits_word(len(runs))} ({cfg.method})", disable=not cfg.progress)
    for step in bar:
        started = time.perf_counter()
        with torch.enable_grad():
            draws = [_draw(model, run, step) for run in runs]
            for key in dict.fromkeys(d.key for d in draws):
                _backward(model, [d for d in draws if d.key == key], cfg, metric)
            for d in draws:
                penalty = d.run.method.penalty(step)
                if penalty.requires_grad:
                    penalty.backward()
        seconds = time.perf_counter() - started
        for d in draws:
            d.run.method.optimizer.step()
            d.run.method.after_step(step)
            d.run.trace.losses.append(float(d.loss))
            d.run.trace.faithfulness.append(d.f)
            d.run.trace.step_seconds.append(seconds)
            d.run.trace.step_lengths.append(d.key[0])
            if on_step is not None:
                on_step(step)
        bar.set_postfix(loss=f"{sum(d.loss for d in draws) / len(draws):.3g}",
                        f=f"{sum(d.f for d in draws) / len(draws):.2f}")
    bar.close()


def _circuits_word(n: int) -> str:
    return "a circuit" if n == 1 else f"{n} circuits"


def _draw(model, run: _Run, step: int) -> _Draw:
    """Run ``run``'s batch (in proportion to its prompts), up to ``batch_size`` of its rows, and masks for ``step``."""
    batch = run.batches[int(torch.multinomial(run.sizes, 1, generator=run.lengths))]
    take = min(run.cfg.batch_size, len(batch.group))
    rows = torch.randperm(len(batch.group), generator=run.generator)[:take].to(model.cfg.device)
    run.method.optimizer.zero_grad()
    return _Draw(run, batch, rows, run.method.dense(run.method.masks(step, run.cfg.samples)))


def _backward(model, draws: list[_Draw], cfg: LearnConfig, metric) -> None:
    """The loss of every draw's circuits on its prompts, from one forward of all of them (in chunks of prompts that
    fit ``cfg.memory_mb``, the gradient accumulated), and its backward; each draw records its loss and mean f."""
    take = len(draws[0].rows)
    keep = torch.cat([d.keep for d in draws])
    counts = [len(d.keep) for d in draws]
    per_chunk = _prompts_per_chunk(model, draws[0].batch, len(keep), cfg.memory_mb)
    for sl in forward.chunks(take, per_chunk):
        subs = [_sub_batch(d.batch, d.rows[sl]) for d in draws]
        share = (sl.stop - sl.start) / take
        ends = _circuits_end(model, subs, counts, keep, cfg.norm).split([c * (sl.stop - sl.start) for c in counts])
        total = 0.0
        for d, sub, end in zip(draws, subs, ends):
            part, part_f = _loss(model, sub, end, len(d.keep), d.run.cfg.objective, metric, d.run.scale,
                                 d.run.cfg.faithfulness_penalty)
            total = total + share * part
            d.loss, d.f = d.loss + share * float(part.detach()), d.f + share * part_f
        total.backward(retain_graph=True)


def _learned(model, run: _Run, layout: GraphLayout, *, warm_started: bool, wall: float, cpu: float,
             meta: dict) -> LearnedCircuit:
    """The run's final scores as a Graph of every edge (NaN where no edge is), with the trace and the cost (the
    loop's: runs trained together share their wall time)."""
    cfg, trace = run.cfg, run.trace
    scores = torch.full((layout.n_forward, layout.n_backward), float("nan"))
    scores[layout.real_edge_mask] = run.method.scores().float().cpu()
    seconds = time.perf_counter() - wall
    graph = Graph(layout, scores, meta={"method": f"learned:{cfg.method}", "d_model": model.cfg.d_model,
                                        "objective": cfg.objective,
                                        "steps": cfg.steps, "n_prompts": sum(len(b.group) for b in run.batches),
                                        "norm": cfg.norm, "warm_start": warm_started} | meta)
    return LearnedCircuit(graph, trace.losses, trace.faithfulness, round(seconds, 2),
                          round(time.process_time() - cpu, 2), round(seconds / cfg.steps, 3), config=cfg,
                          step_seconds=[round(t, 4) for t in trace.step_seconds], step_lengths=trace.step_lengths)


def restart_seed(seed: int, k: int) -> int:
    """The seed of restart ``k`` of a run seeded ``seed`` (restart 0 is the run itself; no two (seed, k) share one
    for seeds below 1,000,003 and fewer restarts)."""
    return derived_seed(seed, "restart", k)


def _averaged(runs: Sequence[LearnedCircuit], cfg: LearnConfig) -> LearnedCircuit:
    """One circuit from restarts: each run's scores standardised over the real edges, averaged, shifted to start at
    0. Optimiser noise (the batches and sizes drawn) moves edges near each size's threshold in or out; the average
    keeps the edges the runs agree on at the top."""
    layout = runs[0].graph.layout
    real = layout.real_edge_mask
    z = []
    for r in runs:
        values = r.scores[real].double()
        z.append((values - values.mean()) / values.std().clamp_min(1e-12))
    mean = torch.stack(z).mean(0)
    scores = torch.full((layout.n_forward, layout.n_backward), float("nan"))
    scores[real] = (mean - mean.min()).float()
    graph = Graph(layout, scores, meta=runs[0].graph.meta | {"restarts": len(runs)})
    together = "batched_runs" in runs[0].graph.meta  # trained in one loop: the runs share its wall time
    seconds = runs[0].seconds if together else round(sum(r.seconds for r in runs), 2)
    cpu_seconds = runs[0].cpu_seconds if together else round(sum(r.cpu_seconds for r in runs), 2)
    step_seconds = runs[0].step_seconds if together else [t for r in runs for t in r.step_seconds]
    return LearnedCircuit(graph, [x for r in runs for x in r.losses], [x for r in runs for x in r.faithfulness],
                          seconds, cpu_seconds, round(seconds / (cfg.steps * (1 if together else len(runs))), 3),
                          config=cfg, step_seconds=step_seconds, step_lengths=[x for r in runs for x in r.step_lengths])


def _prompts_per_chunk(model, batch: _Batch, samples: int, memory_mb: float) -> int:
    """Prompts per forward + backward of ``samples`` circuits within ``memory_mb`` (split q/k/v inputs, saved
    activations for the backward: about 3x a plain forward's live activations)."""
    cfg = model.cfg
    P = batch.group.tokens.shape[1] - batch.start
    split_factor = 3 * (12 + 6 * cfg.n_heads) / 12
    rows = forward.rows_per_chunk(model, memory_mb / split_factor, P, cached_pos=batch.start) // max(1, cfg.n_layers)
    return max(1, rows // samples)


def _check_denominator(batches: Sequence[_Batch]) -> None:
    full = torch.cat([b.full_metric for b in batches]).double().mean()
    empty = torch.cat([b.empty_metric for b in batches]).double().mean()
    if not torch.isfinite(full - empty) or abs(float(full - empty)) < 1e-6:
        raise InputError(f"The full model and the empty circuit score the same ({float(full):.4g} vs {float(empty):.4g} "
                         f"on the answer logit): the counterfactual twins do not change the answer, so no circuit "
                         f"can be learned. Check that the twins differ from the prompts where it matters.")
