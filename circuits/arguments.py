"""Argument checks shared by every entry point, so the same mistake gets the same clear message.

Each check raises :class:`circuits.errors.InputError` (a ``ValueError``) that names the argument,
what it got and what it needs; it returns the value unchanged otherwise.

* :func:`check_positive_int`, :func:`check_nonnegative_int`: counts and sizes;
* :func:`check_finite_weights`: a model whose weights hold NaN or Inf;
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


def check_finite_weights(model) -> None:
    """Raise :class:`InputError` if any weight of ``model`` is NaN or Inf.

    TransformerLens turns NaN attention patterns into zeros, so a model with NaN weights gives finite,
    wrong results (a head whose W_Q is NaN has a patching effect of exactly 0; an accuracy of 0 looks like
    a model that cannot do the task). The check is one float64 sum per tensor, and it is skipped while no
    parameter has changed since the last passing check (torch counts every in-place change in a tensor's
    version).
    """
    import torch  # here, so that the argument checks load without torch

    params = list(model.named_parameters())
    versions = tuple((id(p), p._version) for _, p in params)
    if getattr(model, "_finite_weights_checked", None) == versions:
        return
    broken = [name for name, p in params if p.is_floating_point()
              and not torch.isfinite(p.detach().sum(dtype=torch.float64))]
    if broken:
        raise InputError(f"The model has NaN or Inf weights in {len(broken)} tensors ({', '.join(broken[:5])}): "
                         "every result computed with it would be meaningless. Reload the model or find the step that "
                         "produced them (a training run with a too large learning rate, a merge).")
    model._finite_weights_checked = versions
