"""The training loop shared by precise SFT, full SFT, LoRA and circuit LoRA.

One loop, four ways to choose what trains (``method``):

* ``"precise"``: the key heads' slices (and optional whole MLPs), via
  :func:`finetune.masks.precise_selection`: gradients outside are exactly zero
  and the optimizer never writes there;
* ``"full"``: every parameter (embeddings frozen by default, see
  :func:`finetune.masks.full_selection`);
* ``"lora"``: rank-r factors injected by peft (:mod:`finetune.lora`), merged
  into the weights at the end;
* ``"circuit_lora"``: rank-r factors on the slices of ``heads`` and ``mlps`` only
  (:mod:`finetune.circuit_lora`), merged into those slices at the end.

The loop is the paper's: AdamW (decoupled weight decay 0.1), linear warmup over
2% of the steps then linear decay, gradient clipping at 1.0, gradient
accumulation of micro-batches up to ``batch_size`` examples per optimizer
step. The loss is teacher-forced cross-entropy on the answer tokens only,
averaged per example and then over the batch; logits are computed only at
answer positions (unembedding every position of a 262k vocabulary would
dominate the step on gemma).

Determinism and resume: the examples of step ``s`` are a pure function of
``(s, seed)`` (:func:`finetune.data.epoch_order`), the model has no dropout,
and a checkpoint holds the tuned tensors, AdamW moments and step, so a run
resumed from a checkpoint ends bit-identical to an uninterrupted one (on the
same device, thread count and world size).

Data parallel: under ``accelerate launch --num_processes N`` each process takes
every N-th example of each batch and the gradients are summed across
processes before the update, so every process applies the same update; only
the main process writes checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from datasets import Dataset
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from circuits.errors import InputError, ToolkitError
from circuits.end_logits import unembed_end
from circuits.nodes import MLP, Head
from circuits.peak_memory import peak_rss, reset_peak_rss
from circuits.process_group import rank_and_world_size
from finetune import checkpoints as ckpt
from finetune.data import SFTDataError, check_token_rows, collate, epoch_order, targets
from finetune.circuit_lora import attach_circuit_lora, circuit_lora_slices, merge_circuit_lora
from finetune.lora import attach_lora, lora_targets, merge_lora
from finetune.masks import Selection, apply_selection, full_selection, named_selection, precise_selection
from finetune.configs import Method, SFTConfig, TrainConfig, method_of, method_config
from finetune.optim import SliceAdamW, lr_at

logger = logging.getLogger(__name__)

class NonFiniteLossError(ToolkitError, FloatingPointError):
    """Training produced a NaN/Inf loss or gradient; it stopped before the update (no final/ written)."""


@dataclass
class TrainResult:
    """What :func:`train` did. ``model`` is the trained `HookedTransformer` (the same object passed in).

    ``peak_rss_bytes`` is the process's peak resident memory during this run (on Linux, where
    the peak mark can be reset; elsewhere the process's peak so far), ``peak_cuda_bytes`` the
    peak CUDA allocation during it.
    """

    model: HookedTransformer
    method: str
    selection: Selection
    n_trainable: int
    n_parameters: int
    steps: int
    losses: list[float]
    seconds_per_step: float
    optimizer_state_bytes: int
    peak_rss_bytes: int
    peak_cuda_bytes: int | None
    out_dir: Path | None
    resumed_from: Path | None

    def summary(self) -> dict:
        """JSON-ready summary (no tensors)."""
        return {
            "method": self.method, "selection": self.selection.description, "n_trainable": self.n_trainable,
            "n_parameters": self.n_parameters, "trainable_fraction": self.n_trainable / self.n_parameters,
            "steps": self.steps, "first_loss": self.losses[0] if self.losses else None,
            "final_loss": self.losses[-1] if self.losses else None, "seconds_per_step": self.seconds_per_step,
            "optimizer_state_bytes": self.optimizer_state_bytes, "peak_rss_bytes": self.peak_rss_bytes,
            "peak_cuda_bytes": self.peak_cuda_bytes,
            "resumed_from": str(self.resumed_from) if self.resumed_from else None,
        }


def answer_loss(model: HookedTransformer, rows: Sequence[dict], denominator: int) -> torch.Tensor:
    """Sum over ``rows`` of each row's mean answer-token cross-entropy, divided by ``denominator``."""
    pad_id = model.tokenizer.pad_token_id if model.tokenizer is not None and model.tokenizer.pad_token_id is not None else 0
    tokens, predicts = collate(rows, pad_id, model.cfg.device)
    resid = model(tokens, stop_at_layer=model.cfg.n_layers)
    logits = unembed_end(model, resid[predicts])
    per_token = F.cross_entropy(logits.float(), targets(rows, predicts), reduction="none")
    row_of = predicts.nonzero()[:, 0]
    counts = predicts.sum(1).clamp(min=1).to(per_token.dtype)
    per_row = torch.zeros(len(rows), dtype=per_token.dtype, device=per_token.device).index_add_(0, row_of, per_token)
    return (per_row / counts).sum() / denominator


