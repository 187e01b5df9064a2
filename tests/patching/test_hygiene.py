"""No hook survives a sweep (even one that raised); bf16, GQA/MQA, and CUDA when present.

Cross-cutting: one contract (hooks removed, dtypes and attention layouts handled) for every node-level sweep
(path, activation and attribution patching, knockout)."""

from __future__ import annotations

import pytest
import torch

from circuits.nodes import Head
from circuits.tasks import make_dataset
from tests.tiny_models import tiny_model
from patching.node_level.activation_patching import activation_patch
from patching.node_level.attribution_patching import attribution_patch
from patching.node_level.knockout_curves import knockout
from patching.node_level.path_patching import path_patch
from patching import SweepOptions


def no_hooks(model) -> bool:
    return all(not hp.fwd_hooks and not hp.bwd_hooks for hp in model.hook_dict.values())


SWEEPS = {  # each takes the metric (default "logit"), no progress bar
    "path_fast": lambda m, d, metric="logit": path_patch(m, d, options=SweepOptions(metric=metric, progress=False)),
    "path_hooks": lambda m, d, metric="logit": path_patch(m, d, method="hooks",
                                                          options=SweepOptions(metric=metric, progress=False)),
    "path_receivers": lambda m, d, metric="logit": path_patch(m, d, receivers=[Head(1, 0)], senders=[Head(0, 1)],
                                                              options=SweepOptions(metric=metric, progress=False)),
    "activation": lambda m, d, metric="logit": activation_patch(m, d, options=SweepOptions(metric=metric,
                                                                                            progress=False)),
    "attribution": lambda m, d, metric="logit": attribution_patch(m, d, options=SweepOptions(metric=metric,
                                                                                              progress=False)),
}


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(style="gemma", n_layers=2)
    return model, make_dataset(model, n_prompts=4, n_shots=0)


@pytest.mark.parametrize("name", SWEEPS)
def test_no_hooks_after_sweep_or_raising_metric(setup, name):
    model, data = setup
    SWEEPS[name](model, data)
    assert no_hooks(model)
    calls = []

    def raising(logits, answers, alt):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("metric failed")
        return logits.gather(-1, answers[:, None])[:, 0]

    with pytest.raises(RuntimeError, match="metric failed"):
        SWEEPS[name](model, data, metric=raising)
    assert no_hooks(model)


@pytest.mark.parametrize("name,clean_calls", [("path_hooks", 2), ("activation", 2), ("attribution", 1)])
def test_no_hooks_after_error_inside_a_hooked_forward(setup, name, clean_calls, monkeypatch):
    model, data = setup
    block = model.blocks[-1]
    original = block.mlp.forward
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) > clean_calls:  # after the plain cached runs, inside a hooked forward
            raise RuntimeError("forward failed")
        return original(*args, **kwargs)

    monkeypatch.setattr(block.mlp, "forward", failing)
    with pytest.raises(RuntimeError, match="forward failed"):
        SWEEPS[name](model, data)
    assert no_hooks(model)


def test_no_hooks_after_knockout(setup):
    model, data = setup
    knockout(model, data, [Head(0, 0)])
    assert no_hooks(model)


@pytest.mark.parametrize("style,kv", [("llama", 2), ("gemma", None)])
def test_bf16_runs_and_tracks_fp32(style, kv):
    model = tiny_model(style=style, n_key_value_heads=kv, n_layers=2)
    data = make_dataset(model, n_prompts=4, n_shots=0)
    fp32 = path_patch(model, data, options=SweepOptions(progress=False))
    model = model.to(torch.bfloat16)
    bf16 = path_patch(model, data, options=SweepOptions(progress=False))
    assert torch.isfinite(bf16.heads).all()
    assert (bf16.heads - fp32.heads).abs().max() < 0.05 + 0.05 * fp32.heads.abs().max()
    assert torch.isfinite(activation_patch(model, data, options=SweepOptions(progress=False)).patched).all()
    assert torch.isfinite(attribution_patch(model, data, options=SweepOptions(progress=False)).heads).all()
    assert 0 <= knockout(model, data, [Head(0, 0)]) <= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    model = tiny_model(style="gemma", n_layers=2)
    data = make_dataset(model, n_prompts=4, n_shots=0)
    cpu = path_patch(model, data, options=SweepOptions(progress=False))
    gpu = path_patch(tiny_model(style="gemma", n_layers=2, device="cuda"), data, options=SweepOptions(progress=False))
    torch.testing.assert_close(cpu.heads, gpu.heads.cpu(), atol=1e-4, rtol=0)
