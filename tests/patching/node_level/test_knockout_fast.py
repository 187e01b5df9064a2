"""The knockout fast path's pieces: the screened top-1 test and the shared suffix starts, on tiny models."""

from __future__ import annotations

import pytest
import torch

from circuits.end_logits import unembed_end
from circuits.nodes import Head, all_heads, all_mlps
from circuits.tasks import make_dataset
from circuits.templates import get_templates
from tests.tiny_models import tiny_model
from patching.node_level import knockout_fast
from patching.node_level.knockout_curves import knockout_correct, pool_means


@pytest.fixture(scope="module")
def model():
    return tiny_model(style="gemma", n_key_value_heads=1, n_layers=2)


def _clean_end(model, n=16):
    data = make_dataset(model, n_prompts=n, n_shots=1, seed=3)
    tokens = torch.tensor([t for t in data["tokens"] if len(t) == len(data["tokens"][0])])
    return model(tokens, stop_at_layer=model.cfg.n_layers)[:, -1]


@pytest.mark.parametrize("screen", [True, False])
def test_top1_anchor_equals_the_full_argmax(model, screen):
    clean = _clean_end(model)
    B = clean.shape[0]
    logits = unembed_end(model, clean)
    # answers: each row's clean top-1 for most rows, its second-best token for some (a clean miss)
    answers = logits.argmax(-1)
    answers[::4] = logits.topk(2, dim=-1).indices[::4, 1]
    anchor = knockout_fast.Top1Anchor(model, clean, answers, screen=screen)
    gen = torch.Generator().manual_seed(0)
    scales = [0.0, 1e-4, 1e-2, 0.1, 1.0, 10.0]  # from "nothing changed" to "anything can win"
    resid = torch.cat([clean + s * clean.norm(dim=-1, keepdim=True) * torch.randn(clean.shape, generator=gen)
                       / clean.shape[-1] ** 0.5 for s in scales])
    expected = unembed_end(model, resid).argmax(-1) == answers.repeat(len(scales))
    assert torch.equal(anchor.hits(resid), expected)
    assert anchor.stats["rows"] == B * len(scales)
    assert anchor.stats["full"] < anchor.stats["rows"] if screen else anchor.stats["full"] == anchor.stats["rows"]
    assert torch.equal(anchor.clean_hits, logits.argmax(-1) == answers) and not anchor.clean_hits[::4].any()


def test_choose_split_runs_shared_starts_once():
    suffix = torch.tensor([[1, 2, 5, 9], [1, 2, 6, 9], [1, 2, 7, 9], [3, 2, 8, 9], [3, 2, 4, 9], [1, 2, 4, 9]])
    split = knockout_fast.choose_split(suffix)
    # 2 distinct starts "1 2" and "3 2": 2 x 2 + 6 x 2 = 16 positions instead of 24
    assert split.s == 2 and len(split.starts) == 2
    assert torch.equal(suffix[split.starts][split.inverse, :2], suffix[:, :2])
    assert knockout_fast.choose_split(torch.tensor([[1, 5], [2, 5], [3, 5]])) is None  # every row starts differently


@pytest.mark.parametrize("screen,share", [(True, True), (True, False), (False, True)])
def test_fast_options_equal_plain_hooks(model, screen, share):
    # one template, one few-shot prefix: 40 prompts of one layout whose suffixes share their first operand
    from patching.sweeps.options import SweepOptions
    template = get_templates("+", ("equation",))[0]
    data = make_dataset(model, n_prompts=40, n_shots=1, seed=1, template_ids=(template.id,))
    suffix = torch.tensor(data["tokens"])[:, 12:]  # past the shared prefix
    assert knockout_fast.choose_split(suffix) is not None
    every = all_heads(model) + all_mlps(model)
    means = pool_means(model, data, every, n_pool=128)
    sets = [[], [Head(0, 1)], [Head(1, 0), Head(0, 3)], all_heads(model)[::2], every]
    stats = {}
    fast = knockout_correct(model, data, sets, means=means, screen_argmax=screen, share_starts=share, stats=stats,
                            options=SweepOptions(memory_mb=0.05))  # a tiny budget: several chunks of sets
    plain = knockout_correct(model, data, sets, means=means, method="hooks")
    assert torch.equal(fast, plain)
    assert stats["rows"] == len(data) * (len(sets) - 1)
    assert stats["full"] < stats["rows"] if screen else stats["full"] == stats["rows"]


def test_start_bins_place_every_set_once_no_later_than_its_first_ablated_layer():
    from patching.node_level.knockout_curves import _start_bins

    starts = [18, 10, 12, 4, 1, 10, 12, 2, 1, 10, 1, 2, 1, 9, 1, 2, 1]
    for rows in (1, 5, 64, 10_000):
        bins = _start_bins(starts, 18, rows, max_sets=100)
        members = [s for group in bins.values() for s in group]
        assert sorted(members) == [s for s in range(len(starts)) if starts[s] < 18]  # the empty set is the clean run
        assert all(start <= starts[s] for start, group in bins.items() for s in group)
    assert len(_start_bins(starts, 18, 10_000, 100)) == len(set(starts) - {18})  # big forwards: no extra layers
    assert len(_start_bins(starts, 18, 1, 100)) < len(set(starts) - {18})  # tiny forwards: merged
