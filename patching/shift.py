"""What tuning or merging did to a circuit: the reference circuit inside the changed model, and the changed
model's own circuit beside it.

For a reference model ``M0``, a changed model ``M1`` of the same architecture (fine-tuned, merged) and
a task's prompts, :func:`circuit_shift` reports

* **the reference circuit inside the changed model**: the top-n edges of ``M0``'s scores at each MIB
  size, evaluated on ``M1`` against ``M1``'s own full and empty runs (its faithfulness curve, CPR and
  CMD), beside the same circuits on ``M0`` (the reference curve);
* **the changed model's own circuit** (the same method and settings on ``M1``) and its overlap with
  ``M0``'s: the Jaccard index of the two top-n edge sets at each size, the Spearman correlation of all
  edge scores, which edges were kept, gained and lost at one chosen size, and which nodes gained and
  lost in-circuit edge mass (the |score| of their in-circuit edges, in and out);
* **the node level beside it**: both models' path-patching maps (every head and MLP to the answer
  logit) and their difference.

Intervals: every faithfulness point, CPR and CMD carries a 95% bootstrap interval over prompts
(:func:`patching.edges.faithfulness_curve`); the overlap measures depend on scores averaged over all
prompts, so their intervals come from ``n_resamples`` prompt resamples on which both models are
scored again (0 skips them: each resample costs two attribution passes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor
from transformer_lens import HookedTransformer

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import edge_jaccard, score_spearman, select_top_n
from circuits.stats import Estimate
from patching.edges.attribute import edge_attribution
from patching.edges.curves import MIB_FRACTIONS, FaithfulnessCurve, faithfulness_curve
from patching.sweeps.options import SweepOptions


@dataclass(frozen=True)
class ShiftSettings:
    """How :func:`circuit_shift` scores, compares and bootstraps."""

    method: str = "EAP-IG-inputs"
    ig_steps: int = 5
    fractions: tuple = MIB_FRACTIONS
    size: float = 0.05  # the circuit size at which edges and node masses are compared
    n_bootstrap: int = 1000
    n_resamples: int = 0  # prompt resamples for the overlap measures' intervals
    norm: str = "frozen"
    seed: int = 0
    #: the batching and memory budget of every sweep (no progress bars)
    sweep: SweepOptions = SweepOptions(batch_size=32, memory_mb=1024.0)

    def __post_init__(self) -> None:
        if self.size not in self.fractions:
            raise InputError(f"ShiftSettings.size={self.size} must be one of the fractions {self.fractions}.")
        if self.n_resamples == 1 or self.n_resamples < 0:
            raise InputError(f"ShiftSettings.n_resamples must be 0 (no intervals) or at least 2, got {self.n_resamples}.")

    def options(self) -> SweepOptions:
        """The batching and memory budget of every sweep, without progress bars, as :class:`patching.SweepOptions`."""
        return dataclasses.replace(self.sweep, progress=False)


@dataclass
class CircuitShift:
    """Everything :func:`circuit_shift` measured (module docstring); ``to_dict()`` is results.json's form."""

    settings: ShiftSettings
    reference_scores: Graph
    changed_scores: Graph
    reference_curve: FaithfulnessCurve  # M0's circuits on M0
    transferred_curve: FaithfulnessCurve  # M0's circuits on M1
    changed_curve: FaithfulnessCurve  # M1's circuits on M1
    jaccard: list[Estimate]  # per fraction
    spearman: Estimate
    edges: dict  # at settings.size: kept / gained / lost counts and the masks
    node_mass: list[dict]  # per node: in-circuit |score| mass in M0, in M1, and the change
    path_patching: Optional[dict] = None
    extra: dict = field(default_factory=dict)
    #: the changed model's path-patching map (``NodeScores``), to pass as the next shift's ``reference_map``
    changed_map: Optional[object] = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {
            "settings": dataclasses.asdict(self.settings),
            "reference_curve": self.reference_curve.to_dict(), "transferred_curve": self.transferred_curve.to_dict(),
            "changed_curve": self.changed_curve.to_dict(),
            "jaccard": {f"{100 * x:g}%": j.to_dict() for x, j in zip(self.settings.fractions, self.jaccard)},
            "spearman": self.spearman.to_dict(),
            "edges": {k: v for k, v in self.edges.items() if not isinstance(v, Tensor)},
            "node_mass": self.node_mass, "path_patching": self.path_patching, **self.extra,
        }

    def figures(self) -> dict:
        """The circuit at ``settings.size`` coloured kept / gained / lost, and the three curves."""
        from circuits.show.edge_figures import circuit_shift_figure, faithfulness_figure

        s = self.settings
        return {
            "circuit_shift": circuit_shift_figure(self.reference_scores.layout, self.edges["reference_mask"],
                                                  self.edges["changed_mask"],
                                                  title=f"The circuit at {100 * s.size:g}% of the edges: kept, gained, lost"),
            "shift_curves": faithfulness_figure([("reference circuit, reference model", self.reference_curve),
                                                 ("reference circuit, changed model", self.transferred_curve),
                                                 ("changed model's own circuit", self.changed_curve)],
                                                title="Faithfulness before and after"),
        }


