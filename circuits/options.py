"""String options, checked in one place.

A function that takes a string option declares its allowed values once, as a ``Literal`` type alias
(``Combine = Literal["per-op", "union", "sum"]``), and checks an argument with :func:`check_option`,
which reads the allowed values from the alias itself: the type checker and the run-time check cannot
disagree, and every bad value gets the same kind of message (what was given, what is allowed), raised
as :class:`circuits.errors.InputError`.
"""

from __future__ import annotations

from typing import Any, get_args

from circuits.errors import InputError


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
