"""Circuit-aware merging: the per-layer level plan, and the merge it drives on tiny models."""

import pytest
import torch

from circuits.nodes import Head
from tests.tiny_models import tiny_model
from merging import SubmoduleMergeConfig, merge_submodules
from merging.circuit_aware import circuit_levels, merge_circuit_aware
from merging.state_dicts import is_buffer


def test_circuit_levels_plan():
    plan = circuit_levels([Head(1, 0), Head(3, 2), Head(1, 3)], 5)
    assert plan == {0: "attn_mlp", 1: "head", 2: "attn_mlp", 3: "head", 4: "attn_mlp"}
    assert circuit_levels([], 2) == {0: "attn_mlp", 1: "attn_mlp"}
    assert circuit_levels([Head(0, 0)], 2, inside="attn_mlp", outside="layer") == {0: "attn_mlp", 1: "layer"}


@pytest.mark.parametrize("heads,level", [([Head(5, 0)], None), ([Head(0, 0)], "model"), ([Head(0, 0)], "bogus")])
def test_circuit_levels_rejects_bad_input(heads, level):
    with pytest.raises(ValueError):
        if level is None:
            circuit_levels(heads, 2)
        else:
            circuit_levels(heads, 2, inside=level)


@pytest.mark.parametrize("style", ["gpt2", "gemma"])
def test_merge_runs_with_head_alphas_only_in_key_layers(style, perturb):
    model = tiny_model(style=style, seed=0)
    experts = [perturb(model, seed=1), perturb(model, seed=2)]
    gen = torch.Generator().manual_seed(0)
    tasks = [torch.randint(3, model.cfg.d_vocab, (4, 6), generator=gen) for _ in range(2)]
    cfg = SubmoduleMergeConfig(batch_size=2)
    result = merge_circuit_aware(model, experts, tasks, [Head(1, 2)], cfg, progress=False)
    names = result.alphas.names
    assert [n for n in names if n.startswith("L1H")] == [f"L1H{h}" for h in range(model.cfg.n_heads)]
    assert not any(n.startswith("L0H") for n in names)
    assert {"L0.attn", "L0.mlp", "L1.attn", "L1.mlp"} <= set(names)
    # the same as merge_submodules with the explicit plan, and loadable into the architecture
    same = merge_submodules(model, experts, tasks, cfg, levels={0: "attn_mlp", 1: "head"}, progress=False)
    assert torch.equal(result.alphas.values, same.alphas.values)
    target = tiny_model(style=style, seed=9)
    target.load_state_dict(result.state_dict)
    assert all(torch.isfinite(v).all() for k, v in result.state_dict.items() if not is_buffer(k))
