"""Shared fixtures for every package's tests.

Importing this file sets ``HF_HUB_OFFLINE=1`` (unless the caller set it), so no
test ever waits on the Hugging Face hub. Fixtures are lazy: nothing slow runs
unless a test asks for it.

* ``gemma``: the real gemma-3-270m, fp32 on CPU, unprocessed, loaded once per
  session (~10 s from the cache, ~60 s the very first time on a machine).
  Integration tests share it; they must not modify its weights in place
  (copy with ``copy.deepcopy`` or reload first).
* ``tiny``: a fresh tiny random model with a character tokenizer (milliseconds).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """torch's thread count as it was before each test: an experiment run with ``--threads 1`` sets it for the whole
    process, and every later test (the gemma ones included) then ran on one thread. torch is not imported here: a
    test that checks an import stays torch-free is not disturbed."""
    torch = sys.modules.get("torch")
    before = None if torch is None else torch.get_num_threads()
    yield
    if before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def gemma():
    """gemma-3-270m as a HookedTransformer (fp32, CPU, unprocessed), shared by the session."""
    from circuits.loading import load_model

    return load_model("gemma-3-270m", device="cpu", dtype="float32")


@pytest.fixture
def tiny():
    """A tiny random gpt2-style HookedTransformer with a character tokenizer."""
    from tests.tiny_models import tiny_model

    return tiny_model()
