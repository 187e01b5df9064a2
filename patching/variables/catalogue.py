"""The featurizers and the causal models by name, as records that import no torch.

The command line offers these names before torch loads (``python -m experiments.variables --help``), and the
report labels its tables with them, so they live here, in a module that imports only the standard library and
the argument checks of :mod:`circuits.arguments`, and every other place reads them from here: :func:`patching.variables.featurizers.fit_and_select` dispatches through a
record, ``experiments.variables`` builds its ``--featurizers`` and ``--task`` choices from :data:`FEATURIZERS`
and :data:`CAUSAL_MODELS`, and its report takes each featurizer's label.

A **featurizer** (what an interchange intervention swaps: the whole vector or a subspace,
:mod:`patching.variables.featurizers`) is one :class:`FeaturizerRecord`: its name, a short label, the paper,
what it needs, the class of its own settings, what it chooses on the validation pairs, and where its fit
function is, as a ``"module:function"`` text that is imported only when the featurizer is fitted. Every fit
function has one signature::

    fit(model, where, train, validation, test, settings, *, k=None) -> Fitted

``train``, ``validation`` and ``test`` are the pair batches of the three splits, ``settings`` an instance of the
record's settings class (None where it has none) and ``k`` a subspace size given by the caller (the null's
is the k its learned featurizer chose). A new featurizer is a module with its fit function and a record below;
the command line, the experiment and the report pick it up from the record.

Settings: each featurizer's own dataclass names only what it reads (DAS: the ks and its training; DBM: its
training, temperature and mask penalty; PCA: the ks; the null: its seed).
:class:`patching.variables.featurizers.DASSettings` holds all of them in one flat record, the one the
experiment builds from its flags; :meth:`FeaturizerRecord.settings_from` hands each featurizer its part.

A **causal model** (:mod:`patching.variables.causal_models`) is one :class:`CausalModelRecord`: its name and
the builder that makes it, with the builder's arguments; each builds the model
:func:`patching.variables.causal_models.causal_model` returns under the same name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from circuits.arguments import check_option, check_positive_int
from circuits.errors import InputError

# ---------------------------------------------------------------------------- what a featurizer needs

TRAINING_PAIRS = "training pairs"  # fitted on the training split (DAS and DBM learn from it, PCA reads its activations)
GRADIENTS = "gradients"  # backward passes through the model, its weights held fixed
GIVEN_K = "a given k"  # fitted at a size the caller gives rather than one it chooses
NEEDS = (TRAINING_PAIRS, GRADIENTS, GIVEN_K)

#: what a featurizer may choose on the validation pairs
CHOICES = ("k", "steps")


def resolve(reference: str) -> Any:
    """The object a ``"module:name"`` reference names, its module imported now."""
    module, _, name = reference.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except AttributeError:
        raise ImportError(f"{reference!r}: module {module} has no {name!r}; correct the reference in "
                          f"patching/variables/catalogue.py.") from None


def _check_reference(reference: str | Callable, owner: str) -> None:
    if callable(reference):
        return
    module, colon, name = reference.partition(":")
    if not (colon and module and name.isidentifier()):
        raise TypeError(f"{owner}: {reference!r} is not a 'module:function' reference.")


# ---------------------------------------------------------------------------- each featurizer's settings


@dataclass(frozen=True)
class RotationTraining:
    """How a learned rotation trains (DAS and DBM alike): ``steps`` optimiser steps, each on ``batch_size``
    training pairs at learning rate ``lr``; ``seed`` draws the initial rotation and the batches; ``progress``
    shows a tqdm bar with an ETA over the steps."""

    steps: int = 40
    batch_size: int = 16
    lr: float = 0.01
    seed: int = 0
    progress: bool = False

    def __post_init__(self) -> None:
        check_positive_int(self.steps, "steps")
        check_positive_int(self.batch_size, "batch_size")
        if not self.lr > 0:
            raise InputError(f"lr must be > 0, got lr={self.lr}: give a positive learning rate.")


def _check_ks(ks: tuple[int, ...]) -> None:
    if not ks:
        raise InputError("ks is empty: give at least one subspace size k to try.")
    for k in ks:
        check_positive_int(k, "each k of ks")


@dataclass(frozen=True)
class RotatedSubspaceSettings(RotationTraining):
    """DAS's settings: its training, the subspace sizes ``ks`` tried, and ``select_steps``, earlier step counts at
    which each k is also scored on the validation pairs, so that the number of steps is chosen with k from one
    training run per k (a snapshot of the rotation is kept at each)."""

    ks: tuple[int, ...] = (1, 4, 16, 64)
    select_steps: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_ks(self.ks)
        super().__post_init__()
        for count in self.select_steps:
            check_positive_int(count, "each count of select_steps")
            if count > self.steps:
                raise InputError(f"select_steps holds {count}, more than the {self.steps} training steps: give "
                                 f"step counts of at most steps={self.steps}.")


@dataclass(frozen=True)
class BoundlessMaskSettings(RotationTraining):
    """DBM's settings: its training, the mask's temperature annealed from ``temperature[0]`` to ``temperature[1]``
    over the steps, and ``mask_penalty * sum(m) / d`` added to the loss."""

    temperature: tuple[float, float] = (1.0, 0.01)
    mask_penalty: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.temperature) != 2 or not all(t > 0 for t in self.temperature):
            raise InputError(f"temperature must be two values > 0 (start, end), got {self.temperature}.")


@dataclass(frozen=True)
class PCASettings:
    """PCA's settings: the numbers ``ks`` of principal directions tried."""

    ks: tuple[int, ...] = RotatedSubspaceSettings.ks

    def __post_init__(self) -> None:
        _check_ks(self.ks)


