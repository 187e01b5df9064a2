"""The process group of a multi-process launch (``accelerate launch``, ``torchrun``), set up in one place.

Sharded edge sweeps (:mod:`patching.edges.distributed`) and data-parallel training
(:mod:`finetune.trainer`) both ask the same question, "which process am I, of how many?",
and both must set the process group up the same way when a launcher started several
processes. :func:`rank_and_world_size` answers it:

* a ``torch.distributed`` group that is already initialised is used as it is;
* otherwise, with ``WORLD_SIZE`` > 1 in the environment (set by the launcher), the group is
  set up through ``accelerate.PartialState``, and with ``init_process_group`` (NCCL on CUDA,
  gloo otherwise) where accelerate leaves it uninitialised: accelerate 1.x treats a CPU launch
  through torchrun as one process;
* otherwise this is the only process: rank 0 of 1.

:func:`end_process_group` ends a launched run: every process waits for the others, then the group
is torn down. A process that simply exits while another still writes its files tears gloo's
threads down under it; the launcher then sees an abort and kills the process that was writing.

Rank and size are always read from ``torch.distributed``, not from ``PartialState``, for the
same reason.
"""

from __future__ import annotations

import os

import torch


def rank_and_world_size() -> tuple[int, int]:
    """(rank, world size) of this process; a launched run's process group is set up on first use."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    from accelerate import PartialState

    PartialState()  # initialises the process group of an accelerate / torchrun launch
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def end_process_group() -> None:
    """Wait for every process of the group, then destroy it; nothing to do for one process.

    Call it on every rank as the last step of a launched run, after the main process has written
    its files, so that no process exits while another is still working.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
