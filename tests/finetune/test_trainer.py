"""finetune.trainer: what trains and what stays bit-identical, the answer loss, determinism, resume after an
interruption, non-finite losses; data-parallel training under ``accelerate launch`` (two CPU processes,
about 20-40 s) and, in the integration tier, precise SFT on gemma-3-270m.

accelerate 1.x starts a *single* process for ``--cpu --num_processes 2`` unless an MPI
hostfile is given; ``--multi_gpu --num_processes 2`` on a machine without CUDA starts two
processes through torchrun, with the gloo backend, which is what a CPU test needs."""

import copy
import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from circuits.nodes import MLP, Head
from tests.launch import launch_two_processes
from tests.tiny_models import tiny_model
from finetune.checkpoints import CheckpointError, list_checkpoints, load_tuned
from finetune.data import collate
from finetune import TrainConfig
from finetune.trainer import answer_loss, train, NonFiniteLossError
from finetune import ArithmeticMix, arithmetic_train_set


CFG = TrainConfig(lr=5e-3, batch_size=8, micro_batch_size=4, max_steps=6, weight_decay=0.1, progress=False)


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("style", ["gemma", "gpt2"])
def test_unselected_entries_bit_identical_after_training(style, sft_rows):
    model = tiny_model(style=style, n_layers=2)
    before = _state(model)
    heads, mlps = [Head(0, 2), Head(1, 0), Head(1, 3)], [MLP(1)]
    result = train(model, sft_rows, CFG, method="precise", heads=heads, mlps=mlps)
    after = model.state_dict()
    tuned = {s.name: s.index for s in result.selection.slices}
    n_changed = 0
    for name, value in after.items():
        if name not in tuned:
            assert torch.equal(value, before[name]), f"{name} changed but was not selected"
            continue
        rows = tuned[name]
        if rows is None:
            n_changed += int(not torch.equal(value, before[name]))
            continue
        others = [r for r in range(value.shape[0]) if r not in rows]
        assert torch.equal(value[others], before[name][others]), f"unselected rows of {name} changed"
        n_changed += int(not torch.equal(value[list(rows)], before[name][list(rows)]))
    assert n_changed >= len(tuned) - 2  # (almost) every selected tensor moved: the test can fail both ways
    assert result.n_trainable < result.n_parameters


def test_answer_loss_scores_only_answer_tokens(tiny):
    rows = [{"input_ids": [1, 10, 11, 12, 13, 14], "n_prompt": 4}, {"input_ids": [1, 20, 21, 22], "n_prompt": 3}]
    logits = [tiny(torch.tensor([r["input_ids"][:-1]]))[0] for r in rows]
    manual = [F.cross_entropy(lg[r["n_prompt"] - 1:], torch.tensor(r["input_ids"][r["n_prompt"]:])) for lg, r in zip(logits, rows)]
    torch.testing.assert_close(answer_loss(tiny, rows, 2), sum(manual) / 2)
    tokens, mask = collate(rows, 0)
    assert mask.tolist() == [[False, False, False, True, True], [False, False, True, False, False]]


def test_runs_are_deterministic(sft_rows):
    a, b = tiny_model(style="gemma"), tiny_model(style="gemma")
    train(a, sft_rows, CFG, method="full")
    train(b, sft_rows, CFG, method="full")
    for (n, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), n


class Interrupt(Exception):
    pass


def _interrupt_at(n):
    def on_step(step, loss):
        if step == n:
            raise Interrupt

    return on_step


