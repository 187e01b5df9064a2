"""patching.sweeps.results: NodeScores ranked, as percentages (none of a zero reference), as JSON and figures."""

from __future__ import annotations

import pytest
import torch

from circuits.tasks import make_dataset
from tests.tiny_models import tiny_model
from patching.node_level.path_patching import path_patch
from patching.node_level.head_ranking import key_heads
from patching import SweepOptions


def test_result_ranking_key_heads_figure_json():
    model = tiny_model(style="gemma", n_layers=2)
    res = path_patch(model, make_dataset(model, n_prompts=4, n_shots=0), options=SweepOptions(progress=False))
    ranked = res.ranked("heads", by="neg")
    assert [v for _, v in ranked] == sorted(v for _, v in ranked)
    heads, fraction = key_heads(res, top_k=3)
    assert len(heads) == 3 and fraction == pytest.approx(3 / 8)
    heads, _ = key_heads(res, threshold=0.0, by="neg")
    assert all(res.score(h) <= 0 for h in heads)
    d = res.to_dict()
    assert len(d["heads"]) == 2 and len(d["mlps"]) == 2 and d["ranked"]
    fig = res.figure()
    assert len(fig.data) == 2


def test_percentages_with_a_zero_reference():
    """A reference metric averaging ~0 (e.g. logit_diff) has no meaningful % of it."""
    import dataclasses

    import torch

    model = tiny_model(style="gemma", n_layers=2)
    res = path_patch(model, make_dataset(model, n_prompts=4, n_shots=0), options=SweepOptions(progress=False))
    torch.testing.assert_close(res.heads_percent, 100 * res.heads / abs(res.baseline))
    zero = dataclasses.replace(res, baseline=0.0)
    assert torch.isnan(zero.heads_percent).all() and torch.isnan(zero.mlps_percent).all()
    with pytest.raises(ValueError, match="top_k"):
        key_heads(zero, threshold=5.0)
    assert len(key_heads(zero, top_k=2)[0]) == 2
    assert "%" not in zero.figure().layout.title.text  # falls back to absolute effects
