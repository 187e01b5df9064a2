"""patching.node_level.head_ranking: the three ways of combining per-operation rankings, and the recorded rule."""

import pytest
import torch

from circuits.errors import InputError
from circuits.nodes import Head
from patching.node_level.head_ranking import combine_key_heads, given_key_heads, rank_key_heads
from patching.node_level.path_patching import path_patch
from patching.node_level.head_ranking import key_heads
from patching.sweeps.results import NodeScores
from patching import SweepOptions


def _scores(effects, baseline):
    return NodeScores(heads=torch.tensor(effects, dtype=torch.float32), mlps=torch.zeros(2), metric="logit",
                      baseline=baseline, n_prompts=10)


# Effects on the answer logit (negative = a drop). On "+" heads L0H0, L1H1 drop most; on "*" L1H0, L0H0.
# In % of the baselines (10 and 100): "+" L0H0 -50 %, L1H1 -40 %; "*" L1H0 -30 %, L0H0 -20 %, L1H1 -1 %.
PLUS = _scores([[-5.0, 0.0], [-1.0, -4.0]], 10.0)
TIMES = _scores([[-20.0, 0.0], [-30.0, -1.0]], 100.0)


def test_per_op_and_union_keep_each_operations_top_k():
    chosen = combine_key_heads({"+": PLUS, "*": TIMES}, top_k=2, combine="per-op")
    assert chosen.by_op == {"+": [Head(0, 0), Head(1, 1)], "*": [Head(1, 0), Head(0, 0)]}
    assert chosen.heads == [Head(0, 0), Head(1, 1), Head(1, 0)]  # each head once, in operation order
    union = combine_key_heads({"+": PLUS, "*": TIMES}, top_k=2, combine="union")
    assert union.heads == chosen.heads and union.rule["combine"] == "union"


def test_sum_ranks_by_summed_percent_of_each_baseline():
    chosen = combine_key_heads({"+": PLUS, "*": TIMES}, top_k=2, combine="sum")
    # L0H0: -50 - 20 = -70 %; L1H1: -40 - 1 = -41 %; L1H0: -10 - 30 = -40 %: the raw sum would pick L1H0 (-31) second
    assert chosen.heads == [Head(0, 0), Head(1, 1)]
    record = chosen.to_dict()
    assert record["key_heads"] == ["L0H0", "L1H1"] and record["key_heads_rule"]["combine"] == "sum"
    assert record["key_heads_rule"]["ops"] == ["+", "*"] and record["key_heads_rule"]["top_k"] == 2


def test_one_operation_gives_the_same_heads_under_every_rule():
    expected, _ = key_heads(PLUS, top_k=3)
    for combine in ("per-op", "union", "sum"):
        assert combine_key_heads({"+": PLUS}, top_k=3, combine=combine).heads == expected


def test_bad_arguments_are_input_errors_that_list_the_choices():
    with pytest.raises(InputError, match="'per-op', 'union', 'sum'"):
        combine_key_heads({"+": PLUS}, top_k=2, combine="mean")
    with pytest.raises(InputError, match="top_k"):
        combine_key_heads({"+": PLUS}, top_k=0)
    with pytest.raises(InputError, match="at least one"):
        combine_key_heads({}, top_k=2)


def test_given_heads_are_recorded_as_given():
    record = given_key_heads([Head(1, 0)]).to_dict()
    assert record["key_heads"] == ["L1H0"] and record["key_heads_rule"]["source"] == "--heads"


def test_rank_key_heads_path_patches_each_operation(tiny):
    from circuits.tasks import make_dataset

    data = {op: make_dataset(tiny, op=op, n_prompts=6, n_shots=0, seed=i) for i, op in enumerate(("+", "*"))}
    chosen = rank_key_heads(tiny, data, top_k=2, combine="union")
    for op in ("+", "*"):
        assert chosen.by_op[op] == key_heads(path_patch(tiny, data[op],
                                                        options=SweepOptions(progress=False)), top_k=2)[0]
    assert chosen.rule["n_prompts"] == {"+": 6, "*": 6}
