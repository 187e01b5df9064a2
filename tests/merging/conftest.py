"""Shared fixtures: tiny random models and experts made by perturbing them."""

import pytest
import torch

from tests.tiny_models import tiny_model
from merging.state_dicts import is_buffer


def perturbed(model, scale: float = 0.02, seed: int = 1, only=None) -> dict:
    """The model's state dict plus a small random task vector (on keys containing ``only``, if given)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in model.state_dict().items():
        if is_buffer(k) or (only is not None and only not in k):
            out[k] = v.clone()
        else:
            out[k] = v + scale * torch.randn(v.shape, generator=gen)
    return out


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: thread start-up costs more than it saves on the shared 2-core machines."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def perturb():
    """:func:`perturbed` as a fixture (test modules cannot import conftest)."""
    return perturbed


@pytest.fixture(scope="module")
def gpt2_model():
    return tiny_model(style="gpt2", seed=0)


@pytest.fixture(scope="module")
def gemma_model():
    return tiny_model(style="gemma", seed=0)


@pytest.fixture(scope="module")
def gpt2_target():
    """A second gpt2-style model to load merged state dicts into."""
    return tiny_model(style="gpt2", seed=9)


@pytest.fixture(scope="module")
def gemma_target():
    """A second gemma-style model to load merged state dicts into."""
    return tiny_model(style="gemma", seed=9)
