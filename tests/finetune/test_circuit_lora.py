"""finetune.circuit_lora: adapters on the selected heads' and MLPs' slices only, merged back exactly."""

import copy

import pytest
import torch

from circuits.errors import InputError
from circuits.nodes import MLP, Head
from finetune import CircuitLoraSFTConfig, load_tuned
from finetune.circuit_lora import attach_circuit_lora, circuit_lora_slices, merge_circuit_lora
from finetune.lora import LoraSettings
from finetune.trainer import train

CFG = CircuitLoraSFTConfig(lr=2e-2, batch_size=8, micro_batch_size=4, max_steps=4, weight_decay=0.1, progress=False,
                           lora=LoraSettings(r=2))


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _changed_entries(model, before) -> dict[str, torch.Tensor]:
    """Per parameter that changed, the boolean map of its changed entries."""
    return {n: v.ne(before[n]) for n, v in model.state_dict().items() if not torch.equal(v, before[n])}


def test_only_the_selected_heads_and_mlps_change(sft_rows, tiny_gemma, tmp_path):
    before, base = _state(tiny_gemma), copy.deepcopy(tiny_gemma)
    heads, mlps = [Head(1, 0), Head(1, 2)], [MLP(0)]
    result = train(tiny_gemma, sft_rows, CFG, heads=heads, mlps=mlps, out_dir=tmp_path)
    assert result.method == "circuit_lora"
    assert set(tiny_gemma.state_dict()) == set(before)  # parametrizations gone, names unchanged
    changed = _changed_entries(tiny_gemma, before)
    assert set(changed) == {"blocks.1.attn.W_Q", "blocks.1.attn.W_O", "blocks.1.attn._W_K", "blocks.1.attn._W_V",
                            "blocks.0.mlp.W_in", "blocks.0.mlp.W_gate", "blocks.0.mlp.W_out"}
    for name in ("blocks.1.attn.W_Q", "blocks.1.attn.W_O"):
        rows_changed = changed[name].flatten(1).any(1)
        assert rows_changed.tolist() == [True, False, True, False]  # heads 1 and 3 bit-identical
    assert changed["blocks.1.attn._W_K"].any()  # the one KV head (MQA) that both selected heads read
    assert {s.name for s in result.selection.slices} == set(changed)
    # the final selection's rows are the ones a tuned checkpoint stores
    assert dict((s.name, s.index) for s in result.selection.slices)["blocks.1.attn.W_Q"] == (0, 2)
    load_tuned(base, tmp_path / "final")
    assert all(torch.equal(v, tiny_gemma.state_dict()[n]) for n, v in base.state_dict().items())


def test_adapter_count_is_the_selected_slices_factors(tiny_gemma):
    cfg = tiny_gemma.cfg
    settings = LoraSettings(r=3, targets=("attn.W_Q", "attn.W_O", "mlp.W_out"))
    selection = circuit_lora_slices(tiny_gemma, [Head(0, 1), Head(1, 3), Head(1, 0)], [MLP(1)], settings)
    assert [(s.name, s.index) for s in selection.slices] == [
        ("blocks.0.attn.W_Q", (1,)), ("blocks.0.attn.W_O", (1,)), ("blocks.1.attn.W_Q", (0, 3)),
        ("blocks.1.attn.W_O", (0, 3)), ("blocks.1.mlp.W_out", None)]
    names = attach_circuit_lora(tiny_gemma, selection, settings, seed=1)
    params = dict(tiny_gemma.named_parameters())
    assert len(names) == 2 * len(selection.slices) and all(params[n].requires_grad for n in names)
    assert sum(p.requires_grad for p in tiny_gemma.parameters()) == len(names)
    r, d_model, d_head, d_mlp = 3, cfg.d_model, cfg.d_head, cfg.d_mlp
    per_head = r * (d_model + d_head)  # W_Q [d_model, d_head] and W_O [d_head, d_model] alike
    expected = 3 * per_head * 2 + r * (d_mlp + d_model)
    assert sum(params[n].numel() for n in names) == expected
    merge_circuit_lora(tiny_gemma)
    assert not any(".lora_" in n for n, _ in tiny_gemma.named_parameters())


def test_untrained_adapters_change_nothing_and_merge_is_exact(tiny_gemma):
    tokens = torch.tensor([[1, 5, 9, 3, 7]])
    before, logits = _state(tiny_gemma), tiny_gemma(tokens)
    selection = circuit_lora_slices(tiny_gemma, [Head(0, 2)])
    attach_circuit_lora(tiny_gemma, selection)
    assert torch.equal(tiny_gemma(tokens), logits)  # B starts at zero
    adapter = tiny_gemma.blocks[0].attn.parametrizations.W_Q[0]
    with torch.no_grad():
        adapter.lora_B.fill_(0.5)
        expected = tiny_gemma.blocks[0].attn.W_Q.detach().clone()  # read through the parametrization
    merge_circuit_lora(tiny_gemma)
    assert torch.equal(tiny_gemma.blocks[0].attn.W_Q, expected)
    changed = _changed_entries(tiny_gemma, before)["blocks.0.attn.W_Q"].flatten(1).any(1)
    assert changed.tolist() == [False, False, True, False]


def test_bad_circuit_lora_arguments(tiny_gemma, sft_rows):
    with pytest.raises(InputError, match="No weight of the given heads/MLPs matches the LoRA targets"):
        circuit_lora_slices(tiny_gemma, [Head(0, 0)], settings=LoraSettings(targets=("mlp.W_in",)))
    with pytest.raises(InputError, match=r"LoraSettings.layers=\(0,\) is for LoRA on every head"):
        circuit_lora_slices(tiny_gemma, [Head(0, 0)], settings=LoraSettings(layers=(0,)))
    with pytest.raises(InputError, match="precise_selection needs at least one Head or MLP"):
        train(tiny_gemma, sft_rows, CFG)
    with pytest.raises(InputError, match="carries no circuit LoRA adapters to merge"):
        merge_circuit_lora(tiny_gemma)
    selection = circuit_lora_slices(tiny_gemma, [Head(0, 0)])
    attach_circuit_lora(tiny_gemma, selection)
    with pytest.raises(InputError, match="already carries circuit LoRA adapters"):
        attach_circuit_lora(tiny_gemma, selection)
