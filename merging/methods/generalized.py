"""Generalized task arithmetic: task arithmetic, TIES, DARE, Breadcrumbs and DELLA as settings of one pipeline.

``θ = θ0 + λ · combine_{consensus, normalize}(w_i · sparsify(τ_i))`` with the steps of
:mod:`merging.primitives`. Each method is a config class with mergekit 0.1.5's
defaults for the method of the same name:

==================  ===================  =========  =========  =========
config              sparsify             consensus  normalize  rescale
==================  ===================  =========  =========  =========
task_arithmetic     none                 none       False      False
ties                magnitude            sum        True       False
dare_linear         random               none       False      True
dare_ties           random               sum        False      True
breadcrumbs         outlier (γ 0.01)     none       False      False
breadcrumbs_ties    outlier (γ 0.01)     sum        False      False
della               magnitude_sampled    sum        True       True
della_linear        magnitude_sampled    none       False      True
==================  ===================  =========  =========  =========

Parameters are mergekit's: ``density`` (fraction kept, default 1.0 = no
sparsification, as mergekit: give the paper's value, e.g. TIES 0.2, DARE 0.1,
Breadcrumbs 0.9, explicitly), ``gamma``, ``epsilon``, ``normalize``, ``rescale``
(L1-norm rescale, mergekit's meaning) and λ, spelled ``lam`` here because
``lambda`` is a Python keyword (``lambda`` in a mergekit YAML maps to it).
``density``, ``gamma`` and ``epsilon`` take one value or one per expert.
Ours only: ``rescale_norm="inverse_density"`` rescales survivors by
``1/keep probability`` (the DARE paper's ``1/(1 − p)``; DELLA's ``1/p_i``);
``consensus`` and ``sparsify`` can be changed on any config (e.g.
``TiesConfig(consensus="count")``); ``scope="model"`` (TIES) takes the top-k
over the whole model per expert, as FusionBench; ``seed`` drives the random
drops (:func:`merging.merge` seeds one generator per tensor from
``(seed, key)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from circuits.errors import InputError
from merging.methods.config_checks import check_choice, check_config, check_weights
from merging.methods.mergekit_spec import INT8_MASK, MergekitParameter, MergekitSpec
from merging.primitives import (
    CONSENSUS,
    RESCALE_NORMS,
    SPARSIFIERS,
    combine,
    kth_largest_magnitude,
    per_expert,
    sparsify,
    task_vectors,
    topk_mask,
)

PerExpert = float | tuple[float, ...]


@dataclass(frozen=True)
class TaskArithmeticConfig:
    """Task arithmetic (Ilharco et al., 2023): ``θ0 + λ Σ w_i τ_i`` (÷ ``Σ w_i`` with ``normalize``)."""

    lam: float = 1.0
    normalize: bool = False
    density: PerExpert = 1.0
    gamma: PerExpert = 0.01
    epsilon: PerExpert = 0.15
    rescale: bool = False
    rescale_norm: str = "l1"
    sparsify: str = "none"
    consensus: str = "none"
    scope: str = "tensor"
    seed: int = 0

    def __post_init__(self):
        check_config(self)
        check_choice(self, "sparsify", ("none", *SPARSIFIERS))
        check_choice(self, "consensus", CONSENSUS)
        check_choice(self, "rescale_norm", RESCALE_NORMS)
        check_choice(self, "scope", ("tensor", "model"))
        if self.scope == "model" and self.sparsify != "magnitude":
            raise InputError("scope='model' (one top-k over the whole model) is a magnitude trim: use sparsify='magnitude'.")


@dataclass(frozen=True)
class TiesConfig(TaskArithmeticConfig):
    """TIES (Yadav et al., 2023): magnitude trim to ``density``, sign election, disjoint mean."""

    normalize: bool = True
    sparsify: str = "magnitude"
    consensus: str = "sum"


@dataclass(frozen=True)
class DareLinearConfig(TaskArithmeticConfig):
    """DARE (Yu et al., 2024) + task arithmetic: keep each entry with probability ``density``, rescale."""

    rescale: bool = True
    sparsify: str = "random"


@dataclass(frozen=True)
class DareTiesConfig(DareLinearConfig):
    """DARE drops, then TIES' sign election (mergekit's ``dare_ties``; no normalization by default)."""

    consensus: str = "sum"


@dataclass(frozen=True)
class BreadcrumbsConfig(TaskArithmeticConfig):
    """Model Breadcrumbs (Davari & Belilovsky, 2024): drop the ``gamma`` largest and the smallest entries."""

    sparsify: str = "outlier"


@dataclass(frozen=True)
class BreadcrumbsTiesConfig(BreadcrumbsConfig):
    """Breadcrumbs with TIES' sign election."""

    consensus: str = "sum"


