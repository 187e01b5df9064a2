"""Argument checks shared by every entry point, so the same mistake gets the same clear message.

Each check raises `circuits.errors.InputError` (a ``ValueError``) that names the argument,
what it got and what it needs; it returns the value unchanged otherwise.
"""

from __future__ import annotations

import numbers

from circuits.errors import InputError


def positive_int(value, name: str, *, allow_none: bool = False) -> int | None:
    """``value`` is an int >= 1 (or None, when ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InputError(f"{name} must be an integer >= 1, got {value!r}.")
    return int(value)


def non_negative_int(value, name: str) -> int:
    """``value`` is an int >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise InputError(f"{name} must be an integer >= 0, got {value!r}.")
    return int(value)
