"""circuits.end_logits: the END-only logits equal the last position of a full forward."""

import pytest
import torch

from circuits import tasks
from circuits.end_logits import end_argmax, end_logits, unembed_end
from tests.tiny_models import tiny_model


def test_end_logits_equal_full_forward():
    model = tiny_model(style="gemma")
    ds = tasks.make_dataset(model, n_prompts=8, template_ids=("add-equation-0",), n_shots=0)
    batch = tasks.single_batch(ds)
    full = model(batch.tokens)[:, -1]
    assert torch.allclose(end_logits(model, batch.tokens), full, atol=1e-5)
    ids = torch.tensor([3, 5])
    assert torch.allclose(end_logits(model, batch.tokens, token_ids=ids), full[:, ids], atol=1e-5)


def _end_rows(model, n_scales=(0.0, 0.01, 0.1, 1.0, 10.0)):
    ds = tasks.make_dataset(model, n_prompts=16, template_ids=("add-equation-0",), n_shots=1, seed=2)
    resid = model(tasks.single_batch(ds).tokens, stop_at_layer=model.cfg.n_layers)[:, -1]
    gen = torch.Generator().manual_seed(0)
    noise = lambda s: s * resid.norm(dim=-1, keepdim=True) * torch.randn(resid.shape, generator=gen) / resid.shape[-1] ** 0.5
    return torch.cat([resid + noise(s) for s in n_scales])


def test_end_argmax_equals_the_float32_argmax():
    model = tiny_model(style="gemma")
    rows = _end_rows(model)
    stats = {}
    screened = end_argmax(model, rows, screen=True, stats=stats)
    assert torch.equal(screened, unembed_end(model, rows).argmax(-1))
    assert stats["rows"] == len(rows) and stats["full"] < len(rows)  # most rows decided by the screen
    plain = {}
    assert torch.equal(end_argmax(model, rows, screen=False, stats=plain), screened) and plain["full"] == len(rows)


def test_end_argmax_with_a_bias_and_exact_ties():
    model = tiny_model(style="gpt2")
    with torch.no_grad():
        model.b_U.copy_(torch.linspace(-3, 3, model.cfg.d_vocab))
    rows = _end_rows(model)
    assert torch.equal(end_argmax(model, rows, screen=True), unembed_end(model, rows).argmax(-1))
    with torch.no_grad():  # two equal columns that win every row by far: an exact tie, which argmax gives to the first
        model.W_U[:, 7] = model.W_U[:, 3]
        model.b_U[3] = model.b_U[7] = 1e3
    stats = {}
    assert torch.equal(end_argmax(model, rows, screen=True, stats=stats), torch.full((len(rows),), 3))
    assert stats["full"] == len(rows)  # a tie is left to the float32 product


def test_end_argmax_screens_after_the_unembedding_changes():
    model = tiny_model(style="gemma")
    rows = _end_rows(model, (0.0, 1.0))
    end_argmax(model, rows, screen=True)  # builds the bfloat16 copy
    with torch.no_grad():
        model.W_U.mul_(-1.0)  # an in-place update (as fine-tuning makes) must not leave a stale copy
    assert torch.equal(end_argmax(model, rows, screen=True), unembed_end(model, rows).argmax(-1))


@pytest.mark.integration
def test_end_argmax_on_gemma_equals_the_float32_argmax(gemma):
    # real END residuals, and the same moved as far as a knockout moves them (|dh| ~ 0.3 |h|) and further
    from circuits.end_logits import native_bfloat16

    rows = _end_rows(gemma, (0.0, 0.1, 0.3, 1.0))
    if not native_bfloat16():  # an emulated bfloat16 product of 64 rows takes ~70 s: every scale, 4 prompts each
        rows = rows[::4]
    stats = {}
    assert torch.equal(end_argmax(gemma, rows, screen=True, stats=stats), unembed_end(gemma, rows).argmax(-1))
    assert stats["full"] < 0.2 * stats["rows"]  # the screen decides most rows on a real vocabulary


def test_a_screen_that_breaks_its_bound_warns_and_falls_back_to_float32():
    from circuits.end_logits import _screen_for

    model = tiny_model(style="gemma")
    rows = _end_rows(model, (0.0, 1.0))
    screen = _screen_for(model)
    screen.W.mul_(3.0)  # a bfloat16 product far off its float32 value (as a kernel without float32 accumulation could be)
    with pytest.warns(RuntimeWarning, match="exceeded its error bound"):
        got = end_argmax(model, rows, screen=True)
    assert torch.equal(got, unembed_end(model, rows).argmax(-1)) and _screen_for(model) is None  # never screened again


def test_the_default_screens_only_where_bfloat16_is_native():
    """screen=None follows oneDNN's report of native bfloat16 (an emulated product is ~100x slower than float32)."""
    from circuits.end_logits import native_bfloat16

    model = tiny_model(style="gemma")
    rows = _end_rows(model, (0.0, 1.0))
    stats = {}
    assert torch.equal(end_argmax(model, rows, stats=stats), unembed_end(model, rows).argmax(-1))
    assert native_bfloat16() == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert (stats["full"] < len(rows)) if native_bfloat16() else (stats["full"] == len(rows))
