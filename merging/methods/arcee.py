"""Arcee's selective merges in mergekit 0.1.5: Arcee Fusion, RAM and RAM+ (tensor-local).

Each decides, entry by entry, how much of the experts' task vectors ``τ_i = θ_i − θ0`` to keep:

* **Arcee Fusion** (mergekit's ``arcee_fusion``): the base and exactly one expert.
  Importance of an entry: ``|θ1 − θ0|`` times the KL divergence ``KL(softmax θ1 ‖ softmax θ0)``
  of its row (softmax along the tensor's last dimension, each distribution plus 1e-8).
  The expert's value is taken where the importance reaches ``median + 1.5 · (q3 − q1)``
  (a box-plot outlier bound over the tensor's importances); the base's elsewhere. The
  quartiles are order statistics at index ``⌊q · (n − 1)⌋``; above 1e6 entries they are
  taken on 1e6 entries drawn with replacement (mergekit draws from torch's global
  generator, ours from the per-tensor generator of ``seed``: the same draws for the
  same seed).
* **RAM** (mergekit's ``ram``, "Reinforced Agent Merging", arXiv 2601.13572): an entry
  is a contribution of expert ``i`` where ``|τ_i| > epsilon``; an entry only one expert
  contributes keeps that expert's value, one several contribute gets their mean.
* **RAM+ tensor-local** (``ramplus_tl``): RAM whose unique entries of expert ``i`` are
  scaled by ``λ_i = 1 + r · clamp(ρ_i, 0, alpha)``, ``ρ_i`` = the number of its shared
  contributions over the number of its unique ones (per tensor): an expert whose
  update overlaps others' gets its own entries reinforced.

The numerics follow mergekit 0.1.5's functions step for step, tested equal in float32 and float64. In bfloat16 and
float16 mergekit computes in the inputs' dtype; this package computes in float32 and rounds once, so Arcee
Fusion's mask is the float64 computation's where mergekit's flips entries (up to 2.6 on N(0, 1) tensors), and RAM
and RAM+ stay within two units in the last place of mergekit's result and one of the float64 result
(tests/merging/methods/test_arcee.py). The
row of Arcee Fusion's softmax is the tensor's last dimension in TransformerLens's
layout (mergekit's, on a Hugging Face checkpoint, is the input dimension of a linear
layer); the rest is elementwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from circuits.errors import InputError
from merging.methods.config_checks import check_config, check_no_weights, warn_outside
from merging.methods.mergekit_spec import MergekitParameter, MergekitSpec
from merging.primitives import task_vectors, work_dtype

QUANTILE_SAMPLE_SIZE = 1_000_000  # above this many entries Arcee Fusion's quartiles are taken on a sample
KL_EPS = 1e-8  # added to both softmaxes before the log (mergekit's)


@dataclass(frozen=True)
class ArceeFusionConfig:
    """``seed``: draws the sample of entries the quartiles are taken on (tensors above 1e6 entries only)."""

    seed: int = 0

    def __post_init__(self):
        check_config(self)


ARCEE_FUSION_MERGEKIT = MergekitSpec(parameters=(MergekitParameter("seed", kind=int),))


def fusion_importance(expert: Tensor, base: Tensor) -> Tensor:
    """``|θ1 − θ0|`` times the KL divergence of the rows' softmaxes (last dimension), per entry."""
    p = F.softmax(expert, dim=-1) + KL_EPS
    q = F.softmax(base, dim=-1) + KL_EPS
    return (expert - base).abs() * torch.sum(p * torch.log(p / q), dim=-1, keepdim=True)