@pytest.mark.parametrize("method", ["precise", "full", "lora"])
def test_resume_after_interruption_is_bit_exact(method, sft_rows, tmp_path):
    heads = [Head(0, 1), Head(1, 2)] if method == "precise" else None
    config = TrainConfig(**{**CFG.__dict__, "checkpoint_every": 2})
    reference = tiny_model(style="gemma")
    train(reference, sft_rows, config, method=method, heads=heads)

    model = tiny_model(style="gemma")
    with pytest.raises(Interrupt):
        train(model, sft_rows, config, method=method, heads=heads, out_dir=tmp_path, on_step=_interrupt_at(3))
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]
    fresh = tiny_model(style="gemma")  # a new process would start from the base weights
    result = train(fresh, sft_rows, config, method=method, heads=heads, out_dir=tmp_path)
    assert result.resumed_from is not None and len(result.losses) == config.max_steps
    after = fresh.state_dict()
    for name, x in reference.state_dict().items():
        assert torch.equal(x, after[name]), f"{method}: {name} differs after resume"


def test_final_tuned_tensors_rebuild_the_model(sft_rows, tmp_path):
    model = tiny_model(style="gemma")
    result = train(model, sft_rows, CFG, method="precise", heads=[Head(1, 1)], out_dir=tmp_path)
    size = sum(f.stat().st_size for f in (tmp_path / "final").iterdir())
    assert size < 0.5 * sum(v.numel() * 4 for v in model.state_dict().values())  # slices only
    rebuilt = tiny_model(style="gemma")
    load_tuned(rebuilt, result.out_dir / "final")
    for (name, x), y in zip(model.state_dict().items(), rebuilt.state_dict().values()):
        assert torch.equal(x, y), name


def test_resume_refuses_a_different_run(sft_rows, tmp_path):
    config = TrainConfig(**{**CFG.__dict__, "checkpoint_every": 2})
    with pytest.raises(Interrupt):
        train(tiny_model(), sft_rows, config, method="full", out_dir=tmp_path, on_step=_interrupt_at(3))
    other = TrainConfig(**{**config.__dict__, "lr": 1e-3})
    with pytest.raises(CheckpointError, match="different run"):
        train(tiny_model(), sft_rows, other, method="full", out_dir=tmp_path)


def test_bad_arguments(sft_rows, tiny):
    with pytest.raises(ValueError, match="Unknown method"):
        train(tiny, sft_rows, CFG, method="adapter")
    with pytest.raises(ValueError, match="only used by method='precise' and 'circuit_lora'"):
        train(tiny, sft_rows, CFG, method="full", heads=[Head(0, 0)])
    with pytest.raises(ValueError, match="fewer than one batch"):
        train(tiny, sft_rows.select(range(3)), CFG, method="full")


def test_token_ids_outside_the_vocabulary_or_not_whole_are_refused(sft_rows, tiny):
    """An id past the vocabulary was an IndexError in the embedding; float ids were truncated without a word."""
    from datasets import Dataset

    rows = sft_rows.to_list()
    vocab = tiny.cfg.d_vocab
    far = [dict(r) for r in rows]
    far[5]["input_ids"] = list(far[5]["input_ids"][:-1]) + [vocab + 3]
    with pytest.raises(ValueError, match=rf"train_dataset row 5: input_ids hold \[{vocab + 3}\] outside the model's "
                                         rf"vocabulary 0..{vocab - 1}"):
        train(tiny, Dataset.from_list(far), CFG, method="full")
    floats = [dict(r, input_ids=[float(t) + 0.5 for t in r["input_ids"]]) for r in rows]
    with pytest.raises(ValueError, match=r"train_dataset row 0: input_ids hold \[.*\] \(float\); token ids are whole "
                                         r"numbers"):
        train(tiny, Dataset.from_list(floats), CFG, method="full")
    assert all(p.grad is None for p in tiny.parameters())


