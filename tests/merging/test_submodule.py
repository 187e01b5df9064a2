"""merging.submodule: closed-form submodule merging, exact recovery on linear submodules, every level on tiny
models; in the integration tier, the attention/MLP merge on gemma-3-270m."""

import copy

import pytest
import torch
from torch.func import functional_call

from merging.submodule import AlphaTable, alpha_heatmap
from merging import SubmoduleMergeConfig, merge_submodules
from merging.submodule import solve_alpha
from merging.state_dicts import is_buffer


LAYER = 1


def wo_experts(model, deltas):
    """Experts that differ from the base only in W_O of block LAYER (attention output linear in θ)."""
    out = []
    for d in deltas:
        sd = {k: v.clone() for k, v in model.state_dict().items()}
        sd[f"blocks.{LAYER}.attn.W_O"] += d
        out.append(sd)
    return out


def random_tasks(model, n_tasks, seed=0, batch=6, pos=7):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, model.cfg.d_vocab, (batch, pos), generator=gen) for _ in range(n_tasks)]


def bias_experts(model, key, seed=1):
    """Two experts differing from the base in one additive bias of block LAYER: delta_i(x) = tau_i at every position."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        sd = {k: v.clone() for k, v in model.state_dict().items()}
        sd[f"blocks.{LAYER}.{key}"] += torch.randn(sd[f"blocks.{LAYER}.{key}"].shape, generator=gen)
        out.append(sd)
    return out


@pytest.mark.parametrize(
    "key,level,row",
    [
        ("attn.b_O", "attn_mlp", "L1.attn"),
        ("attn.b_O", "head", "L1.attn"),
        ("mlp.b_out", "attn_mlp", "L1.mlp"),
        ("mlp.b_out", "head", "L1.mlp"),
        ("mlp.b_out", "layer", "L1"),
    ],
)
def test_additive_bias_experts_recover_token_share_alpha(gpt2_model, key, level, row):
    # delta_i(x) = tau_i at each of the N_t real positions of task t, so
    # G = N [<tau_i, tau_j>], b_i = N_0 <tau_i, tau_0> + N_1 <tau_i, tau_1>  ->  alpha = (N_0 / N, N_1 / N)
    # task 0: 4 x 5 = 20 positions; task 1: 4 x 5 with the last 2 positions padded -> 12; alpha = (0.625, 0.375)
    experts = bias_experts(gpt2_model, key)
    tasks = random_tasks(gpt2_model, 2, batch=4, pos=5)
    mask1 = torch.ones(4, 5, dtype=torch.long)
    mask1[:, 3:] = 0
    cfg = SubmoduleMergeConfig(level=level, batch_size=3)
    result = merge_submodules(gpt2_model, experts, tasks, cfg, attention_masks=[None, mask1], progress=False)
    expected = torch.tensor([0.625, 0.375], dtype=torch.float64)
    assert torch.allclose(result.alphas[row], expected, atol=1e-6)
    base = gpt2_model.state_dict()[f"blocks.{LAYER}.{key}"]
    merged = base + 0.625 * (experts[0][f"blocks.{LAYER}.{key}"] - base) + 0.375 * (experts[1][f"blocks.{LAYER}.{key}"] - base)
    assert torch.allclose(result.state_dict[f"blocks.{LAYER}.{key}"], merged, atol=1e-6)
    untouched = "L0.attn" if level != "layer" else "L0"
    assert torch.equal(result.alphas[untouched], torch.zeros(2, dtype=torch.float64))


def test_scaled_expert_recovers_known_alpha(gpt2_model):
    # tau_1 = 2 tau_0 and both tasks share the data: delta_1 = 2 delta_0, G = 2g[[1,2],[2,4]], b = g[3,6]
    # -> minimum-norm alpha = (0.3, 0.6) (0.3 delta + 1.2 delta = the mean of the targets delta and 2 delta)
    d0 = 0.2 * torch.randn(gpt2_model.blocks[LAYER].attn.W_O.shape, generator=torch.Generator().manual_seed(2))
    experts = wo_experts(gpt2_model, [d0, 2 * d0])
    data = random_tasks(gpt2_model, 1)[0]
    result = merge_submodules(gpt2_model, experts, [data, data], progress=False)
    assert torch.allclose(result.alphas[f"L{LAYER}.attn"], torch.tensor([0.3, 0.6], dtype=torch.float64), atol=1e-6)


def test_solve_alpha_ridge_and_zero_gram():
    gram = torch.tensor([[2.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    alpha = torch.tensor([0.7, -0.2], dtype=torch.float64)
    assert torch.allclose(solve_alpha(gram, gram @ alpha, 1e-12), alpha, atol=1e-9)
    assert torch.equal(solve_alpha(torch.zeros(2, 2), torch.zeros(2), 1e-8), torch.zeros(2, dtype=torch.float64))


EXPECTED_ROWS = {
    "model": lambda L, H: ["model"],
    "layer": lambda L, H: [f"L{l}" for l in range(L)],
    "attn_mlp": lambda L, H: [n for l in range(L) for n in (f"L{l}.attn", f"L{l}.mlp")],
    "head": lambda L, H: [n for l in range(L) for n in [*(f"L{l}H{h}" for h in range(H)), f"L{l}.attn", f"L{l}.mlp"]],
}


@pytest.mark.parametrize("style", ["gpt2", "gemma"])
@pytest.mark.parametrize("level", ["model", "layer", "attn_mlp", "head"])
def test_every_level_runs_and_returns_loadable_state_dict(perturb, request, style, level):
    model = request.getfixturevalue(f"{style}_model")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    experts = [perturb(model, seed=1), perturb(model, seed=2)]
    tasks = [["12+34=46", "5+5=10", "7+1=8"], random_tasks(model, 1, batch=3)[0]]
    result = merge_submodules(model, experts, tasks, SubmoduleMergeConfig(level=level, batch_size=2), progress=False)
    rows = EXPECTED_ROWS[level](model.cfg.n_layers, model.cfg.n_heads)
    assert result.alphas.names == rows
    assert result.alphas.values.shape == (len(rows), 2)
    assert torch.isfinite(result.alphas.values).all()
    target = request.getfixturevalue(f"{style}_target")
    target.load_state_dict(result.state_dict)
    assert torch.isfinite(target(target.to_tokens("3+4="))).all()
    # the base model is left untouched and no hook survives
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(not hp._forward_hooks for hp in model.hook_dict.values())
    # embeddings and unembedding: task arithmetic with the default lambda 1/n
    W_E = (experts[0]["embed.W_E"] + experts[1]["embed.W_E"]) / 2
    if level != "model":
        assert torch.allclose(result.state_dict["embed.W_E"], W_E, atol=1e-6)


@pytest.mark.parametrize("level", ["model", "layer", "attn_mlp", "head"])
def test_identical_experts_share_the_weight(perturb, gemma_model, level):
    expert = perturb(gemma_model, scale=0.05)
    result = merge_submodules(gemma_model, [expert, expert], random_tasks(gemma_model, 2), SubmoduleMergeConfig(level=level), progress=False)
    assert torch.allclose(result.alphas.values, torch.full_like(result.alphas.values, 0.5), atol=1e-6)
    key = "blocks.1.mlp.W_in"
    assert torch.allclose(result.state_dict[key], expert[key], atol=1e-6)


def test_merged_parameters_are_base_plus_alpha_task_vectors(perturb, gemma_model):
    experts = [perturb(gemma_model, seed=1), perturb(gemma_model, seed=2)]
    result = merge_submodules(gemma_model, experts, random_tasks(gemma_model, 2), SubmoduleMergeConfig(level="head", inputs_from="base"), progress=False)
    base = gemma_model.state_dict()
    a = result.alphas
    for key, row in [("blocks.0.mlp.W_gate", "L0.mlp"), ("blocks.1.ln1_post.w", "L1.attn"), ("blocks.1.attn._W_K", "L1.attn")]:
        expected = base[key] + sum(float(a[row][i]) * (e[key] - base[key]) for i, e in enumerate(experts))
        assert torch.allclose(result.state_dict[key], expected, atol=1e-6), key
    w_q = result.state_dict["blocks.0.attn.W_Q"]
    for h in range(gemma_model.cfg.n_heads):
        alpha = a[f"L0H{h}"]
        expected = base["blocks.0.attn.W_Q"][h] + sum(
            float(alpha[i]) * (e["blocks.0.attn.W_Q"][h] - base["blocks.0.attn.W_Q"][h]) for i, e in enumerate(experts)
        )
        assert torch.allclose(w_q[h], expected, atol=1e-6)


def test_per_layer_levels_mapping_and_callable(perturb, gpt2_model):
    experts = [perturb(gpt2_model, seed=1), perturb(gpt2_model, seed=2)]
    tasks = random_tasks(gpt2_model, 2, batch=2)
    by_map = merge_submodules(gpt2_model, experts, tasks, levels={0: "head", 1: "layer"}, progress=False)
    assert by_map.alphas.names == ["L0H0", "L0H1", "L0H2", "L0H3", "L0.attn", "L0.mlp", "L1"]
    by_fn = merge_submodules(gpt2_model, experts, tasks, levels=lambda l: "attn_mlp" if l == 0 else "head", progress=False)
    assert by_fn.alphas.names[:2] == ["L0.attn", "L0.mlp"] and by_fn.alphas.names[2] == "L1H0"
    partial = merge_submodules(gpt2_model, experts, tasks, SubmoduleMergeConfig(level="layer"), levels={0: "head"}, progress=False)
    assert partial.alphas.names[-1] == "L1"  # layers missing from the mapping use config.level
    with pytest.raises(ValueError, match="per-layer level must be one of"):
        merge_submodules(gpt2_model, experts, tasks, levels={0: "model", 1: "layer"}, progress=False)


def test_bad_inputs_are_rejected(perturb, gpt2_model):
    experts = [perturb(gpt2_model, seed=1), perturb(gpt2_model, seed=2)]
    with pytest.raises(ValueError, match="1 tasks for 2 experts"):
        merge_submodules(gpt2_model, experts, random_tasks(gpt2_model, 1), progress=False)
    with pytest.raises(ValueError, match="level must be one of"):
        SubmoduleMergeConfig(level="neuron")
    with pytest.raises(TypeError, match="Each task must be"):
        merge_submodules(gpt2_model, experts, [3, 4], progress=False)
    bad = perturb(gpt2_model)
    bad["blocks.0.ln1.w"][0] = float("nan")
    with pytest.raises(ValueError, match="expert 1: blocks.0.ln1.w has 1 NaN/Inf"):
        merge_submodules(gpt2_model, [experts[0], bad], random_tasks(gpt2_model, 2), progress=False)


def test_alpha_heatmap_shape():
    table = AlphaTable(["L0.attn", "L0.mlp", "L1.attn"], torch.rand(3, 2, dtype=torch.float64), ["add", "sub"])
    fig = alpha_heatmap(table)
    assert fig.data[0].z.shape == (3, 2)
    assert list(fig.data[0].x) == ["add", "sub"]
    assert table.to_dict()["L0.mlp"] == [float(v) for v in table.values[1]]


@pytest.mark.parametrize("level,row", [("attn_mlp", "L1.mlp"), ("layer", "L1")])
def test_fit_masks_count_only_the_chosen_real_positions(gpt2_model, level, row):
    # As in the token-share test, alpha_t = (positions fitted on task t) / (all fitted positions).
    # Task 0 fits positions 0-1 of 4 rows (8); task 1 fits positions 0-3, but 3-4 are padding, so 0-2 (12):
    # alpha = (8/20, 12/20) = (0.4, 0.6). Chunks of 3 rows check that the fit mask is chunked with the tokens.
    experts = bias_experts(gpt2_model, "mlp.b_out")
    tasks = random_tasks(gpt2_model, 2, batch=4, pos=5)
    attention1 = torch.ones(4, 5, dtype=torch.long)
    attention1[:, 3:] = 0
    fit0, fit1 = torch.zeros(4, 5, dtype=torch.long), torch.zeros(4, 5, dtype=torch.long)
    fit0[:, :2], fit1[:, :4] = 1, 1
    cfg = SubmoduleMergeConfig(level=level, batch_size=3)
    result = merge_submodules(gpt2_model, experts, tasks, cfg, attention_masks=[None, attention1],
                              fit_masks=[fit0, fit1], progress=False)
    assert torch.allclose(result.alphas[row], torch.tensor([0.4, 0.6], dtype=torch.float64), atol=1e-6)
    # all-ones fit masks (or None for a task) are the default fit
    plain = merge_submodules(gpt2_model, experts, tasks, cfg, attention_masks=[None, attention1], progress=False)
    ones = merge_submodules(gpt2_model, experts, tasks, cfg, attention_masks=[None, attention1],
                            fit_masks=[torch.ones(4, 5), None], progress=False)
    assert torch.allclose(ones.alphas.values, plain.alphas.values, atol=1e-9)


def test_model_level_fit_mask_matches_least_squares_on_the_masked_logits(perturb, gpt2_model):
    # Independent reference: torch.linalg.lstsq on the experts' logit changes at the fitted positions only.
    experts = [perturb(gpt2_model, seed=1, scale=0.05), perturb(gpt2_model, seed=2, scale=0.05)]
    tasks = random_tasks(gpt2_model, 2, batch=3, pos=6)
    fits = [torch.zeros(3, 6, dtype=torch.long) for _ in range(2)]
    fits[0][:, 4:], fits[1][:, 2:5] = 1, 1
    result = merge_submodules(gpt2_model, experts, tasks, SubmoduleMergeConfig(level="model"), fit_masks=fits,
                              progress=False)
    target = copy.deepcopy(gpt2_model)
    with torch.no_grad():
        y0 = [gpt2_model(t).double() for t in tasks]
        deltas = []
        for e in experts:
            target.load_state_dict(e)
            deltas.append([target(t).double() - y for t, y in zip(tasks, y0)])
    design = torch.cat([torch.stack([deltas[i][t][fits[t].bool()].reshape(-1) for i in range(2)], 1) for t in range(2)])
    goal = torch.cat([deltas[t][t][fits[t].bool()].reshape(-1) for t in range(2)])
    reference = torch.linalg.lstsq(design, goal.unsqueeze(1)).solution.squeeze(1)
    assert torch.allclose(result.alphas["model"], reference, atol=1e-6)
    unmasked = merge_submodules(gpt2_model, experts, tasks, SubmoduleMergeConfig(level="model"), progress=False)
    assert not torch.allclose(unmasked.alphas["model"], reference, atol=1e-4)  # the mask matters


def test_bad_fit_masks_are_rejected(perturb, gpt2_model):
    experts = [perturb(gpt2_model, seed=1), perturb(gpt2_model, seed=2)]
    tasks = random_tasks(gpt2_model, 2)
    with pytest.raises(ValueError, match="1 fit masks for 2 tasks"):
        merge_submodules(gpt2_model, experts, tasks, fit_masks=[None], progress=False)
    with pytest.raises(ValueError, match="fit_masks need the tasks as token tensors"):
        merge_submodules(gpt2_model, experts, [["1+1=2"], ["2+2=4"]], fit_masks=[torch.ones(1, 5), None],
                         progress=False)


@pytest.fixture(scope="module")
def gemma_experts(gemma):
    """Two experts: small random task vectors on blocks 0-3, every other tensor shared with the base."""
    out = []
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(seed)
        sd = {}
        for k, v in gemma.state_dict().items():
            tuned = k.startswith(tuple(f"blocks.{l}." for l in range(4))) and not is_buffer(k)
            sd[k] = v + 0.02 * v.std() * torch.randn(v.shape, generator=gen) if tuned else v
        out.append(sd)
    return out


@pytest.mark.integration
def test_attn_mlp_merge_on_gemma(gemma, gemma_experts):
    tasks = [[f"{a} + {b} = " for a, b in [(1, 2), (3, 4), (5, 1), (2, 2)]],
             [f"{a} - {b} = " for a, b in [(9, 2), (7, 4), (5, 1), (3, 2)]]]
    result = merge_submodules(gemma, gemma_experts, tasks, SubmoduleMergeConfig(level="attn_mlp", n_samples=4), progress=False)
    assert result.alphas.values.shape == (2 * gemma.cfg.n_layers, 2)
    a = result.alphas
    assert torch.equal(a["L10.mlp"], torch.zeros(2, dtype=torch.float64))  # untouched blocks: G = 0
    assert ((a["L0.attn"] > 0.2) & (a["L0.attn"] < 0.8)).all()  # independent experts: roughly half each
    ref = gemma.state_dict()
    assert result.state_dict.keys() == ref.keys()
    assert all(result.state_dict[k].shape == ref[k].shape for k in ref)
    tokens = gemma.to_tokens("2 + 3 = ")
    params = {k: v for k, v in result.state_dict.items() if not is_buffer(k)}
    assert torch.isfinite(functional_call(gemma, params, (tokens,))).all()