@dataclass(frozen=True)
class DellaConfig(TaskArithmeticConfig):
    """DELLA (Deep et al., 2024): MagPrune (keep probability by magnitude rank, ±``epsilon``), rescale, TIES."""

    normalize: bool = True
    rescale: bool = True
    sparsify: str = "magnitude_sampled"
    consensus: str = "sum"


@dataclass(frozen=True)
class DellaLinearConfig(DellaConfig):
    """DELLA's MagPrune with task arithmetic instead of sign election."""

    normalize: bool = False
    consensus: str = "none"


# The mergekit YAML of every method of the pipeline: mergekit's generalized task arithmetic
# parameters (per model: density, and gamma (Breadcrumbs) and epsilon (DELLA), taken by every
# config of the family here), a `weight` per model (required, as mergekit), the base as θ0.
GTA_MERGEKIT = MergekitSpec(
    parameters=(
        MergekitParameter("lambda", "lam"),
        MergekitParameter("normalize", kind=bool),
        MergekitParameter("rescale", kind=bool),
        MergekitParameter("density", per_expert=True),
        MergekitParameter("gamma", per_expert=True),
        MergekitParameter("epsilon", per_expert=True),
        INT8_MASK,
        # ours, not mergekit's
        MergekitParameter("rescale_norm", kind=str),
        MergekitParameter("sparsify", kind=str),
        MergekitParameter("consensus", kind=str),
        MergekitParameter("scope", kind=str),
        MergekitParameter("seed", kind=int),
    ),
    takes_weights=True,
    needs_weights=True,
)


def generalized_task_arithmetic(
    base: Tensor,
    experts: Sequence[Tensor],
    config: TaskArithmeticConfig = TaskArithmeticConfig(),
    *,
    weights: Sequence[float] | None = None,
    generator: torch.Generator | None = None,
    thresholds: Sequence[float] | None = None,
    **_: object,
) -> Tensor:
    """One tensor through the pipeline; ``thresholds`` (one per expert) switch the trim to whole-model top-k."""
    n = len(experts)
    w = check_weights(weights, n, normalized=config.normalize and config.consensus == "none")
    densities = per_expert(config.density, n, "density")
    gammas = per_expert(config.gamma, n, "gamma")
    epsilons = per_expert(config.epsilon, n, "epsilon")
    if config.scope == "model" and thresholds is None:
        raise InputError("scope='model' needs per-expert thresholds: use merging.merge or ties_thresholds.")
    deltas = []
    for i, tv in enumerate(task_vectors(base, experts)):
        if config.scope == "model":
            tv = tv * topk_mask(tv, 1.0, threshold=thresholds[i])
        else:
            tv = sparsify(tv, config.sparsify, densities[i], gamma=gammas[i], epsilon=epsilons[i],
                          rescale=config.rescale, rescale_norm=config.rescale_norm, generator=generator)
        deltas.append(tv)
    return combine(base, deltas, w, consensus=config.consensus, normalize=config.normalize, lam=config.lam)


def ties_thresholds(base, experts, keys: Sequence[str], density: PerExpert) -> list[float]:
    """Per-expert magnitude threshold keeping the top ``density`` of ``|τ_i|`` over all ``keys``.

    ``base`` and ``experts`` are :class:`merging.state_dicts.StateDictSource`.
    """
    out = []
    for e, d in zip(experts, per_expert(density, len(experts), "density")):
        flat = torch.cat([(e.get(k).float() - base.get(k).float()).abs().reshape(-1) for k in keys])
        out.append(kth_largest_magnitude(flat, d))
        del flat
    return out