@dataclass(frozen=True)
class RandomSubspaceSettings:
    """The null's settings: the ``seed`` that draws its random directions."""

    seed: int = RotationTraining.seed


# ---------------------------------------------------------------------------- the featurizers


@dataclass(frozen=True)
class FeaturizerRecord:
    """One featurizer: what the command line, the experiment, the report and the docs read about it.

    ``name``: the kind (``fit_and_select``'s argument, a ``--featurizers`` choice, the key in results.json);
    ``label``: a short name for tables and figure titles; ``description``: what it swaps; ``source``: the paper;
    ``fit``: its fit function (the signature of the module docstring) as ``"module:function"``, or the function
    itself (a test's stub); ``needs``: of :data:`NEEDS`; ``settings``: the dataclass of its own settings (None: it
    has none); ``chooses``: of :data:`CHOICES`, what it picks on the validation pairs; ``null_of``: for a null,
    the featurizer whose chosen k it is fitted at and which a verdict compares it with.
    """

    name: str
    label: str
    description: str
    source: str
    fit: str | Callable
    needs: tuple[str, ...] = ()
    settings: type | None = None
    chooses: tuple[str, ...] = ()
    null_of: str | None = None

    def __post_init__(self) -> None:
        _check_reference(self.fit, f"featurizer {self.name!r}")
        for what, given, allowed in (("needs", self.needs, NEEDS), ("chooses", self.chooses, CHOICES)):
            unknown = sorted(set(given) - set(allowed))
            if unknown:
                raise TypeError(f"featurizer {self.name!r}: {what} {unknown}, none of {allowed}.")

    def fit_function(self) -> Callable:
        """The fit function, its module imported now."""
        return self.fit if callable(self.fit) else resolve(self.fit)

    def settings_from(self, settings: Any) -> Any:
        """This featurizer's own settings out of ``settings``: ``settings`` itself if it is an instance of them, else
        each field of them read by name from ``settings`` (a :class:`~patching.variables.featurizers.DASSettings`)
        where it has one, the default where not; None for a featurizer without settings. A field named for this
        featurizer alone (``das_ks`` for DAS's ``ks``), where given (not None), wins over the shared one."""
        if self.settings is None:
            return None
        if isinstance(settings, self.settings):
            return settings
        values = {}
        for f in fields(self.settings):
            own = getattr(settings, f"{self.name}_{f.name}", None)
            if own is not None:
                values[f.name] = own
            elif hasattr(settings, f.name):
                values[f.name] = getattr(settings, f.name)
        return self.settings(**values)


