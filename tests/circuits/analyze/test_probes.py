"""MLP probes (cosines with unembedding directions) and the logit lens."""

import pytest
import torch

from circuits.end_logits import end_logits
from circuits.analyze.probes import (
    STREAMS, TARGETS, ProbeConfig, ProbeResults, number_token_ids, plot_logit_lens, plot_probe_cosines,
    plot_top_tokens, probe_mlps, top_number_tokens, unembedding_directions,
)
from circuits.tasks import make_dataset
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module", params=["gemma", "gpt2"])
def model(request):
    return tiny_model(style=request.param, n_layers=2)


@pytest.fixture(scope="module")
def data(model):
    return make_dataset(model, n_prompts=6, styles=("equation",), seed=2)


def test_cosines_match_a_manual_computation(model, data):
    res = probe_mlps(model, data, ProbeConfig(direction="raw"), progress=False)
    assert set(res.cos) == set(STREAMS) and res.cos["mlp_in"].shape == (len(data), 2, len(TARGETS))
    row = data[0]
    _, cache = model.run_with_cache(torch.tensor([row["tokens"]]))
    for layer in range(2):
        x_in, x_out = cache["resid_mid", layer][0, -1], cache["mlp_out", layer][0, -1]
        for t, tok in enumerate([row["tokens"][row["a_pos"][0]], row["tokens"][row["b_pos"][0]], row["answer_token_ids"][0]]):
            u = model.W_U[:, tok]
            assert res.cos["mlp_in"][0, layer, t] == pytest.approx(torch.cosine_similarity(x_in, u, 0).item(), abs=1e-4)
            assert res.cos["mlp_out"][0, layer, t] == pytest.approx(torch.cosine_similarity(x_out, u, 0).item(), abs=1e-4)
            assert res.cos["out_minus_in"][0, layer, t] == pytest.approx(
                torch.cosine_similarity(x_out - x_in, u, 0).item(), abs=1e-4)


def test_effective_direction_folds_the_final_norm(model):
    ids = torch.tensor([5, 7])
    raw, eff = unembedding_directions(model, ids, "raw"), unembedding_directions(model, ids, "effective")
    torch.testing.assert_close(raw, model.W_U[:, ids])
    # A residual along the effective direction (through the final norm) raises that token's logit the most.
    x = torch.randn(model.cfg.d_model)
    logits = lambda r: (model.ln_final(r[None, None])[0, 0] @ model.W_U)[ids]  # noqa: E731
    with torch.no_grad():
        model.ln_final.w.mul_(torch.linspace(0.5, 2.0, model.cfg.d_model))  # make the fold matter
        eff = unembedding_directions(model, ids, "effective")
        gain_eff = logits(x + 0.1 * eff[:, 0] / eff[:, 0].norm()) - logits(x)
        gain_raw = logits(x + 0.1 * raw[:, 0] / raw[:, 0].norm()) - logits(x)
        model.ln_final.w.div_(torch.linspace(0.5, 2.0, model.cfg.d_model))
    assert gain_eff[0] >= gain_raw[0] - 1e-6
    with pytest.raises(ValueError, match="direction"):
        unembedding_directions(model, ids, "sideways")
    digits = torch.tensor(list(number_token_ids(model.tokenizer).values()))
    centered = unembedding_directions(model, digits, "centered")
    torch.testing.assert_close(centered.sum(1), torch.zeros(model.cfg.d_model), atol=1e-5, rtol=0)


def test_logit_lens_last_layer_equals_the_model_output(model, data):
    res = probe_mlps(model, data, progress=False)
    for i, row in enumerate(data):
        logits = end_logits(model, torch.tensor([row["tokens"]]))[0]
        answer = row["answer_token_ids"][0]
        assert res.rank[i, -1] == (logits > logits[answer]).sum()
        assert res.prob[i, -1] == pytest.approx(logits.softmax(-1)[answer].item(), rel=1e-4)
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())
    assert len(res.lens_table()) == 2


