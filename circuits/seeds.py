"""Seeds derived from a run's one seed: every secondary random draw of the toolkit, in one table.

A run takes one ``seed``. Its main draw (the prompts of a dataset, the shuffle that splits them) uses
that seed itself; every other draw that must not repeat it (a second prompt set, a control's
permutation, one draw per operation or per epoch) uses :func:`derived_seed`, which names the draw by
its purpose. A purpose is one row of the table below, and its value is a fixed affine function of
the seed and an ``index`` (which operation, epoch, restart, layer...):

==========================  ==========================  ==============================================================
purpose                     derived seed                the draw it seeds
==========================  ==========================  ==============================================================
``"mean pool"``             ``seed + 1``                the prompts mean ablations average over, apart from the
                                                        prompts the circuit is chosen and measured on
                                                        (:mod:`patching.edges.circuit_methods`)
``"test suite"``            ``seed + 1``                a run's held-out arithmetic suite, apart from its circuit
                                                        prompts (``experiments.loop``, ``experiments.arithmetic``)
``"af1 prompts"``           ``seed + 1``                the AF1 prompts the cost model times
                                                        (``experiments.cost_model``)
``"shuffled labels"``       ``seed + 1``                the label permutation of a probe's control; its split uses
                                                        ``seed`` (:func:`circuits.analyze.number_geometry.mod_probe`)
``"expert prompts"``        ``seed + 7``                the prompts each merged expert's circuit is found on
                                                        (``experiments.merge``)
``"sft validation"``        ``seed + 777``              precise SFT's validation suite (``experiments.precise_sft``)
``"sft test suite"``        ``seed + 12345``            precise SFT's test suite (``experiments.precise_sft``)
``"random heads"``          ``seed + index``            random head set ``index`` of a knockout curve
                                                        (:mod:`patching.node_level.knockout_curves`)
``"random subspace"``       ``seed + index``            the random subspace of layer ``index``
                                                        (``experiments.numbers``)
``"suite operation"``       ``seed + 17 * index``       operation ``index`` of :func:`finetune.evaluate.math_suite`
``"validation operation"``  ``seed + 31 * index``       operation ``index`` of
                                                        :func:`finetune.evaluate.validation_suite`
``"expert task split"``     ``10 * seed + index``       split ``index`` (1 train, 2 validation, 3 test) of
                                                        :func:`finetune.expert_tasks.expert_task_data`
``"training operation"``    ``1000 * seed + index``     operation ``index`` of
                                                        :func:`finetune.data.arithmetic_train_set`
``"epoch order"``           ``100003 * seed + index``   the order examples are visited in epoch ``index``
                                                        (:func:`finetune.data.epoch_order`)
``"restart"``               ``1000003 * seed + index``  restart ``index`` of a learned circuit
                                                        (:func:`patching.edges.learn.restart_seed`)
``"merge tensor"``          ``1000003 * seed + index``  the random draws of one tensor of a merge, ``index`` the
                                                        CRC-32 of its name (:mod:`merging.apply`, which reduces the
                                                        seed mod 2**63)
==========================  ==========================  ==============================================================

Why these values: a constant offset only has to keep a second draw off the main one, and the
draws of different purposes feed different generators (a pool of prompts, a permutation), so
purposes may share an offset. An indexed purpose must give every index of one run its own seed: a
step (17, 31) spreads the operations of one suite apart, and a multiplier larger than any index
(10 for three splits, 1000 operations, 100003 epochs, 1000003 restarts) also keeps two runs' seeds
apart, so no two (seed, index) pairs share a value while the index stays below the multiplier.
A purpose's value never changes, so a saved result is reproduced draw for draw; a new draw is a
new row.
"""

from __future__ import annotations

import numbers
from typing import Literal

from circuits.arguments import check_nonnegative_int, check_option
from circuits.errors import InputError

SeedPurpose = Literal[
    "mean pool", "test suite", "af1 prompts", "shuffled labels", "expert prompts", "sft validation",
    "sft test suite", "random heads", "random subspace", "suite operation", "validation operation",
    "expert task split", "training operation", "epoch order", "restart", "merge tensor",
]

# purpose -> (multiplier, offset, index step): the derived seed is multiplier * seed + offset + step * index.
# A purpose whose step is 0 is one draw and takes no index.
SEED_SCHEME: dict[str, tuple[int, int, int]] = {
    "mean pool": (1, 1, 0),
    "test suite": (1, 1, 0),
    "af1 prompts": (1, 1, 0),
    "shuffled labels": (1, 1, 0),
    "expert prompts": (1, 7, 0),
    "sft validation": (1, 777, 0),
    "sft test suite": (1, 12345, 0),
    "random heads": (1, 0, 1),
    "random subspace": (1, 0, 1),
    "suite operation": (1, 0, 17),
    "validation operation": (1, 0, 31),
    "expert task split": (10, 0, 1),
    "training operation": (1000, 0, 1),
    "epoch order": (100_003, 0, 1),
    "restart": (1_000_003, 0, 1),
    "merge tensor": (1_000_003, 0, 1),
}


def derived_seed(seed: int, purpose: SeedPurpose, index: int = 0) -> int:
    """The seed of the draw named ``purpose`` (the module's table) in a run seeded ``seed``; ``index`` picks one
    draw of an indexed purpose (an operation, an epoch, a restart...).

    ``derived_seed(5, "mean pool") == 6``; ``derived_seed(5, "epoch order", 2) == 500017``. An unknown purpose,
    a seed that is not an integer, a negative index, or an index given to a purpose that has none raises
    :class:`circuits.errors.InputError`.
    """
    check_option("seed purpose", purpose, SeedPurpose)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise InputError(f"seed must be an integer, got {seed!r}.")
    index = check_nonnegative_int(index, "index")
    multiplier, offset, step = SEED_SCHEME[purpose]
    if step == 0 and index:
        raise InputError(f"The seed purpose {purpose!r} is one draw (seed + {offset}) and takes no index, got {index}.")
    return multiplier * int(seed) + offset + step * index
