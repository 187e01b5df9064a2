"""Featurizers: DAS and DBM learn, k is chosen on the validation pairs, PCA and the null are what they say."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from patching.variables.causal_models import causal_model, interchange_pairs, split_pairs, task_config
from circuits.errors import InputError
from circuits.stats import Estimate
from circuits.tasks import make_dataset
from patching.variables.featurizers import (
    BoundlessMask, DASSettings, RotatedSubspace, fit_and_select, pca_directions, train_featurizer, verdict,
)
from patching.variables.interchange import interchange_accuracy, location, pair_batches
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def split():
    torch.manual_seed(0)
    model = tiny_model(style="gemma", n_layers=2)
    causal = causal_model("+")
    data = make_dataset(model, task_config(causal, n_prompts=40, n_shots=1, seed=5))
    pairs = interchange_pairs(causal, data, [True] * len(data), "result", model, n_pairs=40)
    parts = split_pairs(pairs, (0.5, 0.25, 0.25))
    batches = [pair_batches(model, data, part, scoring="first", batch_size=16) for part in parts]
    return model, batches, location("resid_post", 0, batches[0][0].prompt_length - 1)


def test_das_training_lowers_the_loss_and_keeps_the_directions_orthonormal(split):
    model, (train, _, _), where = split
    das = RotatedSubspace(model.cfg.d_model, 4, seed=1)
    losses = train_featurizer(model, das, train, where, DASSettings(steps=30, batch_size=8, lr=0.05))
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    q = das.basis().detach()
    torch.testing.assert_close(q.T @ q, torch.eye(4), atol=1e-5, rtol=0)
    assert all(p.grad is None for p in model.parameters())  # the model did not train
    assert all(p.requires_grad for p in model.parameters())  # and its parameters are as they were


def test_das_training_depends_on_its_seed_alone_not_on_the_global_generator(split):
    model, (train, _, _), where = split
    settings = DASSettings(steps=4, batch_size=8, lr=0.05, seed=3)
    bases = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        das = RotatedSubspace(model.cfg.d_model, 4, seed=settings.seed)
        train_featurizer(model, das, train, where, settings)
        bases.append(das.basis().detach())
    torch.testing.assert_close(bases[0], bases[1])


def test_dbm_anneals_its_temperature_and_reports_the_mask_size(split):
    model, (train, _, _), where = split
    dbm = BoundlessMask(model.cfg.d_model)
    train_featurizer(model, dbm, train, where, DASSettings(steps=4, temperature=(2.0, 0.5), progress=True))
    assert dbm.temperature == pytest.approx(0.5)
    assert dbm.k == float((torch.sigmoid(dbm.logits / 0.5) > 0.5).sum())


def test_k_is_the_best_on_the_validation_pairs(split):
    model, (train, validation, test), where = split
    settings = DASSettings(ks=(1, 2, 32), steps=3)
    fitted = fit_and_select(model, "pca", where, train, validation, test, settings)
    scores = {k: interchange_accuracy(model, validation, where, fit_and_select(
        model, "pca", where, train, validation, test, settings, k=k).featurizer)[0].value for k in settings.ks}
    best = max(scores.values())
    assert fitted.k == min(k for k, v in scores.items() if v == best)
    assert fitted.test == interchange_accuracy(model, test, where, fitted.featurizer)[0]


def test_das_chooses_k_and_its_step_count_on_the_validation_pairs_from_snapshots_of_one_run(split):
    model, (train, validation, test), where = split
    settings = DASSettings(ks=(1, 4), steps=12, select_steps=(3, 6), batch_size=8, lr=0.05, seed=2)
    fitted = fit_and_select(model, "das", where, train, validation, test, settings)
    # each (k, n) trained on its own for exactly n steps, not snapshotted
    scores = {}
    for k in settings.ks:
        for n in (3, 6, 12):
            alone = RotatedSubspace(model.cfg.d_model, k, seed=settings.seed)
            train_featurizer(model, alone, train, where, dataclasses.replace(settings, steps=n, select_steps=()))
            scores[k, n] = interchange_accuracy(model, validation, where, alone)[0].value
            if (k, n) == (fitted.k, fitted.steps):
                torch.testing.assert_close(alone.basis().detach(), fitted.featurizer.basis().detach())
    best = max(scores.values())
    assert (int(fitted.k), fitted.steps) == min(key for key, v in scores.items() if v == best)
    assert fitted.validation.value == best and len(fitted.losses) == fitted.steps
    assert fitted.test == interchange_accuracy(model, test, where, fitted.featurizer)[0]
    with pytest.raises(InputError, match=r"select_steps holds 20, more than the 12 training steps"):
        DASSettings(steps=12, select_steps=(20,))


def test_pca_directions_are_the_top_principal_directions():
    points = torch.randn(200, 6) * torch.tensor([10.0, 5.0, 1.0, 0.1, 0.1, 0.1])
    q = pca_directions(points, 2).basis()
    assert set(q.abs().argmax(0).tolist()) == {0, 1}
    with pytest.raises(InputError, match=r"k = 7 is larger than the 6 dimensions"):
        pca_directions(points, 7)


def test_the_null_needs_k_and_sizes_beyond_the_location_are_refused(split):
    model, (train, validation, test), where = split
    with pytest.raises(InputError, match=r"The random-subspace null needs k"):
        fit_and_select(model, "random", where, train, validation, test)
    with pytest.raises(InputError, match=r"Every k of \(64,\) is larger than the 32 dimensions at"):
        fit_and_select(model, "das", where, train, validation, test, DASSettings(ks=(64,)))
    with pytest.raises(InputError, match=r"Unknown featurizer kind 'svd'"):
        fit_and_select(model, "svd", where, train, validation, test)


def test_every_recorded_featurizer_fits_through_its_record(split):
    from patching.variables.catalogue import FEATURIZERS

    model, (train, validation, test), where = split
    settings = DASSettings(ks=(2,), steps=2, batch_size=4)
    for name, record in FEATURIZERS.items():
        fitted = fit_and_select(model, name, where, train, validation, test, settings,
                                k=2 if record.null_of else None)
        assert fitted.kind == name and 0 <= fitted.test.value <= 1
        assert fitted.test_hits is not None and len(fitted.test_hits) == fitted.test.n


def test_the_verdict_compares_intervals():
    def est(value, low, high):
        return Estimate(value, low, high, 50, "wilson")
    assert verdict(est(0.9, 0.8, 0.95), est(0.2, 0.1, 0.3), est(1.0, 0.93, 1.0)).startswith(
        "held: DAS's subspace beats the random subspace")
    assert "90% of the full vector's IIA" in verdict(est(0.9, 0.8, 0.95), est(0.2, 0.1, 0.3), est(1.0, 0.93, 1.0))
    assert verdict(est(0.1, 0.03, 0.2), est(0.5, 0.4, 0.6), est(1.0, 0.93, 1.0)).startswith("not held: the random")


def test_an_overlap_is_not_held_only_where_the_test_pairs_could_have_shown_it():
    def est(value, n):
        from circuits.stats import wilson_interval
        low, high = wilson_interval(round(value * n), n)
        return Estimate(value, low, high, n, "wilson")
    full = est(1.0, 256)
    # 256 test pairs resolve about 0.05 over a null of 0.02: an overlapping interval there is a verdict
    decided = verdict(est(0.03, 256), est(0.02, 256), full)
    assert decided.startswith("not held: DAS's interval overlaps the random-subspace null, on 256 test pairs")
    # 16 test pairs cannot resolve 0.2 over a null of 0.1: inconclusive, with the pairs that would resolve it
    undecided = verdict(est(0.25, 16), est(0.1, 16), full, test_share=0.25)
    assert undecided.startswith("inconclusive: 16 test pairs resolve only differences of")
    assert "run with --n-pairs 256 (64 test pairs resolve 0.2)" in undecided
    assert verdict(est(0.25, 16), est(0.1, 16), full).count("64 test pairs would resolve 0.2") == 1