def _check_same_graph(reference: HookedTransformer, changed: HookedTransformer) -> GraphLayout:
    a, b = GraphLayout.of(reference), GraphLayout.of(changed)
    if a != b or reference.cfg.d_model != changed.cfg.d_model:
        raise InputError(f"The two models have different graphs ({a}, d_model {reference.cfg.d_model} vs {b}, "
                         f"d_model {changed.cfg.d_model}): a circuit shift compares models of one architecture.")
    return a


def _top_masks(graph: Graph, fractions: Sequence[float]) -> list[Tensor]:
    return [select_top_n(graph, int(x * graph.n_edges), prune=False).in_graph for x in fractions]


def _node_mass(layout: GraphLayout, graph: Graph, mask: Tensor) -> Tensor:
    """Each forward node's in-circuit edge mass: |score| of its in-circuit edges out plus into its inputs."""
    weights = graph.scores.abs().nan_to_num(0.0) * mask
    out = weights.sum(1)
    owner = layout.receiver_owner()
    into = torch.zeros(layout.n_forward).index_add_(0, owner.clamp_min(0), weights.sum(0) * (owner >= 0))
    return out + into


def circuit_shift(reference: HookedTransformer, changed: HookedTransformer, prompts, settings: ShiftSettings = ShiftSettings(),
                  *, reference_scores: Optional[Graph] = None, changed_scores: Optional[Graph] = None,
                  path_patching: bool = True, reference_map=None) -> CircuitShift:
    """Compare the circuits of ``reference`` and ``changed`` on ``prompts`` (a Dataset; see the module docstring).

    ``reference_scores`` / ``changed_scores``: edge scores to use instead of scoring with ``settings.method``
    (e.g. a learned circuit's); ``path_patching``: add both node-level maps and their difference;
    ``reference_map``: the reference model's map on the same prompts (a chain of shifts passes the previous
    shift's ``changed_map``, so that no model is path-patched twice).
    """
    from circuits.stats import bootstrap

    layout = _check_same_graph(reference, changed)
    s = settings
    if reference_map is not None:  # before any scoring: a map of other prompts or another model is refused first
        _check_reference_map(reference_map, layout, len(prompts))

    def score(model, data):
        return edge_attribution(model, data, method=s.method, ig_steps=s.ig_steps, norm=s.norm, options=s.options())

    reference_scores = reference_scores or score(reference, prompts)
    changed_scores = changed_scores or score(changed, prompts)

    def curve(model, scores) -> FaithfulnessCurve:
        return faithfulness_curve(model, scores, prompts, fractions=s.fractions, norm=s.norm, n_bootstrap=s.n_bootstrap,
                                  seed=s.seed, options=s.options())

    reference_curve, transferred, own = curve(reference, reference_scores), curve(changed, reference_scores), \
        curve(changed, changed_scores)
    ref_masks, new_masks = _top_masks(reference_scores, s.fractions), _top_masks(changed_scores, s.fractions)
    jaccard_values = [edge_jaccard(a, b) for a, b in zip(ref_masks, new_masks)]
    spearman_value = score_spearman(reference_scores, changed_scores)
    if s.n_resamples:
        g = torch.Generator().manual_seed(s.seed)
        draws = []
        for _ in range(s.n_resamples):
            rows = torch.randint(len(prompts), (len(prompts),), generator=g).tolist()
            a, b = score(reference, prompts.select(rows)), score(changed, prompts.select(rows))
            draws.append([edge_jaccard(x, y) for x, y in zip(_top_masks(a, s.fractions), _top_masks(b, s.fractions))]
                         + [score_spearman(a, b)])
        draws = np.asarray(draws)
        low, high = np.nanpercentile(draws, 2.5, axis=0), np.nanpercentile(draws, 97.5, axis=0)
        kind = f"95% percentile over {s.n_resamples} prompt resamples"
        jaccard = [Estimate(v, float(lo), float(hi), len(prompts), kind) for v, lo, hi in zip(jaccard_values, low, high)]
        spearman = Estimate(spearman_value, float(low[-1]), float(high[-1]), len(prompts), kind)
    else:
        jaccard = [Estimate(v, float("nan"), float("nan"), len(prompts), "none") for v in jaccard_values]
        spearman = Estimate(spearman_value, float("nan"), float("nan"), len(prompts), "none")
    i = list(s.fractions).index(s.size)
    ref_mask, new_mask = ref_masks[i], new_masks[i]
    edges = {"size": s.size, "n_kept": int((ref_mask & new_mask).sum()), "n_gained": int((~ref_mask & new_mask).sum()),
             "n_lost": int((ref_mask & ~new_mask).sum()), "reference_mask": ref_mask, "changed_mask": new_mask}
    before, after = _node_mass(layout, reference_scores, ref_mask), _node_mass(layout, changed_scores, new_mask)
    node_mass = sorted(({"node": name, "reference": float(b), "changed": float(a), "change": float(a - b)}
                        for name, b, a in zip(layout.forward_names, before, after) if float(b) or float(a)),
                       key=lambda row: -abs(row["change"]))
    maps, changed_map = _path_patching_change(reference, changed, prompts, s, reference_map) if path_patching \
        else (None, None)
    return CircuitShift(s, reference_scores, changed_scores, reference_curve, transferred, own, jaccard, spearman,
                        edges, node_mass, maps, changed_map=changed_map)


