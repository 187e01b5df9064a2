"""Argument checks shared by every entry point, so the same mistake gets the same clear message.

Each check raises :class:`circuits.errors.InputError` (a ``ValueError``) that names the argument,
what it got and what it needs; it returns the value unchanged otherwise.

* :func:`check_positive_int`, :func:`check_nonnegative_int`: counts and sizes;
* :func:`check_option`: string options. A function that takes one declares its allowed values once,
  as a ``Literal`` type alias (``Combine = Literal["per-op", "union", "sum"]``); the check reads the
  allowed values from the alias itself, so the type checker and the run-time check cannot disagree.
"""

from __future__ import annotations

import numbers
from typing import Any, get_args

from circuits.errors import InputError


def check_positive_int(value, name: str, *, allow_none: bool = False) -> int | None:
    """``value`` is an int >= 1 (or None, when ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InputError(f"{name} must be an integer >= 1, got {value!r}.")
    return int(value)


def check_nonnegative_int(value, name: str) -> int:
    """``value`` is an int >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise InputError(f"{name} must be an integer >= 0, got {value!r}.")
    return int(value)


def allowed_values(option: Any) -> tuple:
    """The values a ``Literal`` alias (or a tuple / list of values) allows."""
    values = get_args(option) if get_args(option) else option
    if not isinstance(values, (tuple, list)):
        raise TypeError(f"{option!r} is neither a Literal alias nor a tuple of values")
    return tuple(values)


def check_option(name: str, value: Any, option: Any, *, where: str = "") -> Any:
    """``value`` if ``option`` (a ``Literal`` alias or a tuple) allows it; otherwise an ``InputError`` that lists the allowed values.

    ``where`` prefixes the message (e.g. ``"Layer 3: "``).
    """
    allowed = allowed_values(option)
    if value not in allowed:
        raise InputError(f"{where}Unknown {name} {value!r}: {name} must be one of {', '.join(map(repr, allowed))}.")
    return value
