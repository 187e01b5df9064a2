"""Heuristic neurons (Nikankin et al. 2025): classify a neuron by its activation over the (a, b) grid.

A neuron at the answer position is read on every one-digit problem a + b, which gives
a grid ``A[a, b]``. Nikankin et al. find that most arithmetic neurons fire for a simple
set of problems: an operand in a range ("a in 3..5"), a result in a range ("a+b in
10..14"), a result pattern modulo some number ("a+b ≡ 0 mod 2"), identical operands
(a = b). We build every candidate pattern of each family as a 0/1 grid and score the
neuron against it by the absolute Pearson correlation (a neuron may also be *off* on
the pattern). The neuron takes the family of its best pattern when that correlation
reaches ``threshold``; otherwise it is ``other``.

Many candidate patterns means a random grid correlates with some of them by chance;
``threshold`` (0.7 by default) keeps that rare on a 10 x 10 grid (a unit test checks
that pure noise is ``other``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from jaxtyping import Float
from torch import Tensor

from circuits.errors import InputError

HEURISTIC_TYPES = ("operand_range", "result_range", "modulus", "identical_operands", "other")
MODULI = (2, 3, 4, 5, 10)

Pattern = tuple[str, Tensor]  # (description, 0/1 grid)


def _ranges(low: int, high: int, min_width: int = 1) -> Iterator[tuple[int, int]]:
    for lo in range(low, high + 1):
        for hi in range(lo + min_width - 1, high + 1):
            if (lo, hi) != (low, high):  # the full range is a constant grid
                yield lo, hi


def operand_range_patterns(a: Tensor, b: Tensor) -> Iterator[Pattern]:
    """"a in lo..hi" and "b in lo..hi" for every proper sub-range of the operand values."""
    for name, operand in (("a", a), ("b", b)):
        for lo, hi in _ranges(int(operand.min()), int(operand.max())):
            yield f"{name} in {lo}..{hi}", ((operand >= lo) & (operand <= hi)).double()


def result_range_patterns(a: Tensor, b: Tensor) -> Iterator[Pattern]:
    """"a+b in lo..hi" for every proper sub-range of the sums."""
    s = a + b
    for lo, hi in _ranges(int(s.min()), int(s.max())):
        yield f"a+b in {lo}..{hi}", ((s >= lo) & (s <= hi)).double()


def modulus_patterns(a: Tensor, b: Tensor) -> Iterator[Pattern]:
    """"x ≡ r mod T" for x in (a+b, a, b), T in :data:`MODULI` and every residue r."""
    for name, value in (("a+b", a + b), ("a", a), ("b", b)):
        for t in MODULI:
            for r in range(t):
                yield f"{name} ≡ {r} mod {t}", (value % t == r).double()


def identical_operand_patterns(a: Tensor, b: Tensor) -> Iterator[Pattern]:
    """The diagonal a = b."""
    yield "a = b", (a == b).double()


PATTERN_FAMILIES: dict[str, Callable[[Tensor, Tensor], Iterator[Pattern]]] = {
    "operand_range": operand_range_patterns,
    "result_range": result_range_patterns,
    "modulus": modulus_patterns,
    "identical_operands": identical_operand_patterns,
}


def _grid_coordinates(shape: tuple[int, int], operands: tuple[list[int], list[int]] | None) -> tuple[Tensor, Tensor]:
    a_values = torch.arange(shape[0]) if operands is None else torch.as_tensor(operands[0])
    b_values = torch.arange(shape[1]) if operands is None else torch.as_tensor(operands[1])
    return torch.meshgrid(a_values.double(), b_values.double(), indexing="ij")


def _correlations(grids: Tensor, patterns: Tensor) -> Tensor:
    """|Pearson correlation| between each grid and each pattern: [neurons, patterns]."""
    def standardise(x):
        x = x - x.mean(1, keepdim=True)
        return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return (standardise(grids) @ standardise(patterns).T).abs()


@dataclass(frozen=True)
class HeuristicLabel:
    """One neuron's best pattern, its family (or ``other``) and the correlation."""

    type: str
    pattern: str
    correlation: float


def classify_grids(grids: Float[Tensor, "neuron a b"], *, threshold: float = 0.7,
                   operands: tuple[list[int], list[int]] | None = None) -> list[HeuristicLabel]:
    """Classify each neuron's activation grid ``grids[i, a, b]`` into a heuristic type."""
    grids = torch.as_tensor(grids).to(torch.float64)
    if grids.ndim != 3 or grids.shape[1] < 2 or grids.shape[2] < 2:
        raise InputError(f"Expected grids[neuron, a, b] with at least 2 values of a and b, got {tuple(grids.shape)}.")
    if not 0 < threshold <= 1:
        raise InputError(f"threshold must lie in (0, 1], got {threshold}.")
    a, b = _grid_coordinates(grids.shape[1:], operands)
    names, families, columns = [], [], []
    for family, generate in PATTERN_FAMILIES.items():
        for name, pattern in generate(a, b):
            if pattern.std() > 0:
                names.append(name)
                families.append(family)
                columns.append(pattern.reshape(-1))
    corr = _correlations(grids.reshape(len(grids), -1), torch.stack(columns))
    corr = torch.nan_to_num(corr, nan=0.0)
    best, index = corr.max(1)
    labels = []
    for value, i in zip(best.tolist(), index.tolist()):
        kind = families[i] if value >= threshold else "other"
        labels.append(HeuristicLabel(kind, names[i], value))
    return labels


def census(labels: list[HeuristicLabel]) -> dict[str, dict]:
    """Count and fraction of each heuristic type (every type listed, zeros included)."""
    total = max(len(labels), 1)
    return {kind: {"count": sum(l.type == kind for l in labels),
                   "fraction": sum(l.type == kind for l in labels) / total} for kind in HEURISTIC_TYPES}
