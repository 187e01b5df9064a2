"""Argument checks shared by the merge configs: finite numbers, densities in (0, 1], λ_t >= 0, per-expert weights.

Every config dataclass calls :func:`check_config` from ``__post_init__``, so a
bad value fails when the config is built, with a message naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings
from collections.abc import Sequence

from circuits.errors import InputError

UNIT_FIELDS = ("density", "select_topk")  # must lie in (0, 1]
FRACTION_FIELDS = ("gamma", "common_space_fraction")  # must lie in [0, 1]


def _values(value) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _numeric(field: dataclasses.Field) -> bool:
    """A field whose default is a number (so a string there is a slip, e.g. ``"0.4"`` from a hand-written config)."""
    return isinstance(field.default, (int, float)) and not isinstance(field.default, bool)


def _not_a_number(value) -> str | None:
    """How to name ``value`` in a message if it is not a number (a string, a bool, None, ...); None if it is one."""
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, bool):  # True is an int to Python, but never a density, a λ or a k
        return f"{value!r}, a bool"
    if not isinstance(value, numbers.Real):
        return f"{value!r} (a {type(value).__name__})"
    return None


def check_config(config) -> None:
    """Raise :class:`InputError` for NaN/Inf numbers, non-numbers (strings, bools) in number fields, also inside
    per-expert tuples, and out-of-range densities or fractions."""
    name = type(config).__name__
    for field in dataclasses.fields(config):
        raw = getattr(config, field.name)
        if _numeric(field):
            many = isinstance(raw, (tuple, list))
            for i, v in enumerate(_values(raw)):
                what = _not_a_number(v)
                if what is not None:
                    where = f"{name}.{field.name}" + (f"[{i}]" if many else "")
                    raise InputError(f"{where} is {what}; give a number (e.g. {field.default!r}).")
        for v in _values(raw):
            if _not_a_number(v) is not None:
                continue  # a non-number field (a bool flag, a choice string)
            if not math.isfinite(v):
                shown = "lam" if field.name == "lam" else field.name
                raise InputError(f"{name}.{shown} is {v}; give a finite number.")
            if field.name in UNIT_FIELDS and not 0.0 < v <= 1.0:
                raise InputError(
                    f"{name}.{field.name}={v} is outside (0, 1]: it is the fraction of entries kept "
                    "(1 keeps everything)."
                )
            if field.name in FRACTION_FIELDS and not 0.0 <= v <= 1.0:
                raise InputError(f"{name}.{field.name}={v} is outside [0, 1].")
            if field.name == "epsilon" and v < 0:
                raise InputError(f"{name}.epsilon={v} is negative; DELLA's ε is a probability spread >= 0.")
            if field.name == "tall_lambda" and v < 0:
                raise InputError(f"{name}.tall_lambda={v} is negative; TALL's λ_t weighs |τ_MTL − τ_t| in the "
                                 "mask |τ_t| >= λ_t |τ_MTL − τ_t| and must be >= 0 (the paper's range is 0.2 to 0.6).")


class SurprisingValueWarning(UserWarning):
    """A value mergekit accepts and acts on, though it is rarely what a config means (kept, and said)."""


def warn_outside(config, field: str, low: float | None, high: float | None, effect: str) -> None:
    """Warn (:class:`SurprisingValueWarning`) when ``config.<field>`` lies outside ``[low, high]``: mergekit takes
    the value, and so does this package, with ``effect`` said instead of silently applied."""
    value = getattr(config, field)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{low:g}, {high:g}]" if low is not None and high is not None else \
            (f">= {low:g}" if low is not None else f"<= {high:g}")
        warnings.warn(f"{type(config).__name__}.{field}={value:g} is outside {bounds}: {effect} (as mergekit does).",
                      SurprisingValueWarning, stacklevel=4)


def check_choice(config, field: str, choices: Sequence[str]) -> None:
    """Raise :class:`InputError` unless ``config.<field>`` is one of ``choices``."""
    value = getattr(config, field)
    if value not in choices:
        raise InputError(f"{type(config).__name__}.{field} must be one of {tuple(choices)}, got {value!r}.")


def check_weights(weights: Sequence[float] | None, n_experts: int, *, normalized: bool = False) -> list[float]:
    """Per-expert weights (default 1) checked: one per expert, finite, and a sum away from 0 if ``normalized``."""
    if weights is None:
        return [1.0] * n_experts
    w = [float(x) for x in weights]
    if len(w) != n_experts:
        raise InputError(f"{len(w)} weights for {n_experts} experts: give one weight per expert.")
    bad = [x for x in w if not math.isfinite(x)]
    if bad:
        raise InputError(f"Merge weights must be finite numbers, got {w}.")
    if normalized and abs(sum(w)) < 1e-8:
        raise InputError(
            f"Merge weights {w} sum to ~0, and this method divides by their sum (normalize=True): "
            "use weights with a nonzero sum, or normalize=False."
        )
    return w


def check_no_weights(weights: Sequence[float] | None, method: str) -> None:
    """Refuse non-uniform per-expert weights for a method that has none (as in mergekit)."""
    if weights is not None and len({float(w) for w in weights}) > 1:
        raise InputError(f"{method} takes no per-expert weights (mergekit has none for it): drop `weights`.")
