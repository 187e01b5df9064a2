"""Derived seeds: the table's values are pinned (a changed value would change every draw made with it)."""

from __future__ import annotations

import pytest

from circuits.errors import InputError
from circuits.seeds import SEED_SCHEME, derived_seed

# purpose -> the value the table promises, as the formula the module docstring writes
PINNED = {
    "mean pool": lambda seed, i: seed + 1,
    "test suite": lambda seed, i: seed + 1,
    "af1 prompts": lambda seed, i: seed + 1,
    "shuffled labels": lambda seed, i: seed + 1,
    "expert prompts": lambda seed, i: seed + 7,
    "sft validation": lambda seed, i: seed + 777,
    "sft test suite": lambda seed, i: seed + 12345,
    "random heads": lambda seed, i: seed + i,
    "random subspace": lambda seed, i: seed + i,
    "suite operation": lambda seed, i: seed + 17 * i,
    "validation operation": lambda seed, i: seed + 31 * i,
    "expert task split": lambda seed, i: 10 * seed + i,
    "training operation": lambda seed, i: seed * 1000 + i,
    "epoch order": lambda seed, i: seed * 100_003 + i,
    "restart": lambda seed, i: seed * 1_000_003 + i,
    "merge tensor": lambda seed, i: seed * 1_000_003 + i,
}
INDEXED = [p for p, (_, _, step) in SEED_SCHEME.items() if step]


def test_a_few_values_by_hand():
    assert derived_seed(5, "mean pool") == 6
    assert derived_seed(5, "expert prompts") == 12
    assert derived_seed(0, "sft test suite") == 12345
    assert derived_seed(5, "suite operation", 2) == 39
    assert derived_seed(5, "validation operation", 2) == 67
    assert derived_seed(5, "expert task split", 3) == 53
    assert derived_seed(5, "training operation", 2) == 5002
    assert derived_seed(5, "epoch order", 2) == 500_017
    assert derived_seed(5, "restart", 2) == 5_000_017


def test_the_table_is_exactly_the_pinned_purposes():
    assert set(SEED_SCHEME) == set(PINNED)


@pytest.mark.parametrize("purpose", sorted(PINNED))
def test_every_purpose_gives_its_pinned_value(purpose):
    indices = range(5) if purpose in INDEXED else [0]
    for seed in (0, 1, 7, 42, 123_456):
        for index in indices:
            assert derived_seed(seed, purpose, index) == PINNED[purpose](seed, index)


def test_an_indexed_purpose_gives_each_index_its_own_seed():
    for purpose in INDEXED:
        assert len({derived_seed(3, purpose, i) for i in range(10)}) == 10


def test_an_unknown_purpose_is_refused():
    with pytest.raises(InputError, match="Unknown seed purpose 'mean-pool'"):
        derived_seed(5, "mean-pool")


def test_an_index_for_a_one_draw_purpose_is_refused():
    with pytest.raises(InputError, match="takes no index"):
        derived_seed(5, "mean pool", 1)


@pytest.mark.parametrize("seed, index", [(1.5, 0), (True, 0), ("5", 0), (5, -1)])
def test_seed_and_index_must_be_integers(seed, index):
    with pytest.raises(InputError):
        derived_seed(seed, "epoch order", index)