def test_summaries_on_synthetic_curves():
    n_layers = 8
    curve = torch.tensor([0.0, 0.01, 0.0, 0.02, 0.1, 0.3, 0.5, 0.4])
    cos = {s: torch.zeros(4, n_layers, len(TARGETS)) for s in STREAMS}
    cos["mlp_out"][:, :, 2] = curve
    rank = torch.tensor([[0, 5, 3, 1, 0, 0, 0, 0]] * 3 + [[5, 5, 5, 5, 5, 0, 0, 0]])
    res = ProbeResults(cos=cos, rank=rank, prob=torch.zeros(4, n_layers))
    assert res.rise_range("mlp_out", "C") == (3, 6) == res.rise_range("mlp_out", "C", versus=None)
    cos["mlp_out"][:, :, 3] = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.45, 0.0])  # a common-mode bump at 6
    assert res.rise_range("mlp_out", "C") == (3, 7) and res.rise_range("mlp_out", "C", versus=None) == (3, 6)
    assert res.first_top1_layer() == 4 and res.first_top1_layer(1.0) == 5
    assert res.first_top1_layer(stable=False) == 0  # an early lucky hit, then lost
    assert ProbeResults(cos=cos, rank=rank + 1, prob=torch.zeros(4, n_layers)).first_top1_layer() is None
    with pytest.raises(ValueError, match="No logit lens"):
        ProbeResults(cos=cos).top1_rate()


def test_top_tokens_and_figures(model, data):
    assert sorted(number_token_ids(model.tokenizer)) == list(range(10))
    top = top_number_tokens(model, "4 + 3 = ", k=3)
    assert len(top) == 2 and all(len(r) == 3 for r in top)
    assert top[0][0][1] >= top[0][1][1] >= top[0][2][1]
    res = probe_mlps(model, data, progress=False)
    assert len(plot_probe_cosines(res).data) == len(STREAMS) * len(TARGETS)
    assert len(plot_logit_lens(res).data) == 3
    # independent check: cosine of each layer's MLP output at END with the number tokens' W_U columns
    _, cache = model.run_with_cache(model.to_tokens("4 + 3 = "))
    numbers = number_token_ids(model.tokenizer)
    columns = model.W_U[:, list(numbers.values())]
    for layer, row in enumerate(top):
        cos = torch.nn.functional.cosine_similarity(cache["mlp_out", layer][0, -1][None], columns.T, dim=-1)
        values, index = cos.topk(3)
        assert [t for t, _ in row] == [str(list(numbers)[i]) for i in index.tolist()]
        torch.testing.assert_close(torch.tensor([v for _, v in row]), values.float(), atol=1e-5, rtol=0)
    heatmap = plot_top_tokens(top, "4 + 3 = ", "7").data[0]
    assert [list(r) for r in heatmap.z] == [[v for _, v in row] for row in top]
    assert [list(r) for r in heatmap.text] == [[f"<b>{t}</b>" if t == "7" else t for t, _ in row] for row in top]
    with pytest.raises(ValueError, match="stream"):
        top_number_tokens(model, "4 + 3 = ", stream="resid")


@pytest.mark.integration
def test_gemma_answer_emerges_by_the_last_layer(gemma):
    from circuits.tasks import filter_correct

    ds, _ = filter_correct(gemma, make_dataset(gemma, n_prompts=6, styles=("equation",), seed=0))
    res = probe_mlps(gemma, ds, progress=False)
    assert (res.rank[:, -1] == 0).all()  # kept prompts are answered correctly: the lens agrees at the end
    # independent: the first layer from which at least half of the prompts rank the answer first, for good
    rate = (res.rank == 0).float().mean(0).tolist()
    expected = next(l for l in range(len(rate)) if all(r >= 0.5 for r in rate[l:]))
    layer = res.first_top1_layer()
    assert layer == expected
    assert 0 < layer < gemma.cfg.n_layers  # formed inside the network, not read off the embedding
    assert rate[0] < 0.5
