"""merging.methods.mergekit_spec: each registry record's mergekit declaration says what mergekit 0.1.5's
method says, and declares every field of the method's config."""

import dataclasses
import typing

import pytest

mk_registry = pytest.importorskip("mergekit.merge_methods.registry")


def _given(value_type):
    """The type of a value a YAML gives: ``float`` for mergekit's ``Optional[float]`` (passthrough's scale)."""
    if typing.get_origin(value_type) is typing.Union:
        (given,) = [a for a in typing.get_args(value_type) if a is not type(None)]
        return given
    return value_type


def test_declarations_match_mergekit():
    """Each record's mergekit_spec says what mergekit 0.1.5's method says: parameters, scope, type, default (or
    required), inputs (base required, optional or not used)."""
    from mergekit.merge_methods.base import BasePolicy, ParameterScope

    from merging.methods import REGISTRY

    for record in (r for r in REGISTRY.values() if r.mergekit is not None):
        spec, mk = record.mergekit_spec, mk_registry.get(record.mergekit).spec
        defaults = {f.name: f.default for f in dataclasses.fields(record.config)}
        assert spec.needs_base == (mk.contract.base == BasePolicy.REQUIRED), record.name
        assert (spec.optional_base_field is not None) == (mk.contract.base == BasePolicy.OPTIONAL), record.name
        for p in mk.parameters:
            if p.name == "weight":
                assert spec.takes_weights and spec.needs_weights == p.required, record.name
                continue
            ours = spec.parameter(p.name)
            assert ours is not None, f"{record.name}: mergekit's {p.name!r} is not declared"
            assert ours.per_expert == (p.scope != ParameterScope.SHARED), (record.name, p.name)
            assert ours.kind is _given(p.value_type), (record.name, p.name)
            assert ours.required == p.required, (record.name, p.name)
            if not ours.ignored and not p.required:
                assert defaults[ours.field] == p.default, (record.name, p.name)
        if not any(p.name == "weight" for p in mk.parameters):
            assert not spec.takes_weights, record.name


def test_every_config_field_is_declared():
    """A YAML can set every field of a method's config (mergekit's names, else ours), with the field's type (or
    None: mergekit's optional parameters, such as passthrough's scale)."""
    from merging.methods import REGISTRY

    for record in REGISTRY.values():
        if record.needs_data:
            assert record.mergekit_spec is None
            continue
        spec = record.mergekit_spec
        fields = {f.name: f.default for f in dataclasses.fields(record.config)}
        assert spec.fields() == set(fields), record.name
        for p in spec.parameters:
            if not p.ignored:
                default = fields[p.field]
                assert default is None or isinstance(default, p.kind) or (p.kind is float and isinstance(default, int)), (
                    record.name, p.name)
