"""Causal models of the arithmetic tasks: which variables a model could compute, and what an intervention predicts.

An interchange intervention (:mod:`patching.variables.interchange`) asks whether a location inside the model
*holds* a variable of the task. The hypothesis is a **causal model**: a small program over named
variables, each computed by a mechanism from its parents, the prompt's numbers being the roots and
the answer the last node. For one-digit ``a + b``::

    a, b  ->  result = a + b  ->  tens = result // 10, ones = result % 10  ->  answer = 10 tens + ones

Intervening on a variable sets it to a given value and recomputes everything below it. For a pair
of prompts (base, source) and a variable V, the **counterfactual answer** is the base's answer with
V set to its value on the source: for ``3 + 4`` (base) and ``8 + 1`` (source) and V = ``a``, it is
``8 + 4 = 12``; for V = ``ones`` it is ``10 * 0 + 9 = 9``. If a location of the model holds V, swapping
that location's activation from the source run into the base run makes the model answer the
counterfactual answer.

Two kinds of tasks (:data:`CAUSAL_MODELS`, a registry of records):

* one-digit ``a op b`` (``"+"``, ``"-"``, ``"*"``, ``"/"``): variables ``a``, ``b``, ``result`` and, where a
  result can have two digits (``+``, ``*``), ``tens`` and ``ones``;
* two-digit addition as MIB poses it ("The sum of AB and CD is", ``"two_digit_addition"``): the
  operands' digits, ``ones`` (the sum's ones digit), ``ones_carry``, ``tens`` and ``hundreds``.

:func:`interchange_pairs` builds the pairs for one variable from a :mod:`circuits.tasks` dataset:
*counterfactual* pairs, where the source changes V and with it the answer, and *control* pairs,
where the source leaves V as it is but changes the answer (the expected answer is then the base's:
a location that merely copies the source's answer fails them). A variable that fixes the answer on
its own (``result``) has no control pairs. Only prompts the model answers
correctly are used, for the base and the source alike (:func:`correct_rows`, scored by
:mod:`circuits.answer_scoring`); :func:`split_pairs` splits pairs into train, validation and test sets.
"""

from __future__ import annotations

import math

import random
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Callable, Mapping, Sequence

from patching.variables.catalogue import CAUSAL_MODELS as CATALOGUED_MODELS
from circuits.arguments import check_option, check_positive_int
from circuits.errors import InputError, InputKeyError, TaskDataError
from circuits.tasks import TaskConfig, answer_token_ids, format_number
from circuits.templates import resolve_operation

Values = dict[str, Fraction]


@dataclass(frozen=True)
class Mechanism:
    """How one variable is computed from its parents' values (``compute(*parent_values)``)."""

    parents: tuple[str, ...]
    compute: Callable[..., Fraction]


@dataclass(frozen=True)
class CausalModel:
    """A task's variables as a program: ``inputs`` read from a prompt, ``mechanisms`` in order, the last one ``answer``.

    ``task`` says which prompts the model describes (:class:`circuits.tasks.TaskConfig`; its template and
    operand range); ``read_inputs`` turns a dataset row (its ``a`` and ``b`` strings) into the input values;
    ``tested`` are the variables an experiment tests by default.
    """

    name: str
    inputs: tuple[str, ...]
    mechanisms: Mapping[str, Mechanism]
    read_inputs: Callable[[Mapping], Values]
    task: TaskConfig
    tested: tuple[str, ...]
    description: str = ""

    def __post_init__(self) -> None:
        known = set(self.inputs)
        for name, mechanism in self.mechanisms.items():
            missing = [p for p in mechanism.parents if p not in known]
            if missing:  # a mechanism may only read inputs and variables computed before it
                raise InputError(f"Causal model {self.name!r}: variable {name!r} reads {missing} before they are "
                                 "computed; list mechanisms in topological order.")
            known.add(name)
        if list(self.mechanisms)[-1:] != ["answer"]:
            raise InputError(f"Causal model {self.name!r}: the last mechanism must compute 'answer'.")

    @property
    def variables(self) -> tuple[str, ...]:
        """Every variable that can be intervened on: the inputs and the computed ones (not ``answer``)."""
        return self.inputs + tuple(v for v in self.mechanisms if v != "answer")

    def check_variable(self, variable: str) -> str:
        if variable not in self.variables:
            raise InputKeyError(f"Causal model {self.name!r} has no variable {variable!r}; its variables are "
                                f"{', '.join(self.variables)}.")
        return variable

    def run(self, inputs: Mapping[str, Fraction], interventions: Mapping[str, Fraction] | None = None) -> Values:
        """Every variable's value (``answer`` included) for ``inputs``, with ``interventions`` fixing some variables."""
        interventions = dict(interventions or {})
        for variable in interventions:
            self.check_variable(variable)
        values: Values = {name: Fraction(interventions.get(name, inputs[name])) for name in self.inputs}
        for name, mechanism in self.mechanisms.items():
            values[name] = Fraction(interventions[name]) if name in interventions else \
                Fraction(mechanism.compute(*(values[p] for p in mechanism.parents)))
        return values

    def counterfactual(self, base: Mapping[str, Fraction], source: Mapping[str, Fraction], variable: str) -> Fraction:
        """The answer of ``base`` with ``variable`` set to its value on ``source`` (the interchange's prediction)."""
        self.check_variable(variable)
        return self.run(base, {variable: self.run(source)[variable]})["answer"]


