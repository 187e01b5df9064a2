"""patching.variables.catalogue: one record per featurizer and per causal model, readable without torch, each
reference resolving to what it names."""

from __future__ import annotations

import dataclasses

import pytest

from circuits.errors import InputError
from patching.variables import catalogue
from patching.variables.catalogue import (
    BASELINE, CAUSAL_MODELS, FEATURIZERS, NEEDS, BoundlessMaskSettings, FeaturizerRecord, PCASettings,
    RandomSubspaceSettings, RotatedSubspaceSettings,
)


def test_every_featurizer_is_one_record_under_its_name_with_a_fit_function():
    assert tuple(FEATURIZERS) == (BASELINE, "das", "dbm", "pca", "random")
    for name, record in FEATURIZERS.items():
        assert record.name == name and record.label and record.source and set(record.needs) <= set(NEEDS)
        assert callable(record.fit_function())  # the lazy reference resolves
        assert record.settings is None or dataclasses.is_dataclass(record.settings)
    assert [(tested.name, null.name) for tested, null in catalogue.null_pairs()] == [("das", "random")]
    assert [n for n, r in FEATURIZERS.items() if catalogue.GRADIENTS in r.needs] == ["das", "dbm"]


def test_each_featurizer_gets_its_own_settings_out_of_the_one_record():
    from patching.variables.featurizers import DASSettings

    every = DASSettings(ks=(2, 8), steps=9, select_steps=(3,), batch_size=4, lr=0.1, temperature=(2.0, 0.5),
                        mask_penalty=0.2, seed=7)
    assert FEATURIZERS["das"].settings_from(every) == RotatedSubspaceSettings(
        steps=9, batch_size=4, lr=0.1, seed=7, ks=(2, 8), select_steps=(3,))
    assert FEATURIZERS["dbm"].settings_from(every) == BoundlessMaskSettings(
        steps=9, batch_size=4, lr=0.1, seed=7, temperature=(2.0, 0.5), mask_penalty=0.2)
    assert FEATURIZERS["pca"].settings_from(every) == PCASettings(ks=(2, 8))
    assert FEATURIZERS["random"].settings_from(every) == RandomSubspaceSettings(seed=7)
    assert FEATURIZERS[BASELINE].settings_from(every) is None
    own = PCASettings(ks=(3,))
    assert FEATURIZERS["pca"].settings_from(own) is own
    # a field named for one featurizer (das_ks) is that featurizer's alone; the others keep the shared ks
    split = DASSettings(ks=(2, 8), das_ks=(4,))
    assert FEATURIZERS["das"].settings_from(split).ks == (4,)
    assert FEATURIZERS["pca"].settings_from(split).ks == (2, 8)
    # the one record's defaults are each featurizer's own
    for record in FEATURIZERS.values():
        if record.settings is not None:
            assert record.settings_from(DASSettings()) == record.settings()


def test_bad_settings_are_refused_by_the_featurizer_they_belong_to():
    from patching.variables.featurizers import DASSettings

    with pytest.raises(InputError, match=r"ks is empty: give at least one subspace size k to try"):
        PCASettings(ks=())
    with pytest.raises(InputError, match=r"temperature must be two values > 0 \(start, end\), got \(1.0, 0.0\)"):
        BoundlessMaskSettings(temperature=(1.0, 0.0))
    with pytest.raises(InputError, match=r"lr must be > 0, got lr=0"):
        DASSettings(lr=0)  # the one record is checked by every featurizer's own settings


def test_unknown_names_are_refused_with_the_known_ones_listed():
    with pytest.raises(InputError, match=r"Unknown featurizer kind 'svd': featurizer kind must be one of 'full', "
                                         r"'das', 'dbm', 'pca', 'random'"):
        catalogue.featurizer("svd")
    with pytest.raises(InputError, match=r"Unknown causal model 'x': causal model must be one of '\+', '-'"):
        catalogue.causal_model_record("x")


def test_a_record_with_an_unknown_need_or_a_bad_reference_is_refused():
    with pytest.raises(TypeError, match=r"needs \['a GPU'\], none of"):
        FeaturizerRecord("new", "new", "what it swaps", "a paper", "patching.variables.new:fit", needs=("a GPU",))
    with pytest.raises(TypeError, match=r"is not a 'module:function' reference"):
        FeaturizerRecord("new", "new", "what it swaps", "a paper", "patching.variables.new.fit")
    with pytest.raises(ImportError, match=r"module patching.variables.featurizers has no 'fit_svd'"):
        FeaturizerRecord("new", "new", "what it swaps", "a paper",
                         "patching.variables.featurizers:fit_svd").fit_function()


def test_every_causal_model_record_builds_the_model_registered_under_its_name():
    from patching.variables.causal_models import CAUSAL_MODELS as BUILDERS

    assert set(CAUSAL_MODELS) == set(BUILDERS)
    for name, record in CAUSAL_MODELS.items():
        built, registered = record.build(), BUILDERS[name]()
        assert (built.name, built.tested, built.description) == (registered.name, registered.tested,
                                                                registered.description)
