"""What the per-tensor tests against mergekit 0.1.5 share: its method objects called on one tensor group, the
tolerance, seeded random tensors and the shapes they run on.

Importing this module skips the importing test module when mergekit is not installed.
"""

import pytest
import torch

mk_registry = pytest.importorskip("mergekit.merge_methods.registry")
from mergekit.merge_methods.base import TensorGroup  # noqa: E402

SHAPES = [(7,), (5, 8), (3, 4, 6), (16, 16)]


def mergekit(name, tensors, parameters, *, with_base=True):
    """mergekit's ``name`` on one group of ``tensors`` (the first is the base when ``with_base``)."""
    group = TensorGroup.from_tensors(list(tensors), base_index=0 if with_base else None)
    (out,) = mk_registry.get(name)([group], parameters=parameters)
    return out


def close(a, b):
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def randn(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))
