"""circuits.process_group: one answer to "which process am I, of how many?" for patching and finetune."""

import socket

import torch.distributed as dist

from circuits.process_group import end_process_group, rank_and_world_size


def test_a_plain_process_is_rank_0_of_1(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not dist.is_initialized()
    assert rank_and_world_size() == (0, 1)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert rank_and_world_size() == (0, 1) and not dist.is_initialized()  # nothing is set up for one process


def test_an_initialised_group_is_used_as_it_is(monkeypatch):
    import accelerate

    # WORLD_SIZE says "launched", but the group exists already: nothing may be set up again
    monkeypatch.setenv("WORLD_SIZE", "2")
    def set_up_again(*args, **kwargs):
        raise AssertionError("the process group was set up again")

    monkeypatch.setattr(accelerate, "PartialState", set_up_again)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        assert rank_and_world_size() == (dist.get_rank(), dist.get_world_size()) == (0, 1)
    finally:
        dist.destroy_process_group()


def test_ending_the_group_tears_it_down_and_is_a_no_op_without_one():
    end_process_group()  # no group: nothing to do, nothing raised
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    end_process_group()
    assert not dist.is_initialized()