# ---------------------------------------------------------------------------- the tasks


def _one_digit_inputs(row: Mapping) -> Values:
    return {"a": Fraction(row["a"]), "b": Fraction(row["b"])}


def one_digit_model(op: str) -> CausalModel:
    """``a op b`` with one-digit operands: ``a``, ``b``, ``result`` and, for ``+`` and ``*``, its ``tens`` and ``ones``."""
    operation = resolve_operation(op)
    mechanisms = {"result": Mechanism(("a", "b"), operation.compute)}
    two_digit_results = operation.symbol in ("+", "*")
    if two_digit_results:
        mechanisms |= {"tens": Mechanism(("result",), lambda r: r // 10), "ones": Mechanism(("result",), lambda r: r % 10),
                       "answer": Mechanism(("tens", "ones"), lambda t, o: 10 * t + o)}
    else:
        mechanisms["answer"] = Mechanism(("result",), lambda r: r)
    # the digits are variables too (--variables tens ones) but not tested by default: at END a digit of a two-token
    # sum is not read where it is swapped, so their verdicts need the answer span and many pairs (docs/results.md)
    tested = ("a", "b", "result")
    return CausalModel(operation.name, ("a", "b"), mechanisms, _one_digit_inputs,
                       TaskConfig(op=operation.symbol, template_ids=(f"{operation.name[:3]}-equation-0",),
                                  operand_range=(0, 9)), tested,
                       f"one-digit a {operation.symbol} b = result")


def _two_digit_inputs(row: Mapping) -> Values:
    a, b = int(row["a"]), int(row["b"])
    return {"a_tens": Fraction(a // 10), "a_ones": Fraction(a % 10), "b_tens": Fraction(b // 10), "b_ones": Fraction(b % 10)}


def two_digit_addition_model() -> CausalModel:
    """MIB's arithmetic task, "The sum of AB and CD is": the sum's ``ones`` digit, ``ones_carry``, ``tens``, ``hundreds``."""
    mechanisms = {
        "ones": Mechanism(("a_ones", "b_ones"), lambda x, y: (x + y) % 10),
        "ones_carry": Mechanism(("a_ones", "b_ones"), lambda x, y: (x + y) // 10),
        "tens": Mechanism(("a_tens", "b_tens", "ones_carry"), lambda x, y, c: (x + y + c) % 10),
        "hundreds": Mechanism(("a_tens", "b_tens", "ones_carry"), lambda x, y, c: (x + y + c) // 10),
        "answer": Mechanism(("hundreds", "tens", "ones"), lambda h, t, o: 100 * h + 10 * t + o),
    }
    return CausalModel("two_digit_addition", ("a_tens", "a_ones", "b_tens", "b_ones"), mechanisms, _two_digit_inputs,
                       TaskConfig(op="+", template_ids=("add-statement-0",), operand_range=(10, 99)),
                       ("ones", "ones_carry", "tens"), "two-digit AB + CD (MIB: 'The sum of AB and CD is')")


#: The causal models by name: the one-digit operations by symbol, and MIB's two-digit addition.
#: every causal model by name, each built by its record of :data:`patching.variables.catalogue.CAUSAL_MODELS` (the one
#: list of names, which the command line reads without torch)
CAUSAL_MODELS: dict[str, Callable[[], CausalModel]] = {name: record.build for name, record in CATALOGUED_MODELS.items()}


def causal_model(name: str) -> CausalModel:
    """The causal model registered as ``name`` (:data:`CAUSAL_MODELS`)."""
    check_option("causal model", name, tuple(CAUSAL_MODELS))
    return CAUSAL_MODELS[name]()


# ---------------------------------------------------------------------------- pairs


@dataclass(frozen=True)
class InterchangePair:
    """Dataset rows ``base`` and ``source``, the variable swapped, and the answer the causal model then predicts.

    ``answer_ids`` are the predicted answer's tokens after the base prompt; ``control`` pairs leave the
    variable unchanged, so their predicted answer is the base's own.
    """

    base: int
    source: int
    variable: str
    answer: str
    answer_ids: tuple[int, ...]
    control: bool = False


@dataclass(frozen=True)
class PairSettings:
    """How many pairs per variable, how they are split, and how the answers are scored.

    ``scoring``: ``"first"`` (the first answer token must be top-1) or ``"whole"`` (every answer token,
    teacher-forced; needed where an intervention changes a later digit only, as in two-digit sums on a
    tokenizer that splits digits). ``split``: train, validation and test fractions of the pairs.
    """

    n_pairs: int = 96
    n_controls: int = 32
    split: tuple[float, float, float] = (0.5, 0.25, 0.25)
    scoring: str = "whole"
    min_pairs: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive_int(self.n_pairs, "n_pairs")
        check_positive_int(self.n_controls, "n_controls")
        check_positive_int(self.min_pairs, "min_pairs")
        check_option("scoring", self.scoring, ("first", "whole"))
        if len(self.split) != 3 or not all(math.isfinite(f) and f > 0 for f in self.split) \
                or abs(sum(self.split) - 1) > 1e-9:
            raise InputError(f"split must be three positive fractions (train, validation, test) summing to 1, "
                             f"got {self.split!r}.")


def correct_rows(model, dataset, scoring: str = "whole", batch_size: int = 32) -> list[bool]:
    """Per dataset row: does ``model`` answer it correctly under ``scoring`` (:func:`circuits.answer_scoring.score_rows`)?"""
    from circuits.answer_scoring import score_rows  # scoring needs TransformerLens; the causal models do not

    return [bool(ok) for ok in score_rows(model, dataset, scoring, batch_size)]


def _valid_answer(value: Fraction) -> bool:
    # answers the templates can ask for: whole numbers >= 0 (a negative or fractional one has no prompt twin)
    return value.denominator == 1 and value >= 0


def interchange_pairs(causal: CausalModel, dataset, correct: Sequence[bool], variable: str, tokenizer, *,
                      n_pairs: int, control: bool = False, min_pairs: int = 1, seed: int = 0) -> list[InterchangePair]:
    """Up to ``n_pairs`` (base, source) pairs of correctly answered rows for ``variable`` (module docstring).

    Base and source have the same token length (positions align). A counterfactual pair changes the
    variable and the answer; a control pair keeps the variable and changes the source's answer. Pairs
    whose predicted answer is not a whole number >= 0 are skipped. Raises :class:`TaskDataError` with
    fewer than ``min_pairs``.
    """
    causal.check_variable(variable)
    if len(correct) != len(dataset):
        raise InputError(f"correct has {len(correct)} entries for {len(dataset)} dataset rows: pass one per row.")
    rows = dataset.select_columns(["a", "b", "prompt", "end_pos"]).to_list()
    kept = [i for i, ok in enumerate(correct) if ok]
    values = {i: causal.run(causal.read_inputs(rows[i])) for i in kept}
    tok = getattr(tokenizer, "tokenizer", None) or tokenizer
    rng = random.Random(f"{seed}/{variable}/{control}")
    candidates = [(i, j) for i in kept for j in kept if i != j and rows[i]["end_pos"] == rows[j]["end_pos"]]
    rng.shuffle(candidates)
    pairs = []
    for base, source in candidates:
        same_value = values[base][variable] == values[source][variable]
        if same_value != control or values[base]["answer"] == values[source]["answer"]:
            continue
        predicted = causal.run(causal.read_inputs(rows[base]), {variable: values[source][variable]})["answer"]
        if not _valid_answer(predicted) or (not control and predicted == values[base]["answer"]):
            continue
        answer = format_number(predicted)
        pairs.append(InterchangePair(base, source, variable, answer,
                                     tuple(answer_token_ids(tok, rows[base]["prompt"], answer)), control))
        if len(pairs) == n_pairs:
            break
    if len(pairs) < min_pairs:
        kind = "control" if control else "counterfactual"
        raise TaskDataError(
            f"Only {len(pairs)} {kind} pairs for variable {variable!r} of {causal.name!r} from the {len(kept)} of "
            f"{len(dataset)} prompts the model answers correctly; at least {min_pairs} are needed. Sample more "
            f"prompts (n_prompts), add solved examples (n_shots), or test a model that answers more of them.")
    return pairs


@dataclass
class PairSplit:
    """Pairs of one variable: ``train`` (to fit featurizers), ``validation`` (to choose k), ``test`` (IIA), ``controls``."""

    variable: str
    train: list[InterchangePair]
    validation: list[InterchangePair]
    test: list[InterchangePair]
    controls: list[InterchangePair] = field(default_factory=list)

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "validation": len(self.validation), "test": len(self.test),
                "controls": len(self.controls)}


def split_pairs(pairs: Sequence[InterchangePair], split: tuple[float, float, float], *, seed: int = 0,
                min_per_split: int = 1) -> tuple[list, list, list]:
    """Train, validation and test lists of ``pairs`` in the ``split`` fractions (shuffled with ``seed``).

    Pairs that share a base prompt go to the same split, so no test prompt was seen while fitting.
    """
    bases = sorted({p.base for p in pairs})
    random.Random(seed).shuffle(bases)
    bounds = [round(len(bases) * split[0]), round(len(bases) * (split[0] + split[1]))]
    groups = [set(bases[:bounds[0]]), set(bases[bounds[0]:bounds[1]]), set(bases[bounds[1]:])]
    parts = tuple([p for p in pairs if p.base in group] for group in groups)
    small = [name for name, part in zip(("train", "validation", "test"), parts) if len(part) < min_per_split]
    if small:
        raise TaskDataError(f"Splitting {len(pairs)} pairs ({len(bases)} base prompts) by {split} leaves "
                            f"{', '.join(small)} with fewer than {min_per_split} pairs: ask for more pairs (n_pairs) "
                            "or sample more prompts.")
    return parts


def variable_pairs(model, causal: CausalModel, dataset, variables: Sequence[str] | None = None,
                   settings: PairSettings = PairSettings(), correct: Sequence[bool] | None = None) -> dict[str, PairSplit]:
    """Per variable (default ``causal.tested``): counterfactual pairs split three ways, and control pairs.

    ``model`` scores the prompts (:func:`correct_rows`) unless ``correct`` is given; its tokenizer tokenizes
    the predicted answers.
    """
    if correct is None:
        correct = correct_rows(model, dataset, settings.scoring)
    out = {}
    for variable in variables or causal.tested:
        pairs = interchange_pairs(causal, dataset, correct, variable, model, n_pairs=settings.n_pairs,
                                  min_pairs=settings.min_pairs, seed=settings.seed)
        train, validation, test = split_pairs(pairs, settings.split, seed=settings.seed)
        controls = interchange_pairs(causal, dataset, correct, variable, model, n_pairs=settings.n_controls,
                                     control=True, min_pairs=0, seed=settings.seed)
        out[variable] = PairSplit(variable, train, validation, test, controls)
    return out


def task_config(causal: CausalModel, **overrides) -> TaskConfig:
    """The :class:`TaskConfig` of the causal model's prompts with ``overrides`` (``n_prompts``, ``n_shots``, ``seed``)."""
    return replace(causal.task, **overrides)


def query_positions(row: Mapping, tokenizer) -> dict[str, int]:
    """``{label: position}`` for every token of the queried problem, from its first operand to END.

    Operand and operator tokens are labelled by their role (``a``, ``op``, ``b``; ``a0``, ``a1``, ... when
    a role spans several tokens), END as ``end``, and the template's other tokens by their text.
    """
    tok = getattr(tokenizer, "tokenizer", None) or tokenizer
    roles = {}
    for role in ("a", "op", "b"):
        positions = list(row[f"{role}_pos"])
        for i, position in enumerate(positions):
            roles[position] = role if len(positions) == 1 else f"{role}{i}"
    labels = {}
    for position in range(min(row["a_pos"]), row["end_pos"] + 1):
        text = tok.convert_ids_to_tokens(row["tokens"][position])
        label = "end" if position == row["end_pos"] else roles.get(position, repr(tok.convert_tokens_to_string([text])))
        labels[label if label not in labels else f"{label}@{position}"] = position
    return labels
