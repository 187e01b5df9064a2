"""Two classic circuit tasks, generated and seeded: IOI and greater-than, as :class:`circuits.pair_tasks.PairTask` s.

**IOI** (Wang et al., ICLR 2023): "When Mary and John went to the store, John gave a drink to" -> " Mary".
The templates are the paper's (:data:`IOI_TEMPLATES`; ``{A}`` the indirect object, ``{B}`` the subject,
which returns as the second subject), in both orders (ABBA: A first; BABA: B first), with the paper's
names, places and objects. The metric is ``"logit_diff"``: logit(IO) − logit(S) at END. The
counterfactual is ABC: the three name slots get three other, distinct names (Wang et al.'s "ABC"
distribution), so the sentence keeps its structure and loses which name is the answer. Names are
drawn again until the twin tokenises to as many tokens as the prompt and the answer's first token differs
from the distractor's. The answer is written ``" " + name`` after the prompt; on a tokenizer that makes the
space a token of its own (the tests' character tokenizer), the space moves into the prompt, so that the
scored first token is the name's.

**Greater-than** (Hanna et al., NeurIPS 2023): "The war lasted from the year 1732 to the year 17" -> a year
> 32. The nouns are the paper's (:data:`GT_NOUNS`), centuries 11..17. The counterfactual is the same
sentence with the year 01 ("from the year 1701"): every year is then greater. The metric is
``"prob_diff"``: Σ p(year > YY) − Σ p(year ≤ YY) at END.

*Tokenizers that split digits* (gemma, Llama; the character tokenizer) write the year's two digits as
two tokens, so p(year) is the chain-rule product p(d1) · p(d2 | d1), which one forward does not give.
The edge methods score one forward's END logits, so this module **restricts to what one forward gives**:
the candidates are the ten digit tokens and the threshold is the first digit Y1 of YY, so the metric is
P(d1 > Y1) − P(d1 ≤ Y1). By default on such tokenizers YY ends in 9 (``decade_ends``: YY in 19, 29, ..., 89):
then "year > YY" is exactly "d1 > Y1" and "year ≤ YY" exactly "d1 ≤ Y1", so the one-forward metric *is*
the chain-rule metric (up to the mass the model puts on a second token that is not a digit). With
``decade_ends=False`` (YY in 10..98) the one-forward metric is a lower bound of the two-digit one: it
counts the tied decade d1 = Y1 wholly as ≤, where the chain rule would count its years above YY as >.
On tokenizers with one token per two-digit year (GPT-2's "32") the candidates are the year tokens
00..99 and the metric is Hanna et al.'s exactly, YY in 02..98.

Each generator is seeded (:class:`IOIConfig`, :class:`GreaterThanConfig`): the same settings give the same rows,
and every twin has its prompt's token length.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

from circuits.arguments import check_positive_int
from circuits.errors import TaskDataError
from circuits.pair_tasks import PairRow, PairTask, continuation_ids, pair_row

#: Wang et al.'s BABA templates (``{B}`` first); ABBA swaps the first two names.
IOI_TEMPLATES = (
    "Then, {B} and {A} went to the {PLACE}. {B} gave a {OBJECT} to",
    "Then, {B} and {A} had a lot of fun at the {PLACE}. {B} gave a {OBJECT} to",
    "Then, {B} and {A} were working at the {PLACE}. {B} decided to give a {OBJECT} to",
    "Then, {B} and {A} were thinking about going to the {PLACE}. {B} wanted to give a {OBJECT} to",
    "Then, {B} and {A} had a long argument, and afterwards {B} said to",
    "After {B} and {A} went to the {PLACE}, {B} gave a {OBJECT} to",
    "When {B} and {A} got a {OBJECT} at the {PLACE}, {B} decided to give it to",
    "When {B} and {A} got a {OBJECT} at the {PLACE}, {B} decided to give the {OBJECT} to",
    "While {B} and {A} were working at the {PLACE}, {B} gave a {OBJECT} to",
    "While {B} and {A} were commuting to the {PLACE}, {B} gave a {OBJECT} to",
    "After the lunch, {B} and {A} went to the {PLACE}. {B} gave a {OBJECT} to",
    "Afterwards, {B} and {A} went to the {PLACE}. {B} gave a {OBJECT} to",
    "Then, {B} and {A} had a long argument. Afterwards {B} said to",
    "The {PLACE} {B} and {A} went to had a {OBJECT}. {B} gave it to",
    "Friends {B} and {A} found a {OBJECT} at the {PLACE}. {B} gave it to",
)
IOI_NAMES = (
    "Michael", "Christopher", "Jessica", "Matthew", "Ashley", "Jennifer", "Joshua", "Amanda", "Daniel", "David",
    "James", "Robert", "John", "Joseph", "Andrew", "Ryan", "Brandon", "Jason", "Justin", "Sarah", "William",
    "Jonathan", "Stephanie", "Brian", "Nicole", "Nicholas", "Anthony", "Heather", "Eric", "Elizabeth", "Adam",
    "Megan", "Melissa", "Kevin", "Steven", "Thomas", "Timothy", "Christina", "Kyle", "Rachel", "Laura", "Lauren",
    "Amber", "Brittany", "Danielle", "Richard", "Kimberly", "Jeffrey", "Amy", "Crystal", "Michelle", "Tiffany",
    "Jeremy", "Benjamin", "Mark", "Emily", "Aaron", "Charles", "Rebecca", "Jacob", "Stephen", "Patrick", "Sean",
    "Erin", "Zachary", "Jamie", "Kelly", "Samantha", "Nathan", "Sara", "Dustin", "Paul", "Angela", "Tyler",
    "Scott", "Katherine", "Andrea", "Gregory", "Erica", "Mary", "Travis", "Lisa", "Kenneth", "Bryan", "Lindsey",
    "Kristen", "Jose", "Alexander", "Jesse", "Katie", "Lindsay", "Shannon", "Vanessa", "Courtney", "Christine",
    "Alicia", "Cody", "Allison", "Bradley", "Samuel",
)
IOI_PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "house", "station")
IOI_OBJECTS = ("ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack")
#: Hanna et al.'s nouns (a subset): "The {noun} lasted from the year {century}{YY} to the year {century}".
GT_NOUNS = (
    "abduction", "accord", "affair", "agreement", "appraisal", "assaults", "assessment", "attack", "attempts",
    "campaign", "captivity", "case", "challenge", "chaos", "clash", "collaboration", "coma", "competition",
    "confrontation", "consequence", "conspiracy", "construction", "consultation", "contact", "contract",
    "convention", "cooperation", "custody", "deal", "decline", "decrease", "demonstrations", "development",
    "disagreement", "disorder", "dispute", "domination", "dynasty", "effect", "effort", "employment", "endeavor",
    "engagement", "epidemic", "evaluation", "exchange", "existence", "expansion", "expedition", "experiments",
    "fall", "fame", "flights", "friendship", "growth", "hardship", "hostility", "illness", "impact",
    "imprisonment", "improvement", "incarceration", "increase", "insurgency", "invasion", "investigation",
    "journey", "kingdom", "marriage", "modernization", "negotiation", "notoriety", "obstruction", "operation",
    "order", "outbreak", "outcome", "overhaul", "patrols", "pilgrimage", "plague", "plan", "practice", "process",
    "program", "progress", "project", "pursuit", "quest", "raids", "reforms", "reign", "relationship",
    "retaliation", "riot", "rise", "rivalry", "romance", "rule", "sanctions", "shift", "siege", "slump",
    "stature", "stint", "strikes", "study", "test", "testing", "tests", "therapy", "tour", "tradition", "treaty",
    "trial", "trip", "unemployment", "voyage", "war", "warfare", "work",
)
GT_TEMPLATE = "The {noun} lasted from the year {century}{yy} to the year {century}"
DRAWS = 200  # name / year draws tried per prompt before giving up


@dataclass(frozen=True)
class IOIConfig:
    """How many IOI prompts, from which seed (orders: ABBA and BABA alternate)."""

    n_prompts: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive_int(self.n_prompts, "n_prompts")


@dataclass(frozen=True)
class GreaterThanConfig:
    """How many greater-than prompts, from which seed; ``decade_ends`` (None: on digit-splitting tokenizers)
    draws YY ending in 9, where the one-forward metric equals the chain-rule one (module docstring)."""

    n_prompts: int = 64
    seed: int = 0
    centuries: tuple[int, ...] = (11, 12, 13, 14, 15, 16, 17)
    decade_ends: Optional[bool] = None

    def __post_init__(self) -> None:
        check_positive_int(self.n_prompts, "n_prompts")


def _tok(tokenizer):
    return getattr(tokenizer, "tokenizer", None) or tokenizer


def _vocab(tokenizer) -> int:
    cfg = getattr(tokenizer, "cfg", None)
    return cfg.d_vocab_out if cfg is not None else len(_tok(tokenizer))


def _length(tokenizer, text: str) -> int:
    return len(_tok(tokenizer)(text, add_special_tokens=True)["input_ids"])


# ---------------------------------------------------------------------------- IOI


def _ioi_texts(template: str, abba: bool, io: str, s: str, third: Optional[str], place: str, obj: str) -> str:
    """The template with IO ``io`` and subject ``s`` (``"{B} and {A}"`` becomes ``"io and s"`` when ``abba``);
    ``third`` (ABC) replaces the returning subject."""
    first, second = (io, s) if abba else (s, io)
    text = template.replace("{B} and {A}", f"{first} and {second}", 1).replace("{B}", third or s)
    return text.replace("{PLACE}", place).replace("{OBJECT}", obj)


def _ioi_row(tokenizer, rng: random.Random, template: str, abba: bool, vocab: int) -> dict:
    place, obj = rng.choice(IOI_PLACES), rng.choice(IOI_OBJECTS)
    tok = _tok(tokenizer)
    for _ in range(DRAWS):
        io, s, *abc = rng.sample(IOI_NAMES, 5)
        clean = _ioi_texts(template, abba, io, s, None, place, obj)
        corrupted = _ioi_texts(template, abba, abc[0], abc[1], abc[2], place, obj)
        answer, distractor = " " + io, " " + s
        if not tok.decode(continuation_ids(tok, clean, answer)[:1]).strip():  # the space is a token of its own
            clean, corrupted, answer, distractor = clean + " ", corrupted + " ", io, s
        if _length(tok, clean) != _length(tok, corrupted):
            continue
        first = continuation_ids(tok, clean, answer)[0], continuation_ids(tok, clean, distractor)[0]
        if first[0] != first[1]:
            row = PairRow(clean, corrupted, answer=answer, distractor=distractor, where="IOI")
            return pair_row(tokenizer, row, vocab) | {"template": template, "order": "ABBA" if abba else "BABA"}
    raise TaskDataError(f"No names keep the IOI template {template!r} at one token length in its ABC twin with "
                        f"distinct first answer tokens after {DRAWS} draws; this tokenizer splits the names unevenly.")


def make_ioi(tokenizer, config: IOIConfig = IOIConfig()) -> PairTask:
    """``config.n_prompts`` IOI prompts with ABC twins (module docstring), metric ``"logit_diff"``."""
    from datasets import Dataset

    rng, vocab = random.Random(f"ioi/{config.seed}"), _vocab(tokenizer)
    rows = [_ioi_row(tokenizer, rng, IOI_TEMPLATES[i % len(IOI_TEMPLATES)], i % 2 == 0, vocab)
            for i in range(config.n_prompts)]
    return PairTask("ioi", Dataset.from_list(rows), "logit_diff",
                    description="IOI (Wang et al. 2023): logit(IO) - logit(S), ABC counterfactual")


# ---------------------------------------------------------------------------- greater-than


def year_candidates(tokenizer, prompt: str) -> tuple[list[int], bool]:
    """The candidate tokens after ``prompt`` in order, and whether they are whole years (00..99) rather than the
    digits 0..9 (a digit-splitting tokenizer)."""
    tok = _tok(tokenizer)
    years = [continuation_ids(tok, prompt, f"{y:02d}") for y in range(100)]
    if all(len(ids) == 1 for ids in years) and len({ids[0] for ids in years}) == 100:
        return [ids[0] for ids in years], True
    digits = [continuation_ids(tok, prompt, str(d)) for d in range(10)]
    if not all(len(ids) == 1 for ids in digits) or len({ids[0] for ids in digits}) != 10:
        raise TaskDataError(f"After {prompt!r} this tokenizer writes neither each two-digit year nor each digit as "
                            "one token; the greater-than metric needs one of the two.")
    return [ids[0] for ids in digits], False


def _gt_years(config: GreaterThanConfig, whole_years: bool) -> list[int]:
    if whole_years:
        return list(range(2, 99))
    if config.decade_ends is False:
        return list(range(10, 99))
    return list(range(19, 99, 10))


def make_greater_than(tokenizer, config: GreaterThanConfig = GreaterThanConfig()) -> PairTask:
    """``config.n_prompts`` greater-than prompts with 01 twins (module docstring), metric ``"prob_diff"``."""
    from datasets import Dataset

    rng, vocab, tok = random.Random(f"greater-than/{config.seed}"), _vocab(tokenizer), _tok(tokenizer)
    ordered, whole_years = year_candidates(tok, GT_TEMPLATE.format(noun="war", century=17, yy="32"))
    if whole_years and config.decade_ends:
        raise TaskDataError("decade_ends applies to tokenizers that split years into digits; this one has a token "
                            "per two-digit year, where the metric is exact for every YY: leave decade_ends None.")
    rows = []
    for _ in range(config.n_prompts):
        for _ in range(DRAWS):
            noun, century, yy = rng.choice(GT_NOUNS), rng.choice(config.centuries), rng.choice(_gt_years(config,
                                                                                                      whole_years))
            clean = GT_TEMPLATE.format(noun=noun, century=century, yy=f"{yy:02d}")
            corrupted = GT_TEMPLATE.format(noun=noun, century=century, yy="01")
            if _length(tok, clean) == _length(tok, corrupted):
                break
        else:
            raise TaskDataError("No greater-than prompt keeps its 01 twin at one token length; this tokenizer "
                                f"splits years unevenly after {DRAWS} draws.")
        threshold = ordered[yy] if whole_years else ordered[yy // 10]
        row = PairRow(clean, corrupted, correct_idx=threshold, incorrect_idx=ordered[0], where="greater-than")
        rows.append(pair_row(tok, row, vocab) | {"year": yy, "noun": noun, "century": century})
    return PairTask("greater-than", Dataset.from_list(rows), "prob_diff", tuple(ordered),
                    description="greater-than (Hanna et al. 2023): P(year > YY) - P(year <= YY), 01 counterfactual"
                                + ("" if whole_years else "; digit tokens, first digit only (circuits.classic_tasks)"))


# ---------------------------------------------------------------------------- a task by name


#: the arithmetic operations by the names ``--task`` takes (their prompts come from :mod:`circuits.tasks`)
ARITHMETIC_TASKS = {"addition": "+", "subtraction": "-", "multiplication": "*", "division": "/"}
CLASSIC_TASKS = ("ioi", "greater-than")


def task_kind(task: str) -> str:
    """``"arithmetic"``, ``"classic"`` or ``"file"`` (a prompt-pair file, :mod:`circuits.pair_tasks`); a name that is
    none of them is an error listing the names."""
    from pathlib import Path

    from circuits.errors import InputError

    if task in ARITHMETIC_TASKS:
        return "arithmetic"
    if task in CLASSIC_TASKS:
        return "classic"
    if Path(task).is_file():
        return "file"
    raise InputError(f"Unknown task {task!r}: use one of {', '.join([*ARITHMETIC_TASKS, *CLASSIC_TASKS])}, or the "
                     "path of a prompt-pair file (CSV or JSON lines; no such file exists).")


def make_task(tokenizer, task: str, n_prompts: int = 64, seed: int = 0) -> PairTask:
    """The classic task named ``task`` (``n_prompts``, ``seed``) or the pair file at the path ``task``."""
    from circuits.pair_tasks import read_pairs

    kind = task_kind(task)
    if kind == "arithmetic":
        raise TaskDataError(f"{task!r} is an arithmetic task: build its prompts with circuits.tasks.make_dataset.")
    if task == "ioi":
        return make_ioi(tokenizer, IOIConfig(n_prompts, seed))
    if task == "greater-than":
        return make_greater_than(tokenizer, GreaterThanConfig(n_prompts, seed))
    return read_pairs(task, tokenizer)
