"""circuits.show.patching_figures: the heatmaps show the effects given, on symmetric scales of their own; key heads are
marked by rank; knockout and transfer figures carry their intervals as error bars."""

import numpy as np
import pytest
import torch

from circuits.nodes import Head
from circuits.show.patching_figures import activation_scores_figure, knockout_figure, node_scores_figure, transfer_figure
from patching.sweeps.results import KnockoutCurve


def test_node_scores_heatmaps_have_their_own_symmetric_scales_and_mark_key_heads():
    heads = torch.tensor([[-2.0, 0.5, float("nan")], [1.0, 0.0, -0.25]])
    mlps = torch.tensor([10.0, -3.0])
    fig = node_scores_figure(heads, mlps, unit="%", title="t", key_heads=[Head(0, 0), Head(1, 2)])
    head_map, mlp_map, marks = fig.data
    np.testing.assert_array_equal(head_map.z, heads.numpy())
    assert (head_map.zmin, head_map.zmax, head_map.zmid) == (-2.0, 2.0, 0)  # the largest |head effect|, NaN ignored
    assert (mlp_map.zmin, mlp_map.zmax) == (-10.0, 10.0) and np.asarray(mlp_map.z).shape == (2, 1)
    assert list(marks.x) == ["0", "2"] and list(marks.y) == [0, 1] and list(marks.text) == ["#1", "#2"]
    plain = node_scores_figure(torch.zeros(2, 3), torch.zeros(2), unit="logit", title="zeros")
    assert len(plain.data) == 2 and plain.data[0].zmax == 1.0  # no key heads; an all-zero map keeps a usable scale


def test_activation_heatmap_puts_layer_and_head_on_rows():
    effect = torch.arange(2 * 3 * 4, dtype=torch.float).reshape(2, 3, 4)  # layer, pos, head
    z = np.asarray(activation_scores_figure(effect, title="t").data[0].z)
    assert z.shape == (2 * 4, 3)
    np.testing.assert_array_equal(z[1 * 4 + 2], effect[1, :, 2].numpy())  # row L1.H2 over positions


def test_knockout_and_transfer_figures_draw_their_intervals():
    curve = KnockoutCurve(ks=[1, 2], effect_rank=[0.6, 0.4], random_rank=[0.8, 0.7], random_std=[0.05, 0.1],
                          base_accuracy=0.9, heads=["L0H0", "L1H1"], n_seeds=3, n_prompts=10, n_pool=20,
                          base_ci=[0.6, 0.98], effect_ci=[[0.3, 0.8], [0.2, 0.7]], random_ci=[[0.6, 0.9], [0.5, 0.8]])
    effect, random = knockout_figure(curve).data
    assert list(effect.x) == [0, 1, 2] and list(effect.y) == [0.9, 0.6, 0.4]
    assert list(effect.error_y.array) == pytest.approx([0.08, 0.2, 0.3])
    assert list(effect.error_y.arrayminus) == pytest.approx([0.3, 0.3, 0.2])
    assert list(random.y) == [0.9, 0.8, 0.7] and "10 prompts" in knockout_figure(curve).layout.title.text
    bars = transfer_figure({"words": {"base": 0.8, "knockout": 0.3, "base_estimate": {"low": 0.7, "high": 0.9},
                                      "knockout_estimate": {"low": 0.2, "high": 0.45}},
                            "skipped": {"reason": "no prompts"}}).data
    assert list(bars[0].x) == ["words"] and list(bars[1].y) == [0.3]
    assert list(bars[1].error_y.array) == pytest.approx([0.15]) and list(bars[1].error_y.arrayminus) == pytest.approx([0.1])
