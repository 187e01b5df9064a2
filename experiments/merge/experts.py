"""The merge experiment's experts: their task data from the flags, training each one until it meets a
validation target (bounded steps, checked every few steps; never the test split), the closed form's
samples as padded token tensors with the answer-side mask, and the time and memory of one merge.

Training to a target: after every ``--check-every`` optimizer steps the expert is scored on its own
validation split; once it reaches the base's validation accuracy + ``--target-gain`` the training callback
raises, which stops :func:`finetune.train` with the model trained in place. ``--steps`` bounds the run.
"""

from __future__ import annotations

import copy
import os
import threading
import time

import torch

from circuits import parse_node
from finetune import TrainConfig, train
from finetune.evaluate import answer_accuracy
from finetune.expert_tasks import ExpertTaskConfig


def _rss_bytes() -> int:
    """Resident memory of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def measured(fn, *args, **kwargs):
    """``(fn(...), seconds, peak MB of resident memory above the start)``, memory sampled every 5 ms."""
    start_rss, peak, done = _rss_bytes(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            done.wait(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    start = time.perf_counter()
    try:
        out = fn(*args, **kwargs)
    finally:
        seconds = time.perf_counter() - start
        done.set()
        thread.join()
    return out, seconds, max(peak[0], _rss_bytes()) / 2**20 - start_rss / 2**20


class _TargetReached(Exception):
    """Raised from the training callback to stop an expert once its validation target is met."""


def train_expert(run, task: str):
    """A copy of the base trained on ``task`` for ``--steps`` steps, or until its validation accuracy reaches the
    base's + ``--target-gain`` (checked every ``--check-every`` steps); returns it with what training recorded."""
    cfg, model = run.cfg, copy.deepcopy(run.state.base)
    target = run.results["models"]["base"]["val"]["tasks"][task]["exact"] + cfg.target_gain
    losses, checks = [], []

    def on_step(step: int, loss: float) -> None:
        losses.append(loss)
        if cfg.target_gain and (step % cfg.check_every == 0 or step == cfg.steps):
            val = answer_accuracy(model, run.state.data[(task, "val")], cfg.eval_batch_size)["exact"]
            model.train()
            checks.append({"step": step, "val_exact": val})
            print(f"  {task} step {step}: val {val:.3f} (target {target:.3f})", flush=True)
            if val >= target:
                raise _TargetReached

    train_cfg = TrainConfig(lr=cfg.lr, batch_size=cfg.batch_size, micro_batch_size=cfg.micro_batch_size,
                            max_steps=cfg.steps, seed=cfg.seed, progress=False)
    heads = given_heads(cfg) or None if cfg.expert_method == "precise" else None
    try:
        train(model, run.state.data[(task, "train")], train_cfg, method=cfg.expert_method, heads=heads, on_step=on_step)
    except _TargetReached:
        pass  # trained in place; the steps taken are len(losses)
    info = {"steps": len(losses), "losses": losses, "val_checks": checks, "target_val": target if cfg.target_gain
            else None, "target_met": bool(checks) and checks[-1]["val_exact"] >= target}
    return model, info


def given_heads(cfg) -> list:
    """The heads of ``--heads`` (``L5H0,L9H1``) as nodes."""
    return [parse_node(h) for h in (cfg.heads or "").split(",") if h]


def task_config(cfg) -> ExpertTaskConfig:
    """The expert tasks' data settings from the flags."""
    lo, hi = (int(x) for x in cfg.mul_operands.split(","))
    return ExpertTaskConfig(n_train=cfg.n_train, n_val=cfg.n_val, n_test=cfg.n_test, n_shots=cfg.n_shots,
                            seed=cfg.seed, mul_operands=(lo, hi), max_number=cfg.max_number,
                            n_test_numbers=cfg.n_test_numbers, n_val_numbers=cfg.n_val_numbers)


def padded_rows(rows: list[dict], model) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SFT rows as right-padded ``[batch, pos]`` tokens (prompt and answer), their attention mask, and the mask of
    the answer side: the positions whose next token is an answer token (what SFT's loss and scoring look at)."""
    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    width = max(len(r["input_ids"]) for r in rows)
    tokens = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    answer_side = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        tokens[i, :n] = torch.tensor(r["input_ids"])
        attention[i, :n] = 1
        answer_side[i, r["n_prompt"] - 1:n - 1] = 1
    return tokens.to(model.cfg.device), attention.to(model.cfg.device), answer_side.to(model.cfg.device)
