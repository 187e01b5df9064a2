"""Featurizers: the subspace of a location that an interchange intervention swaps, learned or fixed.

Every featurizer swaps rows of one location's activation by the same rule: with an orthonormal basis
``Q`` (columns: directions) and a mask ``m`` over them,

    h' = h_base + ((h_src - h_base) Q * m) Q^T,

which, for ``Q`` a full rotation and ``m`` the first k ones, is the rotate-swap-rotate-back of DESIGN:
``h' = R^T [ (R h_src)_{1..k} ; (R h_base)_{k+1..} ]`` with ``R = Q^T``. The kinds, each a record of
:data:`patching.variables.catalogue.FEATURIZERS` that names its fit function here:

* ``"full"`` (:class:`FullVector`): the whole vector, the plain interchange;
* ``"das"`` (:class:`RotatedSubspace`, distributed alignment search, Geiger et al. 2024): the first k
  columns of a learned rotation, ``torch.nn.utils.parametrizations.orthogonal`` keeping them
  orthonormal. Only those k columns enter the swap, so only they are parametrised (a ``d x k`` matrix
  with orthonormal columns is exactly the first k columns of some rotation), which keeps training
  cheap at ``d_model = 640``;
* ``"dbm"`` (:class:`BoundlessMask`, boundless DAS, Wu et al. 2023): a full learned rotation and a
  learned mask ``m = sigmoid(logits / temperature)`` over all its directions, the temperature
  annealed during training and a small penalty on ``sum(m)``, so the size of the subspace is learned
  rather than chosen;
* ``"pca"``: the top-k principal directions of the location's activations over the training prompts;
* ``"random"`` (the null): k random orthonormal directions. A random k-subspace of a d-dimensional
  location moves only part of any variable's signal, so a variable found by DAS but not by a
  random subspace of the same k is a property of the learned directions, not of k.

DAS and DBM train with cross-entropy on the predicted (counterfactual) answer's tokens over the
training pairs (:func:`train_featurizer`); k is chosen on the validation pairs, and IIA reported on the
test pairs. Each kind has one fit function (:func:`fit_full`, :func:`fit_das`, :func:`fit_dbm`,
:func:`fit_pca`, :func:`fit_random`, one signature: the catalogue's docstring); :func:`fit_and_select`
finds the kind's record and calls it with the kind's own settings, taken from :class:`DASSettings`, every
setting in one record.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrizations
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer, TransformerLensKeyValueCacheEntry

from circuits.analyze.number_geometry import orthonormal_columns, pca_subspace
from circuits.arguments import check_positive_int
from circuits.errors import InputError
from circuits.stats import Estimate, items_to_resolve, resolvable_difference
from patching.sweeps.forward import frozen_weights, transposed_weight_storage
from patching.variables import catalogue
from patching.variables.catalogue import (
    BoundlessMaskSettings, PCASettings, RandomSubspaceSettings, RotatedSubspaceSettings, RotationTraining,
)
from patching.variables.interchange import (
    Location, PairBatch, interchange_accuracy, intervened_loss, location_width, prepare,
    source_activations,
)


@dataclass(frozen=True)
class DASSettings:
    """Every featurizer's settings in one record, the one the experiment builds from its flags.

    :func:`fit_and_select` hands each featurizer the fields of its own settings
    (:mod:`patching.variables.catalogue`), which also say what each field means and hold its default:
    ``ks``: the subspace sizes tried by DAS and PCA (those above the location's width are skipped), ``das_ks``
    DAS's own where given (:meth:`patching.variables.catalogue.FeaturizerRecord.settings_from`); ``steps``
    optimiser steps of ``batch_size`` training pairs at learning rate ``lr`` (DAS and DBM); ``select_steps``:
    earlier step counts at which DAS is also scored on the validation pairs (:class:`RotatedSubspaceSettings`);
    DBM anneals its temperature from ``temperature[0]`` to ``temperature[1]`` over all ``steps`` and adds
    ``mask_penalty * sum(m) / d`` to the loss (:class:`BoundlessMaskSettings`); ``seed`` draws the initial
    rotations, the training batches and the null's directions.
    """

    ks: tuple[int, ...] = RotatedSubspaceSettings.ks
    das_ks: tuple[int, ...] | None = None
    steps: int = RotationTraining.steps
    batch_size: int = RotationTraining.batch_size
    lr: float = RotationTraining.lr
    temperature: tuple[float, float] = BoundlessMaskSettings.temperature
    mask_penalty: float = BoundlessMaskSettings.mask_penalty
    seed: int = RotationTraining.seed
    select_steps: tuple[int, ...] = RotatedSubspaceSettings.select_steps
    progress: bool = RotationTraining.progress  # a tqdm bar with an ETA over each training run's steps

    def __post_init__(self) -> None:
        for record in catalogue.FEATURIZERS.values():  # each featurizer checks its own part
            record.settings_from(self)


def _orthogonal(layer: nn.Linear, seed: int) -> None:
    """Parametrise ``layer.weight`` as orthonormal rows, reproducibly.

    torch completes a ``k x d`` weight into the full rotation that training moves along with the
    global random generator; that completion shapes every later step, so it is drawn here from ``seed``
    and the caller's generator state is left as it was.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        parametrizations.orthogonal(layer)


class Featurizer(nn.Module):
    """The swap rule of the module docstring; subclasses say what ``basis()`` and ``mask()`` are."""

    kind = "featurizer"

    def basis(self) -> Tensor:
        raise NotImplementedError

    def mask(self) -> Tensor:
        return torch.ones(self.basis().shape[1], device=self.basis().device)

    @property
    def k(self) -> float:
        """The size of the swapped subspace (for DBM: how many mask entries exceed 1/2)."""
        return float(self.mask().sum())

    def forward(self, base: Tensor, source: Tensor) -> Tensor:
        q = self.basis()
        delta = (source - base).to(q.dtype)
        return base + (((delta @ q) * self.mask().to(q.dtype)) @ q.T).to(base.dtype)


def _check_k(k: int, width: int) -> int:
    check_positive_int(k, "k")
    if k > width:
        raise InputError(f"k = {k} is larger than the {width} dimensions of the location's activation: choose "
                         f"k in 1..{width}.")
    return k


class FullVector(Featurizer):
    """The whole activation from the source."""

    kind = "full"

    def __init__(self, width: int):
        super().__init__()
        self.width = width

    @property
    def k(self) -> float:
        return float(self.width)

    def forward(self, base: Tensor, source: Tensor) -> Tensor:
        return source


class FixedSubspace(Featurizer):
    """A fixed orthonormal basis (``pca`` or ``random``)."""

    def __init__(self, basis: Tensor, kind: str):
        super().__init__()
        self.register_buffer("q", basis.detach().float())
        self.kind = kind

    def basis(self) -> Tensor:
        return self.q


class RotatedSubspace(Featurizer):
    """DAS: the first k columns of a learned rotation of a ``width``-dimensional activation."""

    kind = "das"

    def __init__(self, width: int, k: int, *, seed: int = 0):
        super().__init__()
        _check_k(k, width)
        generator = torch.Generator().manual_seed(seed)
        self.rotation = nn.Linear(width, k, bias=False)  # weight [k, width]: its rows are the directions
        with torch.no_grad():
            self.rotation.weight.copy_(torch.randn(k, width, generator=generator))
        _orthogonal(self.rotation, seed)

    def basis(self) -> Tensor:
        return self.rotation.weight.T


class BoundlessMask(Featurizer):
    """DBM: a learned full rotation and a learned sigmoid mask over its directions (temperature set by training)."""

    kind = "dbm"

    def __init__(self, width: int, *, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.rotation = nn.Linear(width, width, bias=False)
        with torch.no_grad():
            self.rotation.weight.copy_(torch.randn(width, width, generator=generator))
        _orthogonal(self.rotation, seed)
        self.logits = nn.Parameter(torch.zeros(width))
        self.temperature = 1.0

    def basis(self) -> Tensor:
        return self.rotation.weight.T

    def mask(self) -> Tensor:
        return torch.sigmoid(self.logits / self.temperature)

    @property
    def k(self) -> float:
        return float((self.mask() > 0.5).sum())


def random_subspace(width: int, k: int, *, seed: int = 0) -> FixedSubspace:
    """``k`` random orthonormal directions (the null)."""
    _check_k(k, width)
    generator = torch.Generator().manual_seed(seed)
    return FixedSubspace(orthonormal_columns(torch.randn(width, k, generator=generator, dtype=torch.float64)), "random")


def pca_directions(activations: Tensor, k: int) -> FixedSubspace:
    """The top-``k`` principal directions of ``activations`` [n, width]."""
    _check_k(k, activations.shape[1])
    if k > activations.shape[0]:
        raise InputError(f"k = {k} principal directions need at least {k} activations, got {activations.shape[0]}.")
    return FixedSubspace(pca_subspace(activations.double(), k), "pca")


def train_featurizer(model: HookedTransformer, featurizer: Featurizer, batches: Sequence[PairBatch], where: Location,
                     settings: DASSettings | RotationTraining = DASSettings(),
                     on_checkpoint: Callable[[int, list[float]], None] | None = None) -> list[float]:
    """Fit a DAS or DBM featurizer on the training ``batches`` (cross-entropy on the predicted answer); the losses.

    Each step draws ``settings.batch_size`` pairs of one batch; the model's weights stay fixed.
    ``on_checkpoint(n, losses)`` is called after ``n`` steps for every ``n`` of ``settings.select_steps``
    and after the last step, with the featurizer as it is then and the ``n`` losses so far. ``settings``:
    a :class:`DASSettings`, or the featurizer's own (:class:`RotatedSubspaceSettings` for DAS,
    :class:`BoundlessMaskSettings` for DBM, whose ``temperature`` and ``mask_penalty`` only DBM reads).
    """
    if not batches:
        raise InputError("No training pairs: train_featurizer needs at least one batch of pairs.")
    prepared = [prepare(model, batch, [where]) for batch in batches]
    generator = torch.Generator().manual_seed(settings.seed)
    optimizer = torch.optim.Adam(featurizer.parameters(), lr=settings.lr)
    sizes = torch.tensor([len(b) for b in batches], dtype=torch.float)
    losses = []
    with frozen_weights(model), transposed_weight_storage(model), torch.enable_grad():  # no per-call weight copies
        for step in tqdm(range(settings.steps), desc=f"{featurizer.kind} k={featurizer.k:g} at {where.hook}",
                         disable=not settings.progress, leave=False):
            if isinstance(featurizer, BoundlessMask):  # geometric annealing from t_start to t_end
                t_start, t_end = settings.temperature
                featurizer.temperature = t_start * (t_end / t_start) ** (step / max(1, settings.steps - 1))
            chosen = prepared[int(torch.multinomial(sizes, 1, generator=generator))]
            rows = torch.randperm(len(chosen.batch), generator=generator)[:settings.batch_size]
            loss = intervened_loss(model, _rows(chosen, rows), where, featurizer)
            if isinstance(featurizer, BoundlessMask):
                loss = loss + settings.mask_penalty * featurizer.mask().sum() / featurizer.mask().numel()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            if on_checkpoint is not None and (step + 1 in settings.select_steps or step + 1 == settings.steps):
                with torch.no_grad():
                    on_checkpoint(step + 1, losses)
    return losses


def _rows(prepared, rows: Tensor):
    """The prepared batch restricted to ``rows`` (prefix keys/values, starts and sources sliced alike)."""
    batch = prepared.batch
    device = batch.base.device
    rows = rows.to(device)
    sub = PairBatch(batch.base[rows], batch.source[rows], batch.targets[rows], batch.prompt_length)
    kv = [TransformerLensKeyValueCacheEntry(e.past_keys[rows], e.past_values[rows]) for e in prepared.base_kv]
    return type(prepared)(sub, prepared.prefix, kv, {l: s[rows] for l, s in prepared.starts.items()},
                          {w: s[rows] for w, s in prepared.sources.items()})


@dataclass
class Fitted:
    """One featurizer kind fitted at one location: its k, validation and test IIA, and the featurizer."""

    kind: str
    k: float
    validation: Estimate | None
    test: Estimate
    featurizer: Featurizer
    losses: list[float]
    steps: int | None = None  # training steps of the kept featurizer (DAS, DBM)
    test_hits: Tensor | None = field(default=None, repr=False)  # per test pair, in the batches' order

    def to_dict(self) -> dict:
        return {"kind": self.kind, "k": self.k, "steps": self.steps, "test": self.test.to_dict(),
                "validation": None if self.validation is None else self.validation.to_dict(),
                "final_loss": self.losses[-1] if self.losses else None}


def fit_and_select(model: HookedTransformer, kind: str, where: Location, train: Sequence[PairBatch],
                   validation: Sequence[PairBatch], test: Sequence[PairBatch], settings: DASSettings = DASSettings(),
                   *, k: int | None = None) -> Fitted:
    """Fit a featurizer of ``kind`` at ``where`` and report its test IIA.

    ``kind`` names a record of :data:`patching.variables.catalogue.FEATURIZERS`, whose fit function is called
    with the kind's own settings out of ``settings`` (a :class:`DASSettings`, or the kind's own settings
    object). ``"das"`` and ``"pca"`` try every k of ``settings.ks`` (up to the location's width) and keep the best
    on ``validation`` (ties: the smaller k; for DAS, each k also at every step count of ``settings.select_steps``
    and ``settings.steps``, ties: the fewer steps); ``"random"`` takes the given ``k`` (the k DAS chose, for
    the null); ``"dbm"`` learns its own size; ``"full"`` needs nothing.
    """
    record = catalogue.featurizer(kind)
    return record.fit_function()(model, where, train, validation, test, record.settings_from(settings), k=k)


def fit_full(model: HookedTransformer, where: Location, train: Sequence[PairBatch], validation: Sequence[PairBatch],
             test: Sequence[PairBatch], settings: None = None, *, k: int | None = None) -> Fitted:
    """The whole vector: its test IIA (nothing to fit; ``train``, ``validation``, ``settings`` and ``k`` unused)."""
    width = location_width(model, where)
    test_iia, hits = interchange_accuracy(model, test, where, FullVector(width))
    return Fitted("full", float(width), None, test_iia, FullVector(width), [], test_hits=hits)


def fit_random(model: HookedTransformer, where: Location, train: Sequence[PairBatch], validation: Sequence[PairBatch],
               test: Sequence[PairBatch], settings: RandomSubspaceSettings = RandomSubspaceSettings(), *,
               k: int | None = None) -> Fitted:
    """The null: ``k`` random orthonormal directions (the k DAS chose), drawn from ``settings.seed``; its test IIA."""
    width = location_width(model, where)
    if k is None:
        raise InputError("The random-subspace null needs k: pass the k chosen for DAS (k=...).")
    featurizer = random_subspace(width, k, seed=settings.seed)
    test_iia, hits = interchange_accuracy(model, test, where, featurizer)
    return Fitted("random", float(k), None, test_iia, featurizer, [], test_hits=hits)


def fit_dbm(model: HookedTransformer, where: Location, train: Sequence[PairBatch], validation: Sequence[PairBatch],
            test: Sequence[PairBatch], settings: BoundlessMaskSettings = BoundlessMaskSettings(), *,
            k: int | None = None) -> Fitted:
    """DBM trained for ``settings.steps`` on ``train``; it learns its own size (``k`` unused)."""
    width = location_width(model, where)
    featurizer = BoundlessMask(width, seed=settings.seed)
    losses = train_featurizer(model, featurizer, train, where, settings)
    test_iia, hits = interchange_accuracy(model, test, where, featurizer)
    return Fitted("dbm", featurizer.k, interchange_accuracy(model, validation, where, featurizer)[0],
                  test_iia, featurizer, losses, settings.steps, test_hits=hits)


def fit_pca(model: HookedTransformer, where: Location, train: Sequence[PairBatch], validation: Sequence[PairBatch],
            test: Sequence[PairBatch], settings: PCASettings = PCASettings(), *, k: int | None = None) -> Fitted:
    """The top principal directions of the training pairs' source activations, their number the best of
    ``settings.ks`` on ``validation`` (or the given ``k``)."""
    ks = _sizes_to_try(settings.ks, k, location_width(model, where), where)
    activations = source_activations(model, train, where)
    # k principal directions need k activations
    ks = [size for size in ks if size <= activations.shape[0]] or [activations.shape[0]]
    best = _BestOnValidation(model, "pca", where, validation)
    for size in ks:
        best.offer(pca_directions(activations, size), [], None)
    return best.tested_on(test)


def fit_das(model: HookedTransformer, where: Location, train: Sequence[PairBatch], validation: Sequence[PairBatch],
            test: Sequence[PairBatch], settings: RotatedSubspaceSettings = RotatedSubspaceSettings(), *,
            k: int | None = None) -> Fitted:
    """DAS: one training run per k of ``settings.ks`` (or the given ``k``), scored on ``validation`` after every
    count of ``settings.select_steps`` and after the last step; the best (k, steps) kept."""
    width = location_width(model, where)
    ks = _sizes_to_try(settings.ks, k, width, where)
    best = _BestOnValidation(model, "das", where, validation)
    for size in ks:
        featurizer = RotatedSubspace(width, size, seed=settings.seed)
        train_featurizer(model, featurizer, train, where, settings,
                         on_checkpoint=lambda n, losses, current=featurizer: best.offer(current, losses, n))
    return best.tested_on(test)


def _sizes_to_try(ks: tuple[int, ...], k: int | None, width: int, where: Location) -> list[int]:
    """The given ``k``, else the sizes of ``ks`` that fit the location's ``width``."""
    sizes = [k] if k is not None else [size for size in ks if size <= width]
    if not sizes:
        raise InputError(f"Every k of {ks} is larger than the {width} dimensions at {where}: give smaller ks.")
    return sizes


class _BestOnValidation:
    """The featurizer with the best validation IIA of those offered, a copy kept; ties keep the first offered (the
    smaller k, the fewer steps)."""

    def __init__(self, model: HookedTransformer, kind: str, where: Location, validation: Sequence[PairBatch]):
        self.model, self.kind, self.where, self.validation = model, kind, where, validation
        self.best: Fitted | None = None

    def offer(self, featurizer: Featurizer, losses: list[float], steps: int | None) -> None:
        score = interchange_accuracy(self.model, self.validation, self.where, featurizer)[0]
        if self.best is None or score.value > self.best.validation.value:
            self.best = Fitted(self.kind, featurizer.k, score, score, copy.deepcopy(featurizer), list(losses), steps)

    def tested_on(self, test: Sequence[PairBatch]) -> Fitted:
        """The best, its test IIA and per-pair hits measured on ``test``."""
        self.best.test, self.best.test_hits = interchange_accuracy(self.model, test, self.where, self.best.featurizer)
        return self.best


#: the excess over the random-subspace null that a test must be able to resolve before "not held" is a verdict: a
#: variable whose subspace carries it at the null's IIA + 0.2 or more would have shown
DECISIVE_DIFFERENCE = 0.2


def verdict(best: Estimate, null: Estimate, full: Estimate, *, test_share: float | None = None) -> str:
    """One line on a variable's best location: held (DAS's test interval above the random-subspace null's), not held
    (below it, or overlapping it on enough test pairs to resolve :data:`DECISIVE_DIFFERENCE`), or inconclusive (too
    few test pairs to tell: the line says how many would, as ``--n-pairs`` when ``test_share``, the test fraction of
    the pairs, is given); and how close DAS comes to the full vector."""
    if math.isnan(best.value):
        return "not measured"
    if best.low > null.high:
        found = "held: DAS's subspace beats the random subspace of the same k (intervals apart)"
    elif best.high < null.low:
        found = "not held: the random subspace does better than DAS (intervals apart)"
    else:
        power = resolvable_difference(best.n, min(max(null.value, 0.0), 1.0))
        if power <= DECISIVE_DIFFERENCE:
            found = (f"not held: DAS's interval overlaps the random-subspace null, on {best.n} test pairs that resolve "
                     f"{power:.2f} above it")
        else:
            found = f"inconclusive: {best.n} test pairs resolve only {_resolution(power)} above the null"
            needed = items_to_resolve(DECISIVE_DIFFERENCE, min(max(null.value, 0.0), 1.0))
            if needed is not None:
                found += (f"; run with --n-pairs {math.ceil(needed / test_share)} ({needed} test pairs resolve "
                          f"{DECISIVE_DIFFERENCE})" if test_share else f"; {needed} test pairs would resolve "
                          f"{DECISIVE_DIFFERENCE}")
    ratio = best.value / full.value if full.value > 0 else float("nan")
    return f"{found}; DAS reaches {ratio:.0%} of the full vector's IIA" if not math.isnan(ratio) else found


def _resolution(power: float) -> str:
    return "nothing" if math.isinf(power) else f"differences of {power:.2f}"
