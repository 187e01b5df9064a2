import pytest
import torch
import torch.nn.functional as F

from circuits.nodes import MLP, Head
from tests.tiny_models import tiny_model
from finetune.checkpoints import CheckpointError, list_checkpoints, load_tuned
from finetune.data import collate
from finetune.trainer import TrainConfig, answer_loss, train

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


def test_lora_merges_back_to_plain_model(sft_rows):
    model = tiny_model(style="gemma")
    before = _state(model)
    result = train(model, sft_rows, CFG, method="lora")
    assert set(model.state_dict()) == set(before)  # peft wrappers are gone, names unchanged
    changed = {n for n, v in model.state_dict().items() if not torch.equal(v, before[n])}
    assert changed == {s.name for s in result.selection.slices}
    assert "blocks.0.attn._W_K" in changed and "embed.W_E" not in changed
    assert result.n_trainable < sum(v.numel() for v in before.values()) / 2


def test_bad_arguments(sft_rows, tiny):
    with pytest.raises(ValueError, match="Unknown method"):
        train(tiny, sft_rows, CFG, method="adapter")
    with pytest.raises(ValueError, match="only used by method='precise'"):
        train(tiny, sft_rows, CFG, method="full", heads=[Head(0, 0)])
    with pytest.raises(ValueError, match="fewer than one batch"):
        train(tiny, sft_rows.select(range(3)), CFG, method="full")


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
