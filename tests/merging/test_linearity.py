"""Non-linearity scores: exactly linear submodules score 0; the model is less linear than its parts."""

import math

import pytest
import torch

from merging import LinearityConfig, nonlinearity_scores
from merging.linearity import alpha_grid, nonlinearity_figure


def test_alpha_grid():
    grid = alpha_grid(2, (0.0, 0.5, 1.0))
    assert len(grid) == 8 and (0.0, 0.0) not in grid and (0.5, 1.0) in grid


def test_linear_submodule_scores_zero_and_model_does_not(gpt2_model):
    # experts change only W_O of block 1: the attention output is linear in W_O (gpt2: no norm after it)
    gen = torch.Generator().manual_seed(0)
    experts = []
    for _ in range(2):
        sd = {k: v.clone() for k, v in gpt2_model.state_dict().items()}
        sd["blocks.1.attn.W_O"] += 0.5 * torch.randn(sd["blocks.1.attn.W_O"].shape, generator=gen)
        experts.append(sd)
    tasks = [torch.randint(3, gpt2_model.cfg.d_vocab, (4, 6), generator=gen) for _ in range(2)]
    result = nonlinearity_scores(gpt2_model, experts, tasks, [(0.5, 0.5), (1.0, 0.3)], progress=False)
    attn = [r["score"] for r in result.records if r["submodule"] == "L1.attn"]
    assert len(attn) == 2 and max(attn) < 1e-5
    # unchanged submodules: Delta = 0 everywhere -> no finite score
    assert all(math.isnan(r["score"]) for r in result.records if r["submodule"] == "L0.attn")
    model = result.scores("model")
    assert len(model) == 2 and min(model) > 1e-3 > max(attn)


@pytest.mark.parametrize("level", ["layer", "attn_mlp", "head"])
def test_scores_for_each_level_and_figure(perturb, gemma_model, level):
    experts = [perturb(gemma_model, scale=0.05, seed=1), perturb(gemma_model, scale=0.05, seed=2)]
    tasks = [["1+2=3", "4+4=8"], ["9-5=4", "7-7=0"]]
    alphas = alpha_grid(2, (0.5, 1.0))
    cfg = LinearityConfig(level=level, inputs_from="expert")
    result = nonlinearity_scores(gemma_model, experts, tasks, alphas, cfg, progress=False)
    n_sub = {"layer": 1, "attn_mlp": 2, "head": 2 + gemma_model.cfg.n_heads}[level] * gemma_model.cfg.n_layers
    assert len(result.records) == len(alphas) * (n_sub + 1)
    scores = result.scores()
    assert all(0.0 <= s < 1.0 for s in scores)
    fig = nonlinearity_figure(result)
    assert {t.name for t in fig.data} >= {"model"}
    assert sum(len(t.y) for t in fig.data) == len(scores)


def test_wrong_alpha_length_is_rejected(perturb, gpt2_model):
    with pytest.raises(ValueError, match="3 coefficients for 2 experts"):
        nonlinearity_scores(gpt2_model, [perturb(gpt2_model), perturb(gpt2_model)], [["1+1=2"]], [(1, 1, 1)], progress=False)


def test_bad_linearity_config():
    with pytest.raises(ValueError, match="LinearityConfig.level"):
        LinearityConfig(level="model")
