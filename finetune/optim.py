"""AdamW over parameter *slices*, and the learning-rate schedule.

``torch.optim.AdamW`` applies decoupled weight decay, ``p <- p - lr * wd * p``,
to every entry of a parameter it holds, so a row whose gradient is masked to
zero still shrinks, and its moment buffers cost as much memory as the tuned
rows. :class:`SliceAdamW` is AdamW restricted to the rows a
:class:`finetune.masks.TunableSlice` names: it gathers those rows, runs the
same arithmetic as ``torch.optim.AdamW`` (``foreach=False``) on them, and
writes only them back with ``index_copy_``. Entries outside the slices are
never written, and its state (two moment tensors per slice plus the step
count) is exactly as large as the tuned slices, which is what makes precise
SFT's optimizer memory small.

Its state is plain tensors plus a step count, so checkpoints store it as
safetensors + JSON (:mod:`finetune.checkpoints`).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from circuits.errors import InputError
from finetune.masks import TunableSlice


def lr_at(step: int, total_steps: int, peak_lr: float, warmup_ratio: float = 0.02) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then linear decay to 0.

    This is the Hugging Face Trainer's default ("linear") schedule, which the
    paper's warmup ratio refers to. Warmup lasts ``ceil(warmup_ratio * total)`` steps.
    """
    if total_steps < 1:
        raise InputError(f"total_steps must be >= 1, got {total_steps}.")
    warmup = math.ceil(warmup_ratio * total_steps)
    if step < warmup:
        return peak_lr * (step + 1) / warmup
    remaining = max(1, total_steps - warmup)
    return peak_lr * max(0.0, (total_steps - step) / remaining)


def check_betas(betas) -> tuple[float, float]:
    """``betas`` as AdamW needs them: two finite numbers with 0 <= beta < 1 (beta = 1 divides by zero)."""
    try:
        beta1, beta2 = (float(b) for b in betas)
    except (TypeError, ValueError) as err:
        raise InputError(f"betas must be two numbers (beta1, beta2), got {betas!r}.") from err
    for name, beta in (("beta1", beta1), ("beta2", beta2)):
        if not (math.isfinite(beta) and 0 <= beta < 1):
            raise InputError(f"{name} must lie in [0, 1), got {beta!r}.")
    return beta1, beta2


class SliceAdamW:
    """AdamW (decoupled weight decay) that reads and writes only the rows of each :class:`TunableSlice`.

    Args:
        slices: ``(slice, parameter)`` pairs, e.g. from ``AppliedSelection.parameters()``.
        betas, eps, weight_decay: as ``torch.optim.AdamW``; weight decay applies
            only to slices with ``decay=True``.
    """

    def __init__(
        self,
        slices: Sequence[tuple[TunableSlice, nn.Parameter]],
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.1,
    ):
        if not slices:
            raise InputError("SliceAdamW got no parameters to optimize.")
        self.slices = list(slices)
        self.betas, self.eps, self.weight_decay = check_betas(betas), eps, weight_decay
        self.step_count = 0
        self._index = {}
        self.exp_avg: dict[str, torch.Tensor] = {}
        self.exp_avg_sq: dict[str, torch.Tensor] = {}
        for s, p in self.slices:
            if s.index is not None:
                self._index[s.name] = torch.tensor(s.index, dtype=torch.long, device=p.device)
            shape = p.shape if s.index is None else (len(s.index), *p.shape[1:])
            self.exp_avg[s.name] = torch.zeros(shape, dtype=p.dtype, device=p.device)
            self.exp_avg_sq[s.name] = torch.zeros(shape, dtype=p.dtype, device=p.device)

    def _rows(self, s: TunableSlice, t: torch.Tensor) -> torch.Tensor:
        return t if s.index is None else t.index_select(0, self._index[s.name])

    def grads(self) -> list[torch.Tensor]:
        """The tuned rows' gradients (zeros where backward produced none)."""
        out = []
        for s, p in self.slices:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            out.append(self._rows(s, g))
        return out

    def clip_grad_norm(self, max_norm: float) -> float:
        """Scale the tuned rows' gradients so their global L2 norm is at most ``max_norm``; return the norm."""
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in self.grads()]))
        factor = max_norm / (norm + 1e-6)
        if factor < 1:
            for _, p in self.slices:
                if p.grad is not None:
                    p.grad.mul_(factor)
        return float(norm)

    @torch.no_grad()
    def step(self, lr: float) -> None:
        """One AdamW update of the tuned rows with learning rate ``lr``."""
        if not math.isfinite(lr) or lr < 0:
            raise InputError(f"lr must be a finite number >= 0, got {lr!r}.")
        self.step_count += 1
        beta1, beta2 = self.betas
        bias1 = 1 - beta1**self.step_count
        bias2_sqrt = math.sqrt(1 - beta2**self.step_count)
        for s, p in self.slices:
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            grad = self._rows(s, grad)
            # index_select copies, so x is a private buffer for sliced params; whole params update in place.
            x = p.data if s.index is None else self._rows(s, p.data)
            if s.decay and self.weight_decay:
                x.mul_(1 - lr * self.weight_decay)
            m, v = self.exp_avg[s.name], self.exp_avg_sq[s.name]
            m.lerp_(grad, 1 - beta1)
            v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (v.sqrt() / bias2_sqrt).add_(self.eps)
            x.addcdiv_(m, denom, value=-lr / bias1)
            if s.index is not None:
                p.data.index_copy_(0, self._index[s.name], x)

    def zero_grad(self) -> None:
        for _, p in self.slices:
            p.grad = None

    def state_bytes(self) -> int:
        """Bytes held by the moment buffers (the optimizer-state memory)."""
        return sum(t.numel() * t.element_size() for d in (self.exp_avg, self.exp_avg_sq) for t in d.values())

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Moment buffers keyed ``exp_avg/<param>`` and ``exp_avg_sq/<param>`` (for safetensors)."""
        out = {f"exp_avg/{k}": v for k, v in self.exp_avg.items()}
        out.update({f"exp_avg_sq/{k}": v for k, v in self.exp_avg_sq.items()})
        return out

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], step_count: int) -> None:
        """Restore :meth:`state_tensors` output and the step count; shapes must match."""
        for kind, store in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
            for name, buf in store.items():
                key = f"{kind}/{name}"
                if key not in tensors:
                    raise KeyError(f"Optimizer state lacks {key!r}: the checkpoint was written for other slices.")
                if tensors[key].shape != buf.shape:
                    raise InputError(f"{key}: checkpoint shape {tuple(tensors[key].shape)} != {tuple(buf.shape)}.")
                buf.copy_(tensors[key])
        self.step_count = int(step_count)
