"""What a mergekit YAML may say to a method, declared next to the method: its parameters and input rules.

mergekit keeps this knowledge on each method (its ``parameters()`` /
``tensor_parameters()`` and input contract); here each method module declares a
:class:`MergekitSpec` (a tuple of :class:`MergekitParameter` plus the rules
``needs_base``, ``takes_weights``, ``needs_weights``, ``unlisted_base_field``,
``optional_base_field``)
and its registry record (:class:`merging.methods.MergeMethod`) carries it, so
:func:`merging.load_mergekit_config` knows no method by name.

Defaults are not repeated here: a parameter's default is its config field's
default (mergekit 0.1.5's, tested equal in ``tests/merging/methods/test_mergekit_spec.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from circuits.errors import InputError

KINDS = (bool, int, float, str)


def read_value(value, kind: type, name: str, where: str):
    """A YAML value for a parameter of type ``kind`` (bool, int, float or str), checked; ``where`` starts the message.

    Lists and mappings (mergekit's gradients and filters) are refused; ints pass as
    floats and numeric strings are read as floats (as mergekit's validation does);
    a bool must be a YAML boolean, not a string such as ``'no'``.
    """
    if isinstance(value, (list, dict)):
        raise InputError(f"{where}: a list or mapping where one value belongs (gradients and filters are lists of "
                         "values or of {filter, value} entries, one level deep).")
    if kind is bool:
        if not isinstance(value, bool):
            raise InputError(f"{where} is {value!r} (a {type(value).__name__}): {name} takes true or false "
                             "(unquoted in YAML).")
        return value
    if kind is float:
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise InputError(f"{where} is {value!r} (a {type(value).__name__}): {name} takes a number.")
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        raise InputError(f"{where} is {value!r} (a {type(value).__name__}): {name} takes a whole number.")
    if not isinstance(value, str):
        raise InputError(f"{where} is {value!r} (a {type(value).__name__}): {name} takes a string.")
    return value


@dataclass(frozen=True)
class MergekitParameter:
    """One key a mergekit YAML may give a method: ``name`` (the YAML key) sets config field ``field``.

    ``field`` defaults to ``name`` (``lambda`` sets ``lam``); ``ignored=True``: accepted,
    checked, no effect (``int8_mask``: it only changes mergekit's mask dtype).
    ``kind`` (bool, int, float or str) is the type the value must have
    (:func:`read_value`). ``per_expert``: may also be given under a model's
    ``parameters`` (mergekit's per-model, NON_BASE, parameters): the config field
    gets one value per expert, a model's own value, else the global one, else
    the field's default. ``required``: a YAML must give it (mergekit has no
    default for it, e.g. slerp's ``t``); the config field's default then serves
    only calls from Python.
    """

    name: str
    field: str | None = None
    kind: type = float
    per_expert: bool = False
    ignored: bool = False
    required: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise TypeError(f"MergekitParameter {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}.")
        if self.ignored and self.field is not None:
            raise TypeError(f"MergekitParameter {self.name!r}: an ignored parameter sets no field.")
        if self.ignored and self.required:
            raise TypeError(f"MergekitParameter {self.name!r}: an ignored parameter cannot be required.")
        if not self.ignored and self.field is None:
            object.__setattr__(self, "field", self.name)

    def read(self, value, where: str):
        """``value`` checked and converted to ``kind`` (see :func:`read_value`)."""
        return read_value(value, self.kind, self.name, where)


INT8_MASK = MergekitParameter("int8_mask", kind=bool, ignored=True)  # accepted by every method, no effect


@dataclass(frozen=True)
class MergekitSpec:
    """How a mergekit YAML drives one method: the parameters it takes and its rules on the inputs.

    * ``parameters``: the keys accepted under the global ``parameters:`` (the
      ``per_expert`` ones also under each model's).
    * ``needs_base``: ``base_model`` is required; it is θ0 of the task vectors,
      not one of the merged inputs (a listed base is dropped from them). False:
      every listed model is an input, the base too when listed (mergekit's
      ``linear`` and ``karcher``).
    * ``unlisted_base_field``: with ``needs_base=False``, what a ``base_model``
      that is not among ``models`` means: ``None`` refuses it (list it, with its
      weight), a field name is a bool config field set True (the base becomes
      one more input: karcher's ``include_base``).
    * ``optional_base_field``: with ``needs_base=False``, a bool config field for
      mergekit's optional base: a ``base_model`` (listed or not) is the origin of
      the task vectors, not an input, and sets it True; without one it is False
      and every listed model is an input (nuslerp's and multislerp's ``use_base``).
    * ``takes_weights``: a per-model ``weight`` is accepted (default 1);
      ``needs_weights``: every model must give one (mergekit requires it).
    """

    parameters: tuple[MergekitParameter, ...]
    needs_base: bool = True
    unlisted_base_field: str | None = None
    optional_base_field: str | None = None
    takes_weights: bool = False
    needs_weights: bool = False

    def __post_init__(self):
        names = [p.name for p in self.parameters]
        if len(set(names)) != len(names) or "weight" in names:
            raise TypeError(f"MergekitSpec: parameter names must be unique and not 'weight' (a rule), got {names}.")
        if self.needs_weights and not self.takes_weights:
            raise TypeError("MergekitSpec: needs_weights=True needs takes_weights=True.")
        if self.unlisted_base_field is not None and self.needs_base:
            raise TypeError("MergekitSpec: unlisted_base_field applies only with needs_base=False.")
        if self.optional_base_field is not None and (self.needs_base or self.unlisted_base_field is not None):
            raise TypeError("MergekitSpec: optional_base_field applies only with needs_base=False and no "
                            "unlisted_base_field.")

    def parameter(self, name: str) -> MergekitParameter | None:
        """The declared parameter with YAML key ``name``, or None."""
        return next((p for p in self.parameters if p.name == name), None)

    def per_expert(self) -> tuple[MergekitParameter, ...]:
        """The parameters that may be given per model."""
        return tuple(p for p in self.parameters if p.per_expert)

    def ignored(self) -> set[str]:
        """YAML keys accepted with no effect (anywhere)."""
        return {p.name for p in self.parameters if p.ignored}

    def required(self) -> tuple[MergekitParameter, ...]:
        """The parameters a YAML must give."""
        return tuple(p for p in self.parameters if p.required)

    def fields(self) -> set[str]:
        """The config fields the declared parameters set (plus the base rules' fields)."""
        out = {p.field for p in self.parameters if not p.ignored}
        return out | {f for f in (self.unlisted_base_field, self.optional_base_field) if f}

    def accepted(self) -> list[str]:
        """Every YAML key of the method's parameters, ``weight`` included when it takes one, sorted."""
        return sorted({p.name for p in self.parameters} | ({"weight"} if self.takes_weights else set()))
