"""A task as data: prompt pairs read from a file, in the rows every patching and edge-circuit method takes.

An edge circuit needs, per prompt, a *clean* prompt, a *corrupted* twin (what out-of-circuit edges carry)
and what the metric scores at END. :mod:`circuits.tasks` generates such rows for arithmetic;
this module reads them from a file, so any task (IOI, greater-than, one of your own) runs through the same
methods. A file is CSV (a header line) or JSON lines (one object per line), in one of two forms:

* **ids** (hannamw/EAP-IG's datasets): columns ``clean``, ``corrupted``, ``correct_idx``, ``incorrect_idx``;
  the two indices are token ids of the model's vocabulary (integers);
* **text**: columns ``clean``, ``corrupted``, ``answer``, ``distractor`` (strings); each is tokenised with
  the model's tokenizer as the continuation of the clean prompt (``clean + answer``), and the
  **first token** of each is scored. A multi-token answer is scored by its first token only (the rows
  keep every answer token in ``answer_token_ids``; the chain rule over them would need one forward per
  token, which the END metrics of the edge methods do not take). An answer whose first token equals
  the distractor's (`` Mary`` / `` John`` on a tokenizer that splits off the space) is refused: move the
  shared text into the prompt.

For example (CSV, text form)::

    clean,corrupted,answer,distractor
    "When Mary and John went to the store, John gave a drink to","When Anna and Paul went to the store, Kate gave a drink to", Mary, John

The reader checks the file before any model loads (:func:`read_pair_rows`: an empty file, a missing
column, a cell that is not an integer id, a pair whose answer and distractor are equal) and then against
the tokenizer (:func:`pair_dataset`: ids outside the vocabulary, an answer that merges with the prompt);
every message names the file, the row (1 = the first data row; its line in the file) and the column.

**Pairs of different token length.** The edge engine swaps activations position by position, so a
clean prompt and its corrupted twin must have one length; prompts of different lengths go into
different batches (:func:`circuits.tasks.iter_batches` groups rows by length; the END of each batch is
each row's own last token, as EAP-IG's per-row END). A corrupted prompt longer than its clean prompt is
cut to the clean length: positions after the clean END never reach the metric (causal attention), so
nothing changes. A shorter one is right-padded with the tokenizer's pad token, as EAP-IG pads it (it also
passes an attention mask; here the pad positions are run as tokens). Each row's ``cf_fitted`` column says
which (``"padded"``/``"cut"``/``""``). On a tiny GPT-2-style model, EAP and EAP-IG-inputs scores of files with
both kinds of twin, and with prompts of two lengths, equal hannamw/EAP-IG's ``attribute`` to 1e-6 (relative;
``tests/circuits/test_pair_tasks.py``, run where EAP-IG is importable). EAP-IG-inputs in EAP-IG itself refuses
a batch whose clean and corrupted prompts pad to different lengths; here each row is fitted, so it is not.

:func:`write_eap_csv` writes a task's rows in EAP-IG's four columns, so a pair file round-trips
(text form -> ids form -> the same rows). A :class:`PairTask` is the rows plus the metric that
scores them (``"logit_diff"``: answer − distractor logit, ``"logit"``, ``"prob_diff"`` over
ordered token sets, ``"kl"``: to the full model; :mod:`patching.sweeps.task_metrics` builds them).
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from circuits.atomic_files import atomic_path
from circuits.errors import InputError
from circuits.file_reads import UnreadableFileError

if TYPE_CHECKING:  # datasets loads where rows are built, so that a file is checked before anything heavy loads
    from datasets import Dataset

ID_COLUMNS = ("clean", "corrupted", "correct_idx", "incorrect_idx")
TEXT_COLUMNS = ("clean", "corrupted", "answer", "distractor")
TASK_METRICS = ("logit_diff", "logit", "prob_diff", "kl")


class PairFileError(InputError):
    """A prompt-pair file cannot be read as one: its message names the file, the row and the column."""


@dataclass(frozen=True)
class PairRow:
    """One pair as read from a file: the prompts and either the two token ids or the two strings."""

    clean: str
    corrupted: str
    correct_idx: int | None = None
    incorrect_idx: int | None = None
    answer: str | None = None
    distractor: str | None = None
    where: str = ""  # "path, row n (line l)" for messages


@dataclass(frozen=True)
class PairTask:
    """A task as data: rows (:func:`pair_dataset`), the metric that scores them, and for ``"prob_diff"`` the
    ordered candidate tokens (the row's answer id is its threshold: candidates after it count +, the rest −)."""

    name: str
    rows: "Dataset"
    metric: str = "logit_diff"
    ordered_ids: tuple[int, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        if self.metric not in TASK_METRICS:
            raise InputError(f"Unknown task metric {self.metric!r}: use one of {', '.join(TASK_METRICS)}.")
        if self.metric == "prob_diff" and not self.ordered_ids:
            raise InputError("The prob_diff metric needs ordered_ids: the candidate tokens in order.")

    def to_dict(self) -> dict:
        """results.json's ``task`` keys: name, metric, number of rows, how many twins were cut or padded."""
        fitted = self.rows["cf_fitted"] if "cf_fitted" in self.rows.column_names else []
        return {"name": self.name, "metric": self.metric, "n_rows": len(self.rows), "description": self.description,
                "n_ordered_ids": len(self.ordered_ids), "n_cf_padded": sum(f == "padded" for f in fitted),
                "n_cf_cut": sum(f == "cut" for f in fitted)}


# ---------------------------------------------------------------------------- reading the file


def _records(path: Path) -> list[tuple[int, dict]]:
    """(line, record) of every data row of a CSV or JSON-lines file; a file that cannot be read says why."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a spreadsheet's byte-order mark is not part of the header
    except (OSError, UnicodeDecodeError) as err:
        kind = "a folder" if path.is_dir() else ("missing" if isinstance(err, FileNotFoundError) else str(err))
        raise UnreadableFileError(f"{path}: cannot be read as a prompt-pair file ({kind}); give a CSV or JSON-lines "
                                  "file with the columns clean, corrupted and correct_idx/incorrect_idx or "
                                  "answer/distractor.") from None
    if not text.strip():
        raise PairFileError(f"{path}: the file is empty; a prompt-pair file holds a header (CSV) or JSON objects, "
                            "and at least one pair.")
    if path.suffix.lower() in (".jsonl", ".json") or text.lstrip().startswith("{"):
        return _json_lines(path, text)
    reader = csv.DictReader(text.splitlines())
    rows = [(reader.line_num, row) for row in reader]
    return [(line, {k: v for k, v in row.items() if k is not None}) for line, row in rows]


def _json_lines(path: Path, text: str) -> list[tuple[int, dict]]:
    records = []
    for line, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as err:
            raise PairFileError(f"{path}, line {line}: not a JSON object ({err.msg}); a JSON-lines pair file holds "
                                "one object per line.") from None
        if not isinstance(record, dict):
            raise PairFileError(f"{path}, line {line}: a JSON {type(record).__name__}, not an object with the "
                                "columns clean, corrupted, ...")
        records.append((line, record))
    return records


def _form(path: Path, columns: set[str]) -> tuple[str, ...]:
    """The form (ids or text) the columns name; a missing column is an error naming it."""
    for form in (ID_COLUMNS, TEXT_COLUMNS):
        if set(form[2:]) & columns:
            missing = [c for c in form if c not in columns]
            if missing:
                raise PairFileError(f"{path}: missing column(s) {', '.join(missing)}; a pair file has the columns "
                                    f"{', '.join(form)}.")
            return form
    raise PairFileError(f"{path}: missing columns: found {sorted(columns)}; a pair file has the columns "
                        f"{', '.join(ID_COLUMNS)} (token ids, as EAP-IG) or {', '.join(TEXT_COLUMNS)} (strings).")


def _token_id(value, where: str, column: str) -> int:
    if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
        raise PairFileError(f"{where}, column {column}: {value!r} is not an integer token id.")
    try:
        return int(str(value).strip()) if not isinstance(value, (int, float)) else int(value)
    except ValueError:
        raise PairFileError(f"{where}, column {column}: {value!r} is not an integer token id.") from None


def _text(value, where: str, column: str) -> str:
    if not isinstance(value, str) or not value:
        raise PairFileError(f"{where}, column {column}: empty or not text ({value!r}); give a non-empty string.")
    return value


def read_pair_rows(path) -> list[PairRow]:
    """Every pair of the file at ``path``, checked without a tokenizer (see the module docstring)."""
    path = Path(path)
    records = _records(path)
    if not records:
        raise PairFileError(f"{path}: the file has a header but no pairs; add at least one row.")
    columns = set().union(*(r.keys() for _, r in records))
    form = _form(path, columns)
    rows = []
    for n, (line, record) in enumerate(records, 1):
        where = f"{path}, row {n} (line {line})"
        missing = [c for c in form if record.get(c) in (None, "")]
        if missing:
            raise PairFileError(f"{where}: column {missing[0]} is empty; every row needs {', '.join(form)}.")
        clean, corrupted = _text(record["clean"], where, "clean"), _text(record["corrupted"], where, "corrupted")
        if form is ID_COLUMNS:
            good, bad = (_token_id(record[c], where, c) for c in ("correct_idx", "incorrect_idx"))
            if good == bad:
                raise PairFileError(f"{where}, columns correct_idx/incorrect_idx: both are token {good}; the metric "
                                    "compares two different tokens.")
            rows.append(PairRow(clean, corrupted, correct_idx=good, incorrect_idx=bad, where=where))
        else:
            answer, distractor = _text(record["answer"], where, "answer"), _text(record["distractor"], where,
                                                                                  "distractor")
            if answer == distractor:
                raise PairFileError(f"{where}, columns answer/distractor: both are {answer!r}; the metric compares "
                                    "two different answers.")
            rows.append(PairRow(clean, corrupted, answer=answer, distractor=distractor, where=where))
    return rows


# ---------------------------------------------------------------------------- tokenising


def _tokenizer(tokenizer):
    return getattr(tokenizer, "tokenizer", None) or tokenizer


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def continuation_ids(tokenizer, prompt: str, continuation: str, where: str = "", column: str = "answer") -> list[int]:
    """The token ids of ``continuation`` written after ``prompt``; the prompt's own tokens must not change."""
    tokenizer = _tokenizer(tokenizer)
    prompt_ids, full = _encode(tokenizer, prompt), _encode(tokenizer, prompt + continuation)
    if full[:len(prompt_ids)] != prompt_ids or len(full) == len(prompt_ids):
        raise PairFileError(f"{where}, column {column}: {continuation!r} after the prompt changes the prompt's own "
                            "tokens (the tokenizer merges them) or adds none; end the prompt where the answer "
                            "starts a new token (e.g. move a leading space into the answer).")
    return full[len(prompt_ids):]


def _scored_ids(tokenizer, row: PairRow) -> tuple[list[int], int]:
    """(every answer token, the distractor's first token) of a row; the two first tokens must differ."""
    if row.correct_idx is not None:
        return [row.correct_idx], row.incorrect_idx
    answer = continuation_ids(tokenizer, row.clean, row.answer, row.where, "answer")
    distractor = continuation_ids(tokenizer, row.clean, row.distractor, row.where, "distractor")
    if answer[0] == distractor[0]:
        first = _tokenizer(tokenizer).decode(answer[:1])
        raise PairFileError(f"{row.where}, columns answer/distractor: {row.answer!r} and {row.distractor!r} start "
                            f"with the same token {first!r}, and the first token is what is scored; move the shared "
                            "text into the prompt.")
    return answer, distractor[0]


def _fit(cf: list[int], n: int, pad_id: int) -> tuple[list[int], str]:
    if len(cf) == n:
        return cf, ""
    return (cf[:n], "cut") if len(cf) > n else (cf + [pad_id] * (n - len(cf)), "padded")


def pair_row(tokenizer, row: PairRow, vocab_size: int) -> dict:
    """One row of :func:`pair_dataset` (the columns of :func:`circuits.tasks.make_dataset` that batching reads)."""
    tokenizer = _tokenizer(tokenizer)
    answer_ids, alt_id = _scored_ids(tokenizer, row)
    for column, token in (("correct_idx", answer_ids[0]), ("incorrect_idx", alt_id)):
        if not 0 <= token < vocab_size:
            raise PairFileError(f"{row.where}, column {column}: token id {token} is outside the vocabulary "
                                f"0..{vocab_size - 1} of this model.")
    tokens = _encode(tokenizer, row.clean)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    cf_tokens, fitted = _fit(_encode(tokenizer, row.corrupted), len(tokens), pad if pad is not None else 0)
    return {"prompt": row.clean, "counterfactual": row.corrupted, "tokens": tokens, "cf_tokens": cf_tokens,
            "answer_token_ids": answer_ids, "alt_token_id": alt_id, "answer": row.answer or "",
            "distractor": row.distractor or "", "a_pos": [], "b_pos": [], "op_pos": [], "query_start": 1,
            "end_pos": len(tokens) - 1, "cf_fitted": fitted}


def pair_dataset(tokenizer, rows: Sequence[PairRow], vocab_size: int | None = None) -> "Dataset":
    """The rows as a Dataset every patching method takes (its ``alt_token_id`` column gives ``alt_ids``).

    ``tokenizer``: a Hugging Face tokenizer or a HookedTransformer; ``vocab_size``: the model's (default: the
    model's ``cfg.d_vocab_out`` when a model is given, else the tokenizer's length).
    """
    if vocab_size is None:
        cfg = getattr(tokenizer, "cfg", None)
        vocab_size = cfg.d_vocab_out if cfg is not None else len(_tokenizer(tokenizer))
    from datasets import Dataset

    if not rows:
        raise InputError("No prompt pairs: give at least one row.")
    return Dataset.from_list([pair_row(tokenizer, row, vocab_size) for row in rows])


def read_pairs(path, tokenizer, *, metric: str = "logit_diff", vocab_size: int | None = None) -> PairTask:
    """The pair file at ``path`` as a :class:`PairTask` (its rows tokenised, scored by ``metric``)."""
    rows = read_pair_rows(path)
    return PairTask(Path(path).stem, pair_dataset(tokenizer, rows, vocab_size), metric,
                    description=f"prompt pairs from {path}")


def split_pairs(rows: "Dataset", sizes: Sequence[int], seed: int = 0) -> tuple[list["Dataset"], bool]:
    """``rows`` shuffled with ``seed`` and cut into disjoint parts of ``sizes``, and whether they were scaled down: with
    fewer rows than the sizes ask, every part shrinks in proportion (at least 2 rows each, else an error)."""
    total = sum(sizes)
    scale = min(1.0, len(rows) / total) if total else 1.0
    counts = [int(n * scale) for n in sizes]
    if min(counts) < 2:
        raise InputError(f"{len(rows)} rows cannot be split into parts of {list(sizes)} (at least 2 rows each after "
                         "scaling down): give more rows (more prompts, or a longer pair file), or ask for smaller parts.")
    order = list(range(len(rows)))
    random.Random(f"split_pairs/{seed}").shuffle(order)
    parts, start = [], 0
    for n in counts:
        parts.append(rows.select(order[start:start + n]))
        start += n
    return parts, scale < 1.0


# ---------------------------------------------------------------------------- writing


def write_eap_csv(rows: "Dataset", path) -> Path:
    """``rows`` (a :class:`PairTask`'s, or any Dataset with ``prompt``, ``counterfactual``, ``answer_token_ids`` and
    ``alt_token_id``) as hannamw/EAP-IG's CSV: clean, corrupted, correct_idx (the first answer token),
    incorrect_idx. Written atomically; :func:`read_pairs` reads it back to the same rows."""
    missing = [c for c in ("prompt", "counterfactual", "answer_token_ids", "alt_token_id") if c not in rows.column_names]
    if missing:
        raise InputError(f"Cannot write EAP-IG's CSV: the rows lack the column(s) {', '.join(missing)} (rows of "
                         "circuits.pair_tasks.pair_dataset or circuits.classic_tasks have them).")
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(ID_COLUMNS)
        for row in rows.select_columns(["prompt", "counterfactual", "answer_token_ids", "alt_token_id"]).to_list():
            writer.writerow([row["prompt"], row["counterfactual"], row["answer_token_ids"][0], row["alt_token_id"]])
    return path