_VARIABLES = "patching.variables.featurizers"

#: the featurizer every location runs, against which the others are read: the plain interchange
BASELINE = "full"

#: every featurizer by name
FEATURIZERS: dict[str, FeaturizerRecord] = {record.name: record for record in (
    FeaturizerRecord(BASELINE, "full vector", "the whole activation, from the source",
                     "Geiger et al. 2021, Causal Abstractions of Neural Networks (interchange interventions)",
                     f"{_VARIABLES}:fit_full"),
    FeaturizerRecord("das", "DAS", "the first k columns of a learned rotation",
                     "Geiger et al. 2024, distributed alignment search", f"{_VARIABLES}:fit_das",
                     needs=(TRAINING_PAIRS, GRADIENTS), settings=RotatedSubspaceSettings, chooses=("k", "steps")),
    FeaturizerRecord("dbm", "DBM", "a learned rotation under a learned mask over all its directions",
                     "Wu et al. 2023, boundless DAS", f"{_VARIABLES}:fit_dbm",
                     needs=(TRAINING_PAIRS, GRADIENTS), settings=BoundlessMaskSettings),
    FeaturizerRecord("pca", "PCA", "the top-k principal directions of the source activations",
                     "principal component analysis (as a featurizer: MIB, Mueller et al. 2025)",
                     f"{_VARIABLES}:fit_pca", needs=(TRAINING_PAIRS,), settings=PCASettings, chooses=("k",)),
    FeaturizerRecord("random", "random subspace (null)", "k random orthonormal directions",
                     "the null: a random subspace of the learned featurizer's k", f"{_VARIABLES}:fit_random",
                     needs=(GIVEN_K,), settings=RandomSubspaceSettings, null_of="das"),
)}


def featurizer(name: str) -> FeaturizerRecord:
    """The record of the featurizer ``name``; an :class:`~circuits.errors.InputError` naming the known ones if none."""
    check_option("featurizer kind", name, tuple(FEATURIZERS))
    return FEATURIZERS[name]


def null_pairs(featurizers: Mapping[str, FeaturizerRecord] | None = None,
               ) -> list[tuple[FeaturizerRecord, FeaturizerRecord]]:
    """``(featurizer, its null)`` for every null among ``featurizers`` (default :data:`FEATURIZERS`)."""
    featurizers = FEATURIZERS if featurizers is None else featurizers
    return [(featurizers[null.null_of], null) for null in featurizers.values()
            if null.null_of is not None and null.null_of in featurizers]


# ---------------------------------------------------------------------------- the causal models


@dataclass(frozen=True)
class CausalModelRecord:
    """One causal model: ``name`` (``--task``), ``builder`` (``"module:function"``) called with ``arguments``."""

    name: str
    builder: str
    arguments: tuple = ()

    def __post_init__(self) -> None:
        _check_reference(self.builder, f"causal model {self.name!r}")

    def build(self) -> Any:
        """The :class:`~patching.variables.causal_models.CausalModel`, its module imported now."""
        return resolve(self.builder)(*self.arguments)


_CAUSAL = "patching.variables.causal_models"

#: every causal model by name: the one-digit operations by symbol, and MIB's two-digit addition
CAUSAL_MODELS: dict[str, CausalModelRecord] = {record.name: record for record in (
    *(CausalModelRecord(op, f"{_CAUSAL}:one_digit_model", (op,)) for op in ("+", "-", "*", "/")),
    CausalModelRecord("two_digit_addition", f"{_CAUSAL}:two_digit_addition_model"),
)}


def causal_model_record(name: str) -> CausalModelRecord:
    """The record of the causal model ``name``; an :class:`~circuits.errors.InputError` naming the known ones if
    none."""
    check_option("causal model", name, tuple(CAUSAL_MODELS))
    return CAUSAL_MODELS[name]