def _current_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_peak_rss_is_this_runs_own(sft_rows):
    import os

    from circuits.peak_memory import peak_rss, reset_peak_rss

    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("the peak-RSS mark cannot be reset on this system")
    reset_peak_rss()  # the earlier peak below is the ballast's, not an earlier test's
    ballast = bytearray(768 * 2**20)  # an earlier peak in the same process, then freed
    ballast[::4096] = b"x" * len(ballast[::4096])
    earlier_peak = peak_rss(since_reset=True)
    del ballast
    if _current_rss() > earlier_peak - 512 * 2**20:  # the allocator kept the freed pages: nothing to tell apart
        pytest.skip("the freed ballast was not returned to the system in this process")
    result = train(tiny_model(style="gemma"), sft_rows, CFG, method="precise", heads=[Head(0, 1)])
    assert 0 < result.peak_rss_bytes < earlier_peak - 512 * 2**20


# the settings the test below was written with (checkpoints every 2 steps, 3 kept), beside CFG above
CHECKPOINTED_CFG = TrainConfig(lr=5e-3, batch_size=8, micro_batch_size=4, max_steps=6, checkpoint_every=2,
                               keep_checkpoints=3, progress=False)


def test_non_finite_loss_stops_training_without_final_weights(sft_rows, tmp_path):
    model = tiny_model(style="gemma")
    with torch.no_grad():
        model.unembed.W_U[0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match="Step 1: the loss is nan"):
        train(model, sft_rows, CHECKPOINTED_CFG, method="full", out_dir=tmp_path)
    assert not (tmp_path / "final").exists()


HERE = Path(__file__).parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="the two-process launch is a CPU (gloo) check")
def test_two_process_run_matches_single_process(tmp_path):
    from tests.finetune import ddp_train_script as script

    launch_two_processes(HERE / "ddp_train_script.py", str(tmp_path), port=29731, timeout=180)
    info = json.loads((tmp_path / "losses.json").read_text())
    assert info["world"] == 2
    ddp = load_file(str(tmp_path / "weights.safetensors"))

    single, result = script.run(tmp_path / "single")
    base = tiny_model(style="gemma").state_dict()
    tuned = {s.name: s.index for s in result.selection.slices}
    for name, value in single.state_dict().items():
        # Same update up to float summation order across processes.
        torch.testing.assert_close(ddp[name], value, rtol=1e-4, atol=1e-5, msg=name)
        if name not in tuned:
            assert torch.equal(ddp[name], base[name]), f"{name} changed under DDP"
    assert not torch.equal(ddp["blocks.0.attn.W_Q"][1], base["blocks.0.attn.W_Q"][1])
    assert torch.equal(ddp["blocks.0.attn.W_Q"][0], base["blocks.0.attn.W_Q"][0])
    assert len(info["losses"]) == len(result.losses)
    assert (tmp_path / "run" / "final" / "weights.safetensors").is_file()


@pytest.mark.integration
def test_precise_sft_on_gemma_touches_only_the_key_heads(gemma, tmp_path):
    model = copy.deepcopy(gemma)  # the session fixture must stay unmodified
    data = arithmetic_train_set(model, ArithmeticMix(n_examples=8, n_shots=1, styles=("equation",)))
    heads = [Head(9, 1), Head(9, 3)]
    config = TrainConfig(lr=1e-4, batch_size=4, micro_batch_size=4, max_steps=2, progress=False)
    result = train(model, data, config, method="precise", heads=heads, out_dir=tmp_path)
    d_model, d_head = model.cfg.d_model, model.cfg.d_head
    # 2 x (W_Q, W_O, b_Q) slices + the shared K/V head of layer 9 (MQA)
    assert result.n_trainable == 2 * (2 * d_model * d_head + d_head) + 2 * (d_model * d_head + d_head)
    before, after = gemma.state_dict(), model.state_dict()
    for name, value in after.items():
        if name in ("blocks.9.attn.W_Q", "blocks.9.attn.W_O", "blocks.9.attn.b_Q"):
            assert torch.equal(value[[0, 2]], before[name][[0, 2]]), name
            assert not torch.equal(value[[1, 3]], before[name][[1, 3]]), name
        elif name.startswith("blocks.9.attn._"):
            assert not torch.equal(value, before[name]), name
        else:
            assert torch.equal(value, before[name]), name
    size = sum(f.stat().st_size for f in (tmp_path / "final").iterdir())
    assert size < 5 * 2**20  # slices only, not the 1.7 GB model


