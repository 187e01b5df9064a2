"""CUDA tier: every package's main entry point gives on a GPU what it gives on the CPU.

Skipped without CUDA (CI has none); run on a GPU machine with ``python -m pytest tests/test_cuda.py``.
Tiny random models only, so the tier needs no model download: the comparison is CPU fp32 vs
CUDA fp32 (tolerances for float reordering on the GPU), plus bf16 runs that must stay finite.

Cross-cutting: CUDA against CPU across every package.
"""

from __future__ import annotations

import pytest
import torch
from transformer_lens import patching as tl_patching

from circuits.nodes import Head, MLP
from circuits.tasks import make_dataset, single_batch
from tests.tiny_models import tiny_model
from patching import SweepOptions

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

STYLES = [("gpt2", None), ("llama", 2), ("gemma", None)]


def _pair(style, kv, **kwargs):
    """The same tiny model on the CPU and on CUDA."""
    cpu = tiny_model(style=style, n_key_value_heads=kv, **kwargs)
    gpu = tiny_model(style=style, n_key_value_heads=kv, device="cuda", **kwargs)
    return cpu, gpu


@pytest.mark.parametrize("style,kv", STYLES, ids=[s for s, _ in STYLES])
def test_activation_patching_with_prefix_reuse(style, kv):
    from patching.node_level.activation_patching import activation_patch

    cpu, gpu = _pair(style, kv, n_layers=3)
    data = make_dataset(cpu, n_prompts=4, n_shots=2, template_ids=("add-equation-0",), seed=4)
    batch = single_batch(data)
    got_cpu = activation_patch(cpu, batch, component="z", options=SweepOptions(progress=False))
    got_gpu = activation_patch(gpu, batch, component="z", options=SweepOptions(progress=False))
    torch.testing.assert_close(got_gpu.patched.cpu(), got_cpu.patched, atol=1e-4, rtol=0)
    # and against TransformerLens on the GPU
    tokens, cf = batch.tokens.cuda(), batch.cf_tokens.cuda()
    answers = batch.answer_ids.cuda()
    _, cf_cache = gpu.run_with_cache(cf)
    expected = tl_patching.get_act_patch_attn_head_out_all_pos(
        gpu, tokens, cf_cache, lambda lg: lg[torch.arange(len(answers)), -1, answers].mean())
    torch.testing.assert_close(got_gpu.patched.cpu(), expected.float().cpu(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("style,kv", STYLES, ids=[s for s, _ in STYLES])
def test_path_attribution_knockout(style, kv):
    from patching.node_level.attribution_patching import attribution_patch
    from patching.node_level.knockout_curves import knockout
    from patching.node_level.path_patching import path_patch

    cpu, gpu = _pair(style, kv)
    data = make_dataset(cpu, n_prompts=6, n_shots=0, seed=1)
    for fn in (path_patch, attribution_patch):
        a, b = fn(cpu, data, options=SweepOptions(progress=False)), fn(gpu, data, options=SweepOptions(progress=False))
        torch.testing.assert_close(b.heads.cpu(), a.heads, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b.mlps.cpu(), a.mlps, atol=1e-4, rtol=1e-4)
    nodes = [Head(0, 1), MLP(1)]
    assert knockout(gpu, data, nodes) == pytest.approx(knockout(cpu, data, nodes), abs=1e-6)


def test_bf16_sweeps_are_finite():
    from patching.node_level.activation_patching import activation_patch
    from patching.node_level.path_patching import path_patch

    model = tiny_model(style="gemma", device="cuda").to(torch.bfloat16)
    model.cfg.dtype = torch.bfloat16
    data = make_dataset(model, n_prompts=4, n_shots=2, template_ids=("add-equation-0",), seed=4)
    assert torch.isfinite(path_patch(model, data, options=SweepOptions(progress=False)).heads).all()
    assert torch.isfinite(activation_patch(model, data, component="z",
                                           options=SweepOptions(progress=False)).patched).all()


@pytest.mark.parametrize("method", ["precise", "full", "lora", "circuit_lora"])
def test_training_step_matches_cpu(method):
    from finetune.data import ArithmeticMix, arithmetic_train_set
    from finetune import TrainConfig
    from finetune.trainer import train

    cpu, gpu = _pair("gemma", None)
    rows = arithmetic_train_set(cpu, ArithmeticMix(n_examples=16, n_shots=1, seed=3))
    config = TrainConfig(lr=5e-3, batch_size=8, micro_batch_size=4, max_steps=2, progress=False)
    heads = [Head(0, 1), Head(1, 2)] if method in ("precise", "circuit_lora") else None
    a = train(cpu, rows, config, method=method, heads=heads)
    b = train(gpu, rows, config, method=method, heads=heads)
    assert b.losses == pytest.approx(a.losses, rel=1e-4)
    for (name, x), y in zip(cpu.state_dict().items(), gpu.state_dict().values()):
        torch.testing.assert_close(y.cpu(), x, atol=1e-4, rtol=1e-3, msg=name)
    if method in ("precise", "circuit_lora"):  # an unselected head's slice stays bit-identical on the GPU too
        base = tiny_model(style="gemma").state_dict()
        assert torch.equal(gpu.state_dict()["blocks.0.attn.W_Q"][0].cpu(), base["blocks.0.attn.W_Q"][0])


def test_merges_on_cuda_match_cpu():
    from merging import SubmoduleMergeConfig, merge, merge_submodules
    from merging.methods import CONFIGS, METHODS, REGISTRY
    from merging.state_dicts import is_buffer

    model = tiny_model(style="gemma")
    gen = torch.Generator().manual_seed(0)
    base = model.state_dict()
    experts = [{k: v if is_buffer(k) else v + 0.02 * torch.randn(v.shape, generator=gen) for k, v in base.items()}
               for _ in range(2)]
    for name in METHODS:
        inputs = experts[:REGISTRY[name].max_experts]
        a = merge(name, base, inputs, CONFIGS[name](), progress=False)
        b = merge(name, base, inputs, CONFIGS[name](), device="cuda", progress=False)
        for key in a:
            torch.testing.assert_close(b[key].cpu(), a[key].cpu(), atol=1e-5, rtol=1e-5, msg=f"{name}: {key}")
    tasks = [torch.randint(3, model.cfg.d_vocab, (4, 6), generator=gen) for _ in range(2)]
    cfg = SubmoduleMergeConfig(batch_size=2)
    on_cpu = merge_submodules(model, experts, tasks, cfg, progress=False)
    on_gpu = merge_submodules(tiny_model(style="gemma", device="cuda"), experts, [t.cuda() for t in tasks], cfg,
                              progress=False)
    torch.testing.assert_close(on_gpu.alphas.values.cpu(), on_cpu.alphas.values, atol=1e-4, rtol=1e-4)
    assert all(v.device.type == "cpu" for v in on_gpu.state_dict.values())
    model_level = merge_submodules(tiny_model(style="gemma", device="cuda"), experts, [t.cuda() for t in tasks],
                                   SubmoduleMergeConfig(level="model", batch_size=2), progress=False)
    assert all(v.device.type == "cpu" for v in model_level.state_dict.values())


def test_attention_reads_and_probes():
    from circuits.analyze.attention import attention_reads
    from circuits.analyze.probes import probe_mlps

    cpu, gpu = _pair("gemma", None)
    data = make_dataset(cpu, n_prompts=4, n_shots=1, seed=2)
    torch.testing.assert_close(attention_reads(gpu, data, progress=False).scores.cpu(),
                               attention_reads(cpu, data, progress=False).scores, atol=1e-5, rtol=0)
    a, b = probe_mlps(cpu, data, progress=False), probe_mlps(gpu, data, progress=False)
    for stream in a.cos:
        torch.testing.assert_close(b.cos[stream].cpu(), a.cos[stream], atol=1e-4, rtol=0)


@pytest.mark.parametrize("style,kv", [("llama", 2), ("gemma", None)])
def test_af1_runner_matches_cpu(style, kv):
    """CAMA means + ABP masks + the END-only AF1 forward: end logits on CUDA equal the CPU's."""
    from fractions import Fraction

    from datasets import Dataset

    from circuits.tasks import make_row
    from circuits.templates import Template
    from patching.all_for_one import AF1Config, AF1Runner
    from patching.all_for_one.template_prompts import split_fit_eval

    cpu, gpu = _pair(style, kv, n_layers=3)
    template = Template("t-eq", "+", "equation", "{A}[+]{B}=")
    rows = [make_row(cpu.tokenizer, template, Fraction(a), Fraction(b)) for a in range(6) for b in range(6)]
    fit, ev = split_fit_eval(Dataset.from_list(rows), 0.5, seed=0)
    runners = [AF1Runner(m, fit, ev, AF1Config()) for m in (cpu, gpu)]
    for wait, transfer in [(0, 3), (1, 1), (2, 0)]:
        for a, b in zip(runners[0].end_logits(wait, transfer), runners[1].end_logits(wait, transfer)):
            torch.testing.assert_close(b.cpu(), a, atol=1e-4, rtol=1e-4)