def fusion_threshold(importance: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """``median + 1.5 · IQR`` of the importances, the quartiles at sorted index ``⌊q · (n − 1)⌋``."""
    flat = importance.reshape(-1)
    if flat.numel() > QUANTILE_SAMPLE_SIZE:  # drawn with replacement: bounded memory on huge tensors
        picks = torch.randint(flat.numel(), (QUANTILE_SAMPLE_SIZE,), generator=generator)
        flat = flat[picks.to(flat.device)]
    ordered = torch.sort(flat).values
    index = (torch.tensor([0.25, 0.5, 0.75]) * (ordered.numel() - 1)).long()
    q1, median, q3 = ordered[index.to(ordered.device)]
    return median + 1.5 * (q3 - q1)


def arcee_fusion(
    base: Tensor,
    experts: Sequence[Tensor],
    config: ArceeFusionConfig = ArceeFusionConfig(),
    *,
    weights: Sequence[float] | None = None,
    generator: torch.Generator | None = None,
    **_: object,
) -> Tensor:
    """Arcee Fusion on one tensor: the one expert's value where its importance is an outlier, the base's elsewhere."""
    check_no_weights(weights, "arcee_fusion")
    if len(experts) != 1:
        raise InputError(f"arcee_fusion merges the base with exactly one other model, got {len(experts)} experts: "
                         "merge two models at a time, or use ram / ramplus_tl for more.")
    dt = work_dtype(base)
    b, e = base.to(dt), experts[0].to(device=base.device, dtype=dt)
    importance = fusion_importance(e, b)
    mask = (importance >= fusion_threshold(importance, generator)).to(dt)
    return (b + (e - b) * mask).to(base.dtype)


@dataclass(frozen=True)
class RamConfig:
    """``epsilon``: a task-vector entry above this in magnitude is a contribution."""

    epsilon: float = 1e-5

    def __post_init__(self):
        check_config(self)
        if self.epsilon < 0:
            raise InputError(f"{type(self).__name__}.epsilon={self.epsilon} is negative; it is the magnitude above "
                             "which a task-vector entry counts as a contribution (mergekit's default 1e-5).")


@dataclass(frozen=True)
class RamPlusConfig(RamConfig):
    """``r``: the reinforcement rate; ``alpha``: the cap on the shared-to-unique ratio ρ; ``epsilon`` as RAM's."""

    r: float = 0.1
    alpha: float = 0.2

    def __post_init__(self):
        super().__post_init__()
        warn_outside(self, "alpha", 0.0, None, "clamp(ρ, 0, alpha) is then alpha for every entry, so all unique "
                                               "entries are scaled by 1 + r·alpha whatever their ratio ρ")


RAM_MERGEKIT = MergekitSpec(parameters=(MergekitParameter("epsilon"),))
RAMPLUS_MERGEKIT = MergekitSpec(parameters=(MergekitParameter("r"), MergekitParameter("alpha"),
                                            MergekitParameter("epsilon")))


def _ram(base: Tensor, experts: Sequence[Tensor], epsilon: float, weights, method: str,
         reinforce=None) -> Tensor:
    """RAM's merge of one tensor; ``reinforce(shared, unique)`` scales each expert's unique entries (RAM+)."""
    check_no_weights(weights, method)
    tvs = torch.stack(task_vectors(base, experts)).reshape(len(experts), -1)
    contributes = tvs.abs() > epsilon
    counts = contributes.sum(dim=0)
    shared, unique = counts > 1, counts == 1
    kept = tvs * contributes
    scale = 1.0 if reinforce is None else reinforce((contributes & shared).sum(dim=1),
                                                    (contributes & unique).sum(dim=1)).unsqueeze(-1)
    merged = (kept * unique * scale + kept * shared / counts.clamp(min=1)).sum(dim=0)
    return (base.to(merged.dtype) + merged.reshape(base.shape)).to(base.dtype)


def ram(base: Tensor, experts: Sequence[Tensor], config: RamConfig = RamConfig(), *,
        weights: Sequence[float] | None = None, **_: object) -> Tensor:
    """RAM on one tensor: a lone contribution kept whole, shared ones averaged over their contributors."""
    return _ram(base, experts, config.epsilon, weights, "ram")


def ramplus_tl(base: Tensor, experts: Sequence[Tensor], config: RamPlusConfig = RamPlusConfig(), *,
               weights: Sequence[float] | None = None, **_: object) -> Tensor:
    """RAM+ (tensor-local) on one tensor: RAM with each expert's unique entries × ``1 + r · clamp(ρ, 0, alpha)``."""
    def reinforce(shared: Tensor, unique: Tensor) -> Tensor:
        rho = shared / unique.clamp(min=config.epsilon)
        return 1 + config.r * rho.clamp(min=0, max=config.alpha)

    return _ram(base, experts, config.epsilon, weights, "ramplus_tl", reinforce)
