"""The settings of ``python -m experiments.numbers``: one flag per field of :class:`NumbersConfig`.

Imports nothing heavy, so ``--help`` and flag errors answer before torch or TransformerLens load: the
component names and helix periods that ``circuits.analyze`` owns come from its torch-free
:mod:`circuits.analyze.number_catalogue`, the lists the analyses themselves read.
"""

from __future__ import annotations

from dataclasses import dataclass

from circuits.analyze.number_catalogue import COMPONENTS, HELIX_PERIODS
from circuits.errors import InputError
from experiments.runtime import cli
from experiments.runtime.cli import option, override
from experiments.runtime.settings import BatchSettings, RunSettings

HELD_OUT = 0.2  # fit_helix's default test_fraction, which analyse() uses
HELIX_BASIS = 1 + 2 * len(HELIX_PERIODS)  # n/scale, then cos and sin per period (helix_basis)
# Fewest numbers 0..n-1 the analyses take: more training numbers than helix basis functions (12 for 4 periods).
MIN_NUMBERS = next(n for n in range(4, 10_000) if n - round(HELD_OUT * n) > HELIX_BASIS)


def fewest_training_sum_prompts(operand_max: int, per_result: int) -> int:
    """The sum prompts left to fit the helix on when the held-out sums are those with the most prompts (no seed
    leaves fewer): :func:`circuits.analyze.number_tokens.pairs_by_result` gives each sum 0..2·operand_max
    ``per_result`` prompts, or as many as it has operand pairs."""
    per_sum = sorted((min(per_result, min(s, operand_max) - max(0, s - operand_max) + 1)
                      for s in range(2 * operand_max + 1)), reverse=True)
    return sum(per_sum[round(HELD_OUT * len(per_sum)):])


@dataclass(frozen=True)
class NumbersConfig(BatchSettings, RunSettings):
    """Every flag of ``python -m experiments.numbers``, with its default (model, device, dtype, threads, seed,
    out and overwrite: :class:`experiments.runtime.RunSettings`; the seed draws the data and the shuffled null)."""

    n_numbers: int = option(400, "numbers 0..n-1 (a multiple of 100 puts T=2,5,10,100 on exact frequencies)",
                            type=cli.positive_int)
    template: str = option("{n}", "context of a number alone; {n} is the number")
    components: tuple[str, ...] = option(("resid_post", "attn_out", "mlp_out"), "resid_pre (= the previous layer's "
                                         "resid_post) and resid_mid are available too", choices=tuple(COMPONENTS))
    n_shuffles: int = option(50, "shuffled-n spectra for the null", type=cli.positive_int)
    alpha: float = option(0.05, "family-wise level of the spectrum null", type=cli.fraction)
    operand_max: int = option(99, "operands of the sum prompts are drawn from 0..operand-max", type=cli.nonnegative_int)
    per_result: int = option(1, "sum prompts per result value", type=cli.positive_int)
    prefix: str = option("", "text before every arithmetic prompt (e.g. solved examples)")
    low_min_period: float = option(20.0, "Fourier periods at least this long count as low-frequency", type=cli.positive_float)
    high_max_period: float = option(10.0, "Fourier periods at most this long count as high-frequency",
                                    type=cli.positive_float)
    patch_layers: tuple[int, ...] | None = option(None, "default: 4 evenly spaced layers", type=int, nargs="+")
    n_pairs: int = option(32, "prompt pairs of the patching experiment", type=cli.positive_int)
    top_neurons: int = option(100, "MLP neurons classified into heuristics", type=cli.positive_int)
    heuristic_threshold: float = option(0.7, "share a neuron's pattern must explain to get a heuristic label",
                                        type=cli.fraction)
    batch_size: int = override(BatchSettings, "batch_size", 64)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_numbers < MIN_NUMBERS:
            raise InputError(
                f"--n-numbers must be at least {MIN_NUMBERS}, got {self.n_numbers}: the helix fit needs more "
                f"numbers than its {HELIX_BASIS} basis functions once {HELD_OUT:.0%} are held out for testing. "
                f"Give --n-numbers {MIN_NUMBERS} or more (a multiple of 100, such as the default 400, puts "
                "T=2,5,10,100 on exact frequencies).")
        if fewest_training_sum_prompts(self.operand_max, self.per_result) <= HELIX_BASIS:
            enough = next(m for m in range(1, 10_000) if fewest_training_sum_prompts(m, self.per_result) > HELIX_BASIS)
            raise InputError(
                f"--operand-max {self.operand_max} with --per-result {self.per_result} leaves as few as "
                f"{fewest_training_sum_prompts(self.operand_max, self.per_result)} sum prompts to fit the helix on once "
                f"{HELD_OUT:.0%} of the sums are held out for testing; the fit needs more than its {HELIX_BASIS} basis "
                f"functions. Give --operand-max {enough} or more (with --per-result {self.per_result}), or a larger "
                "--per-result.")
        if not self.high_max_period < self.low_min_period:
            raise InputError(
                f"--high-max-period {self.high_max_period:g} is not below --low-min-period {self.low_min_period:g}: the "
                "low band (periods >= the low minimum) and the high band (periods <= the high maximum) would share "
                "frequencies, and the mid control band between them would be empty. Give a high maximum below the "
                "low minimum (the defaults are 10 and 20).")