def test_rows_longer_than_the_context_are_refused_before_training():
    """A row longer than n_ctx was a raw RuntimeError (size mismatch 18 vs 8) in the positional embedding."""
    from finetune import FullSFTConfig
    from finetune.data import encode_pairs

    short = tiny_model(n_ctx=8)
    rows = encode_pairs(short, [("1+2=", "3")] * 2 + [("1+2+3+4+5+6+7+8=", "36")] * 2)
    with pytest.raises(ValueError, match=r"train_dataset row 2 has 19 tokens, but the model's context is n_ctx=8 \(a "
                                         r"row may have at most 9 tokens: its last is only a target\); shorten "
                                         r"its prompt \(e.g. fewer shots\) or drop the rows longer than 9 tokens"):
        train(short, rows, FullSFTConfig(batch_size=2, micro_batch_size=2, max_steps=1, progress=False), method="full")
    assert all(p.grad is None for p in short.parameters())


def test_an_out_dir_that_is_a_file_is_refused_before_training(sft_rows, tmp_path):
    """out_dir naming a file was a raw FileExistsError (at the first checkpoint, or after training at final/)."""
    model = tiny_model()
    before = _state(model)
    file = tmp_path / "run.txt"
    file.write_text("not a folder")
    with pytest.raises(ValueError, match=r"out_dir .*run.txt is a file; give a folder"):
        train(model, sft_rows, CFG, method="full", out_dir=file)
    assert file.read_text() == "not a folder"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").write_text("mine")
    checkpointed = TrainConfig(**{**CFG.__dict__, "checkpoint_every": 2})
    with pytest.raises(ValueError, match=r"run/checkpoints is a file; the run writes its checkpoints into that folder"):
        train(model, sft_rows, checkpointed, method="full", out_dir=tmp_path / "run")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_training_refuses_before_the_first_step_to_delete_files_it_did_not_write(sft_rows, tmp_path):
    """A user's step folder was pruned (rmtree) and a user's file in final/ deleted when final/ was rewritten."""
    from finetune import PreciseSFTConfig

    config = PreciseSFTConfig(lr=5e-3, batch_size=8, micro_batch_size=4, max_steps=3, checkpoint_every=1,
                              keep_checkpoints=1, progress=False)
    model = tiny_model()
    before = _state(model)
    mine = tmp_path / "checkpoints" / "step-00000000"
    mine.mkdir(parents=True)
    (mine / "state.json").write_text("{}")
    (mine / "results.txt").write_text("my results")
    with pytest.raises(CheckpointError, match=r"checkpoints holds step folders the toolkit did not write: "
                                              r"step-00000000 \(no manifest.json of format 'arith-circuits-tuned'\); "
                                              r"this run would prune or replace them \(checkpoint_every=1, "
                                              r"keep_checkpoints=1\), so it stops before training: move them out of "
                                              r".*checkpoints or choose another out_dir"):
        train(model, sft_rows, config, heads=[Head(0, 1)], out_dir=tmp_path, resume=False)
    assert (mine / "results.txt").read_text() == "my results" and (mine / "state.json").read_text() == "{}"
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    (mine / "results.txt").unlink()
    (mine / "state.json").unlink()
    mine.rmdir()
    train(model, sft_rows, config, heads=[Head(0, 1)], out_dir=tmp_path, resume=False)
    (tmp_path / "final" / "my_notes.txt").write_text("mine")
    before = _state(model)
    with pytest.raises(CheckpointError, match=r"final holds files the toolkit did not write: my_notes.txt; move them "
                                              r"or choose another folder"):
        train(model, sft_rows, config, heads=[Head(0, 1)], out_dir=tmp_path, resume=False)
    assert (tmp_path / "final" / "my_notes.txt").read_text() == "mine"
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # refused before training
