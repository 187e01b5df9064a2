"""Fixtures for the finetune tests.

The unit tests run tiny models for which one thread is fastest: on the shared
2-core machines several test processes oversubscribe the cores, and PyTorch's
intra-op threads then spin against each other (a tiny forward took ~1 s with 2
threads under load and ~5 ms with 1).
"""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import tiny_model


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_gemma():
    """Tiny gemma-style model: RMSNorm before and after, rotary, gated MLP, one KV head (MQA)."""
    return tiny_model(style="gemma", n_layers=2, n_heads=4, d_head=8)


@pytest.fixture(scope="module")
def sft_rows():
    """A small arithmetic SFT set on training templates (one-shot prompts fit the tiny context)."""
    from finetune.data import ArithmeticMix, arithmetic_train_set

    return arithmetic_train_set(tiny_model(), ArithmeticMix(n_examples=48, n_shots=1, seed=3))