def _check_reference_map(reference_map, layout: GraphLayout, n_prompts: int) -> None:
    heads, mlps = tuple(reference_map.heads.shape), tuple(reference_map.mlps.shape)
    if heads != (layout.n_layers, layout.n_heads) or mlps != (layout.n_layers,) or reference_map.n_prompts != n_prompts:
        raise InputError(f"reference_map holds {heads} heads and {mlps} MLPs over {reference_map.n_prompts} prompts; "
                         f"this shift has ({layout.n_layers}, {layout.n_heads}) heads and ({layout.n_layers},) MLPs "
                         f"over {n_prompts} prompts: pass the reference model's map on the same prompts.")


def _path_patching_change(reference, changed, prompts, s: ShiftSettings, reference_map=None) -> tuple[dict, object]:
    from patching.node_level.path_patching import path_patch

    # path patching keeps its own default memory budget: only the settings' batching applies
    options = SweepOptions(batch_size=s.sweep.batch_size, progress=False)
    a = reference_map if reference_map is not None else path_patch(reference, prompts, options=options)
    b = path_patch(changed, prompts, options=options)
    return ({"reference": a.to_dict(), "changed": b.to_dict(),
             "heads_change": (b.heads - a.heads).tolist(), "mlps_change": (b.mlps - a.mlps).tolist()}, b)