def _dataset_fingerprint(rows: list[dict]) -> str:
    digest = hashlib.sha256()
    for r in rows:
        digest.update(json.dumps([r["input_ids"], r["n_prompt"]]).encode())
    return digest.hexdigest()[:16]


def _all_reduce_grads(optimizer: SliceAdamW) -> None:
    import torch.distributed as dist

    for _, p in optimizer.slices:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def _select(model, method, heads, mlps, config) -> tuple[Selection, Selection]:
    """(what the optimizer trains, what changes in the final model): they differ only for LoRA."""
    if method == "precise":
        selection = precise_selection(model, list(heads or ()), list(mlps or ()), tune_kv=config.tune_kv,
                                      rescale=config.rescale)
        return selection, selection
    if method == "circuit_lora":
        final = circuit_lora_slices(model, list(heads or ()), list(mlps or ()), config.lora)
        names = attach_circuit_lora(model, final, config.lora, seed=config.seed)
        return named_selection(model, names, final.description), final
    if heads or mlps:
        raise InputError(f"heads/mlps are only used by method='precise' and 'circuit_lora', not {method!r}.")
    if method == "full":
        selection = full_selection(model, train_embeddings=config.train_embeddings)
        return selection, selection
    targets_ = lora_targets(model, config.lora)
    description = f"lora r={config.lora.r} on {len(targets_)} tensors"
    final = named_selection(model, targets_, description + " (merged)")
    names = attach_lora(model, config.lora, seed=config.seed)
    return named_selection(model, names, description), final


