"""Attribution patching: zero when nothing changes, close in rank to exact patching, no parameter gradients."""

from __future__ import annotations

import pytest
import torch

from circuits.nodes import Head
from circuits.tasks import make_dataset, single_batch
from tests.tiny_models import tiny_model
from patching.node_level.activation_patching import activation_patch
from patching.node_level.attribution_patching import attribution_patch, rank_agreement
from patching.node_level.path_patching import path_patch
from patching import SweepOptions


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(style="gemma", n_layers=3)
    return model, make_dataset(model, n_prompts=12, n_shots=0, seed=3)


def test_identical_counterfactual_gives_zero(setup):
    model, data = setup
    b = single_batch(data.filter(lambda r: r["template_id"] == "add-equation-0"))
    res = attribution_patch(model, b.tokens, b.tokens, answer_ids=b.answer_ids, options=SweepOptions(progress=False))
    assert torch.allclose(res.heads, torch.zeros_like(res.heads)) and torch.allclose(res.mlps, torch.zeros_like(res.mlps))


def test_ranks_agree_with_exact_patching(setup):
    model, data = setup
    attr = attribution_patch(model, data, options=SweepOptions(progress=False))
    exact = [activation_patch(model, data, component="z", options=SweepOptions(progress=False)),
             activation_patch(model, data, component="mlp_out", positions="all", options=SweepOptions(progress=False))]
    agreement = rank_agreement(attr, exact)
    assert agreement["n_nodes"] == 12 + 3
    assert agreement["spearman"] > 0.7
    assert -1 <= rank_agreement(attr, path_patch(model, data,
                                                 options=SweepOptions(progress=False)), kind="heads")["spearman"] <= 1


def test_no_parameter_gradients_and_subset(setup):
    model, data = setup
    res = attribution_patch(model, data, nodes=[Head(1, 2)], options=SweepOptions(progress=False))
    assert all(p.grad is None for p in model.parameters())
    assert torch.isnan(res.mlps).all() and torch.isfinite(res.heads[1, 2]) and torch.isnan(res.heads[0]).all()


def test_rank_agreement_needs_overlap(setup):
    model, data = setup
    a = attribution_patch(model, data, nodes=[Head(0, 0), Head(0, 1)], options=SweepOptions(progress=False))
    with pytest.raises(ValueError, match="at least 3"):
        rank_agreement(a, a)


def test_no_nodes_is_refused(setup):
    """nodes=[] was a raw autograd error (no inputs to differentiate) instead of a sentence."""
    model, data = setup
    with pytest.raises(ValueError, match=r"nodes is empty, so nothing would be scored: pass at least one Head or MLP"):
        attribution_patch(model, data, nodes=[], options=SweepOptions(progress=False))


@pytest.mark.parametrize("name", ["constant", "detached"])
def test_attribution_patching_refuses_a_metric_without_a_gradient(name):
    from circuits.errors import InputError
    from circuits.tasks import make_dataset
    from tests.tiny_models import tiny_model

    model = tiny_model(n_layers=1)
    data = make_dataset(model, n_prompts=3, n_shots=0, template_ids=("add-equation-0",), seed=2)
    metric = {"constant": lambda l, a, b: torch.zeros(l.shape[0]), "detached": lambda l, a, b: l[:, 0].detach()}[name]
    with pytest.raises(InputError, match="does not depend on the logits it is given .*no gradient to attribute"):
        attribution_patch(model, data, options=SweepOptions(metric=metric, progress=False))
