"""finetune.optim: AdamW over row slices equals torch's AdamW, touches only selected rows, refuses betas of 1;
the learning-rate schedule."""

import torch
import pytest

from finetune.masks import TunableSlice
from finetune.optim import SliceAdamW, lr_at
from circuits.errors import InputError
from circuits.nodes import Head
from tests.tiny_models import tiny_model


def test_matches_torch_adamw_on_whole_tensors():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(5, 3))
    b = torch.nn.Parameter(a.detach().clone())
    ours = SliceAdamW([(TunableSlice("w", None), a)], weight_decay=0.1)
    ref = torch.optim.AdamW([b], lr=1e-2, weight_decay=0.1, foreach=False)
    for step in range(5):
        grad = torch.randn(5, 3)
        a.grad, b.grad = grad.clone(), grad.clone()
        ours.step(1e-2)
        ref.step()
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_decay_and_update_touch_only_selected_rows():
    w = torch.nn.Parameter(torch.randn(4, 6))
    before = w.detach().clone()
    opt = SliceAdamW([(TunableSlice("w", (1, 3)), w)], weight_decay=0.5)
    w.grad = torch.zeros_like(w)  # zero gradient everywhere: only weight decay could move entries
    opt.step(0.1)
    assert torch.equal(w[[0, 2]], before[[0, 2]])
    torch.testing.assert_close(w[[1, 3]], before[[1, 3]] * (1 - 0.1 * 0.5))
    assert opt.exp_avg["w"].shape == (2, 6)
    assert opt.state_bytes() == 2 * 2 * 6 * 4


def test_no_decay_for_bias_slices():
    b = torch.nn.Parameter(torch.ones(3))
    opt = SliceAdamW([(TunableSlice("b", None, decay=False), b)], weight_decay=0.5)
    b.grad = torch.zeros(3)
    opt.step(0.1)
    assert torch.equal(b, torch.ones(3))


def test_lr_schedule_warmup_then_linear_decay():
    lrs = [lr_at(s, 100, 1.0, 0.02) for s in range(100)]
    assert lrs[0] == 0.5 and lrs[1] == 1.0
    assert all(x >= y for x, y in zip(lrs[1:], lrs[2:]))
    assert 0 < lrs[-1] < 0.05


HEADS = [Head(0, 1), Head(1, 2)]


def _slices(model):
    from finetune.masks import apply_selection, precise_selection

    return apply_selection(model, precise_selection(model, HEADS)).parameters()


def test_slice_adamw_refuses_betas_of_one():
    model = tiny_model(style="gemma")
    with pytest.raises(InputError, match=r"beta1 must lie in \[0, 1\)"):
        SliceAdamW(list(_slices(model)), betas=(1.0, 0.999))