@torch.enable_grad()  # callers may have switched gradients off globally
def train(
    model: HookedTransformer,
    train_dataset: Dataset,
    config: SFTConfig = TrainConfig(),
    *,
    method: Method | None = None,
    heads: Sequence[Head] | None = None,
    mlps: Sequence[MLP] | None = None,
    out_dir: str | os.PathLike | None = None,
    resume: bool = True,
    on_step: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Fine-tune ``model`` in place on ``train_dataset`` (rows with ``input_ids`` and ``n_prompt``).

    Args:
        config: a :class:`PreciseSFTConfig`, :class:`FullSFTConfig`, :class:`LoraSFTConfig` or
            :class:`CircuitLoraSFTConfig` (which names the method), or a :class:`TrainConfig` holding every
            method's settings.
        method: ``"precise"`` or ``"circuit_lora"`` (both need ``heads`` and/or ``mlps``), ``"full"`` or
            ``"lora"``; by default the method ``config`` is for (``"precise"`` for a TrainConfig).
        out_dir: where checkpoints (every ``config.checkpoint_every`` steps) and
            the final tuned tensors (``out_dir/final``, loadable onto a base model
            with :func:`finetune.checkpoints.load_tuned`) go. With ``resume=True``
            an existing checkpoint there is continued (its run settings must match).
        on_step: called as ``on_step(step, loss)`` after each optimizer step (and
            its checkpoint); an exception raised there stops training, as a kill would.

    Returns:
        a :class:`TrainResult`; ``result.model`` is ``model``, trained (LoRA merged in).
    """
    method = method_of(config, method)
    config = method_config(config, method)
    rows, steps_per_epoch, total = _training_rows(train_dataset, config)
    check_token_rows(rows, model.cfg.d_vocab)
    _check_fits_context(rows, model.cfg.n_ctx)
    if out_dir is not None:
        _check_out_dir(Path(out_dir), config)
    rank, world = rank_and_world_size()
    run = _start_run(model, rows, config, method, heads, mlps, out_dir, resume, total, steps_per_epoch, rank, world)
    try:
        bar = tqdm(range(run.start, total), desc=f"{method} SFT", disable=not config.progress or rank != 0,
                   initial=run.start, total=total)
        for step in bar:
            began = time.perf_counter()
            step_loss = _accumulate_gradients(run, _batch(run, step))
            _sync_processes(run, step_loss)
            _check_finite(run, step, step_loss)
            run.optimizer.step(lr_at(step, total, config.lr, config.warmup_ratio))
            run.optimizer.zero_grad()
            run.losses.append(float(step_loss))
            run.step_times.append(time.perf_counter() - began)
            bar.set_postfix(loss=f"{run.losses[-1]:.4f}")
            _maybe_checkpoint(run, step + 1)
            if on_step is not None:
                on_step(step + 1, run.losses[-1])
        state_bytes = run.optimizer.state_bytes()
    finally:
        run.applied.remove()
    return _finish(run, state_bytes)


@dataclass
class _Run:
    """One training run's state, shared by the named steps of :func:`train`."""

    model: HookedTransformer
    rows: list[dict]
    config: SFTConfig
    method: str
    selection: Selection  # what the optimizer trains
    final_selection: Selection  # what changes in the final model (they differ for LoRA)
    applied: object
    optimizer: SliceAdamW
    identity: dict
    total: int
    steps_per_epoch: int
    rank: int
    world: int
    out_dir: Path | None
    n_parameters: int
    n_trainable: int
    rss_reset: bool = False
    start: int = 0
    losses: list[float] = field(default_factory=list)
    resumed_from: Path | None = None
    step_times: list[float] = field(default_factory=list)
    order_cache: dict[int, list[int]] = field(default_factory=dict)


def _training_rows(train_dataset: Dataset, config: SFTConfig) -> tuple[list[dict], int, int]:
    """The rows as plain dicts, steps per epoch and the run's total steps; bad data or settings raise."""
    missing = {"input_ids", "n_prompt"} - set(train_dataset.column_names)
    if missing:
        raise SFTDataError(f"train_dataset lacks columns {sorted(missing)}; build it with finetune.data.encode_pairs.")
    if config.batch_size < 1 or config.micro_batch_size < 1:
        raise InputError("batch_size and micro_batch_size must be >= 1.")
    rows = [{"input_ids": list(r["input_ids"]), "n_prompt": int(r["n_prompt"])} for r in train_dataset]
    steps_per_epoch = len(rows) // config.batch_size
    if steps_per_epoch == 0:
        raise SFTDataError(f"{len(rows)} examples are fewer than one batch of {config.batch_size}.")
    total = config.max_steps if config.max_steps is not None else math.ceil(config.epochs * steps_per_epoch)
    if total < 1:
        raise InputError("The run has no steps: raise epochs or max_steps.")
    return rows, steps_per_epoch, total


def _check_fits_context(rows: list[dict], n_ctx: int) -> None:
    """Every row must fit the model's positions: it reads all but the last token (only ever a target)."""
    too_long = [i for i, r in enumerate(rows) if len(r["input_ids"]) - 1 > n_ctx]
    if too_long:
        i = too_long[0]
        raise SFTDataError(
            f"train_dataset row {i} has {len(rows[i]['input_ids'])} tokens, but the model's context is n_ctx={n_ctx} "
            f"(a row may have at most {n_ctx + 1} tokens: its last is only a target); shorten its prompt (e.g. fewer "
            f"shots) or drop the rows longer than {n_ctx + 1} tokens ({len(too_long)} of {len(rows)}).")


def _check_out_dir(out_dir: Path, config: SFTConfig) -> None:
    """Before the first step: ``out_dir`` is a folder, and nothing the run would replace or prune is a user's."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"out_dir {out_dir} is a file; give a folder (the run writes checkpoints/ and final/ "
                         "into it).")
    ckpt._check_replaceable(out_dir / "final")
    if config.checkpoint_every:
        root = out_dir / "checkpoints"
        if root.exists() and not root.is_dir():
            raise InputError(f"{root} is a file; the run writes its checkpoints into that folder: move the file "
                             "or choose another out_dir.")
        if foreign := ckpt._foreign_step_folders(out_dir):
            raise ckpt.CheckpointError(
                f"{root} holds step folders the toolkit did not write: {'; '.join(foreign)}; this run would prune "
                f"or replace them (checkpoint_every={config.checkpoint_every}, keep_checkpoints="
                f"{config.keep_checkpoints}), so it stops before training: move them out of {root} or choose "
                "another out_dir.")


def _start_run(model, rows, config, method, heads, mlps, out_dir, resume, total, steps_per_epoch, rank, world) -> _Run:
    """Choose what trains, hook it, build the optimizer, resume from a checkpoint if one fits, reset the memory peaks."""
    out_dir = Path(out_dir) if out_dir is not None else None
    n_parameters = sum(p.numel() for p in model.parameters())
    selection, final_selection = _select(model, method, heads, mlps, config)
    n_trainable = selection.n_trainable(model)
    applied = apply_selection(model, selection)
    try:
        optimizer = SliceAdamW(applied.parameters(), betas=config.betas, eps=config.eps,
                               weight_decay=config.weight_decay)
        identity = {"method": method, "config": config.identity(), "data": _dataset_fingerprint(rows),
                    "total_steps": total, "world_size": world,
                    "selection": ckpt.selection_to_json(selection)["slices"]}
        run = _Run(model, rows, config, method, selection, final_selection, applied, optimizer, identity, total,
                   steps_per_epoch, rank, world, out_dir, n_parameters, n_trainable)
        if out_dir is not None and resume:
            _resume(run)
    except BaseException:
        applied.remove()
        raise
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    run.rss_reset = reset_peak_rss()  # so peak_rss_bytes is this run's, not an earlier run's in the process
    return run


def _resume(run: _Run) -> None:
    """Continue from the latest intact checkpoint in ``run.out_dir``, if there is one; it must be of this run."""
    latest = ckpt.latest_intact_checkpoint(run.out_dir)
    if latest is None:
        return
    saved = ckpt.read_state(latest)
    if saved.get("identity") != json.loads(json.dumps(run.identity)):
        raise ckpt.CheckpointError(
            f"{latest} was written by a different run (method, settings, data, world size or selection "
            f"differ); pass another out_dir or resume=False.")
    ckpt.load_tuned(run.model, latest, optimizer=run.optimizer)
    run.start, run.losses, run.resumed_from = saved["step"], list(saved["losses"]), latest
    logger.info("resuming %s from %s at step %d", run.method, latest, run.start)


def _batch(run: _Run, step: int) -> list[int]:
    """The example indices of optimizer step ``step``: a pure function of ``(step, seed)``."""
    epoch, position = divmod(step, run.steps_per_epoch)
    if epoch not in run.order_cache:
        run.order_cache = {epoch: epoch_order(len(run.rows), epoch, run.config.seed)}
    size = run.config.batch_size
    return run.order_cache[epoch][position * size:(position + 1) * size]


def _accumulate_gradients(run: _Run, batch: list[int]) -> torch.Tensor:
    """Forward/backward this process's share of ``batch`` in micro-batches; the loss (float64, on CPU)."""
    mine = batch[run.rank::run.world]
    step_loss = torch.zeros((), dtype=torch.float64)
    for i in range(0, len(mine), run.config.micro_batch_size):
        micro = [run.rows[j] for j in mine[i:i + run.config.micro_batch_size]]
        loss = answer_loss(run.model, micro, len(batch))
        loss.backward()
        step_loss += loss.detach().double().cpu()
    return step_loss


def _sync_processes(run: _Run, step_loss: torch.Tensor) -> None:
    """Data parallel: sum the gradients and the loss over processes, so every process applies the same update."""
    if run.world > 1:
        import torch.distributed as dist

        _all_reduce_grads(run.optimizer)
        dist.all_reduce(step_loss, op=dist.ReduceOp.SUM)


def _check_finite(run: _Run, step: int, step_loss: torch.Tensor) -> None:
    """Stop before the update on a NaN/Inf loss or gradient norm; clip the gradients (``max_grad_norm``)."""
    if not math.isfinite(float(step_loss)):
        raise NonFiniteLossError(
            f"Step {step + 1}: the loss is {float(step_loss)}; training stopped before the update and "
            "wrote no final weights. Lower lr, check the data, or check the model for NaN weights.")
    if run.config.max_grad_norm is not None:
        norm = run.optimizer.clip_grad_norm(run.config.max_grad_norm)
        if not math.isfinite(norm):
            raise NonFiniteLossError(
                f"Step {step + 1}: the gradient norm is {norm}; training stopped before the update and "
                "wrote no final weights. Lower lr or check the data.")


def _maybe_checkpoint(run: _Run, done: int) -> None:
    """Every ``checkpoint_every`` steps (not the last): the main process saves, prunes, and the others wait."""
    every = run.config.checkpoint_every
    if run.out_dir is None or not every or done % every or done >= run.total:
        return
    if run.rank == 0:
        ckpt.save_tuned(run.model, run.selection, ckpt.checkpoint_dir(run.out_dir, done), optimizer=run.optimizer,
                        state={"step": done, "losses": run.losses, "identity": run.identity})
        ckpt.prune_checkpoints(run.out_dir, run.config.keep_checkpoints)
    if run.world > 1:
        torch.distributed.barrier()


def _finish(run: _Run, state_bytes: int) -> TrainResult:
    """Merge LoRA, freeze the model, write ``out_dir/final``, and measure the run."""
    model = run.model
    if run.method == "lora":
        merge_lora(model)
    elif run.method == "circuit_lora":
        merge_circuit_lora(model)
    for p in model.parameters():
        p.requires_grad_(False)
    if run.out_dir is not None and run.rank == 0:
        ckpt.save_tuned(model, run.final_selection, run.out_dir / "final",
                        state={"step": run.total, "losses": run.losses, "identity": run.identity, "method": run.method})
    timed = run.step_times[1:] or run.step_times  # the first step pays one-off allocation costs
    return TrainResult(
        model=model, method=run.method, selection=run.final_selection, n_trainable=run.n_trainable,
        n_parameters=run.n_parameters, steps=run.total, losses=run.losses,
        seconds_per_step=sum(timed) / len(timed) if timed else float("nan"),
        optimizer_state_bytes=state_bytes, peak_rss_bytes=peak_rss(run.rss_reset),
        peak_cuda_bytes=torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
        out_dir=run.out_dir, resumed_from=run.resumed_from,
    )
