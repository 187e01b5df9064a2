"""circuits.pair_tasks: prompt-pair files (EAP-IG's ids form and the text form) read, checked and written back.

Where hannamw/EAP-IG is importable, EAP-IG-inputs scores of a pair file are compared with its ``attribute``.
"""

from __future__ import annotations

import json

import pytest
import torch

from circuits.errors import InputError
from circuits.file_reads import UnreadableFileError
from circuits.pair_tasks import (
    PairFileError, PairTask, pair_dataset, read_pair_rows, read_pairs, write_eap_csv,
)
from circuits.tasks import iter_batches
from tests.tiny_models import char_tokenizer, tiny_model

TOK = char_tokenizer()


def _csv(tmp_path, text: str, name: str = "pairs.csv"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _id(ch: str) -> int:
    return TOK.convert_tokens_to_ids(ch)


def test_text_form_csv_is_tokenised_with_first_tokens_scored(tmp_path):
    path = _csv(tmp_path, "clean,corrupted,answer,distractor\nab=,cd=,xy,zy\nabc=,abd=,7,8\n")
    task = read_pairs(path, TOK)
    assert task.metric == "logit_diff" and task.name == "pairs" and len(task.rows) == 2
    row = task.rows[0]
    assert row["tokens"] == TOK("ab=")["input_ids"] and row["cf_tokens"] == TOK("cd=")["input_ids"]
    assert row["answer_token_ids"] == [_id("x"), _id("y")]  # every answer token kept, the first one scored
    assert row["alt_token_id"] == _id("z") and row["end_pos"] == 3
    batches = list(iter_batches(task.rows, 8))  # rows of different lengths go into different batches
    assert [len(b) for b in batches] == [1, 1] and int(batches[0].answer_ids[0]) == _id("x")


def test_ids_form_jsonl_reads_eap_ig_columns(tmp_path):
    lines = [{"clean": "12+", "corrupted": "12#", "correct_idx": _id("3"), "incorrect_idx": _id("4")},
             {"clean": "5+", "corrupted": "5#", "correct_idx": str(_id("6")), "incorrect_idx": float(_id("1"))}]
    path = _csv(tmp_path, "\n".join(json.dumps(x) for x in lines) + "\n", "pairs.jsonl")
    rows = pair_dataset(TOK, read_pair_rows(path))
    assert rows["answer_token_ids"] == [[_id("3")], [_id("6")]] and rows["alt_token_id"] == [_id("4"), _id("1")]


def test_eap_ig_files_with_their_extra_columns_are_read(tmp_path):
    """EAP-IG's ioi CSV has an unnamed index column and a corrupted_hard column: both are ignored."""
    path = _csv(tmp_path, ",clean,corrupted,corrupted_hard,correct_idx,incorrect_idx\n"
                          f'470,"Then, ab","Then, cd","Then, ef",{_id("x")},{_id("y")}\n')
    (row,) = read_pair_rows(path)
    assert (row.clean, row.corrupted, row.correct_idx, row.incorrect_idx) == ("Then, ab", "Then, cd", _id("x"), _id("y"))


def test_twins_of_other_lengths_are_cut_or_padded(tmp_path):
    path = _csv(tmp_path, "clean,corrupted,answer,distractor\nabc,abcdef,x,y\nabc,a,x,y\n")
    task = read_pairs(path, TOK)
    assert task.rows["cf_fitted"] == ["cut", "padded"]
    assert task.rows[0]["cf_tokens"] == TOK("abc")["input_ids"]  # nothing after the clean END is kept
    assert task.rows[1]["cf_tokens"] == TOK("a")["input_ids"] + [TOK.pad_token_id] * 2
    assert task.to_dict()["n_cf_cut"] == 1 and task.to_dict()["n_cf_padded"] == 1


def test_a_pair_file_round_trips_through_eap_ig_csv(tmp_path):
    path = _csv(tmp_path, "clean,corrupted,answer,distractor\nab=,cd=,xy,zy\n\"a, b\",\"c, d\",7,8\n")
    task = read_pairs(path, TOK)
    written = write_eap_csv(task.rows, tmp_path / "eap.csv")
    assert written.read_text().splitlines()[0] == "clean,corrupted,correct_idx,incorrect_idx"
    again = read_pairs(written, TOK)
    for column in ("prompt", "counterfactual", "tokens", "cf_tokens", "alt_token_id", "end_pos"):
        assert again.rows[column] == task.rows[column], column
    assert [ids[0] for ids in again.rows["answer_token_ids"]] == [ids[0] for ids in task.rows["answer_token_ids"]]
    # and once more: ids form -> ids form is the identity on the file
    assert write_eap_csv(again.rows, tmp_path / "eap2.csv").read_text() == written.read_text()


@pytest.mark.parametrize("text, match", [
    ("", "the file is empty"),
    ("clean,corrupted,answer,distractor\n", "has a header but no pairs"),
    ("clean,corrupted,answer\nab,cd,x\n", r"missing column\(s\) distractor"),
    ("clean,corrupted,correct_idx\nab,cd,3\n", r"missing column\(s\) incorrect_idx"),
    ("prompt,twin\nab,cd\n", "missing columns: found"),
    ("clean,corrupted,answer,distractor\nab,cd,x,x\n", r"row 1 \(line 2\), columns answer/distractor: both are 'x'"),
    ("clean,corrupted,correct_idx,incorrect_idx\nab,cd,5,5\n", r"row 1 \(line 2\), columns correct_idx/incorrect_idx"),
    ("clean,corrupted,correct_idx,incorrect_idx\nab,cd,5,6\nab,cd,x,6\n",
     r"row 2 \(line 3\), column correct_idx: 'x' is not an integer token id"),
    ("clean,corrupted,correct_idx,incorrect_idx\nab,cd,5,6.5\n", "column incorrect_idx: '6.5' is not an integer"),
    ("clean,corrupted,answer,distractor\nab,,x,y\n", "column corrupted is empty"),
])
def test_bad_files_name_the_file_row_and_column(tmp_path, text, match):
    path = _csv(tmp_path, text)
    with pytest.raises(PairFileError, match=match) as err:
        read_pair_rows(path)
    assert str(path) in str(err.value)


def test_bad_json_lines_and_unreadable_files(tmp_path):
    with pytest.raises(PairFileError, match="line 2: not a JSON object"):
        read_pair_rows(_csv(tmp_path, '{"clean": "a"}\n{oops\n', "p.jsonl"))
    with pytest.raises(PairFileError, match="a JSON list, not an object"):
        read_pair_rows(_csv(tmp_path, "[1, 2]\n", "q.jsonl"))
    with pytest.raises(UnreadableFileError, match="cannot be read as a prompt-pair file"):
        read_pair_rows(tmp_path / "missing.csv")


def test_cells_that_are_not_text_and_rows_that_cannot_be_written(tmp_path):
    path = _csv(tmp_path, json.dumps({"clean": 5, "corrupted": "a", "answer": "x", "distractor": "y"}) + "\n", "n.jsonl")
    with pytest.raises(PairFileError, match=r"row 1 \(line 1\), column clean: empty or not text \(5\)"):
        read_pair_rows(path)
    rows = pair_dataset(TOK, read_pair_rows(_csv(tmp_path, "\ufeffclean,corrupted,answer,distractor\nab,cd,x,y\n")))
    with pytest.raises(InputError, match=r"Cannot write EAP-IG's CSV: the rows lack the column\(s\) alt_token_id"):
        write_eap_csv(rows.remove_columns("alt_token_id"), tmp_path / "out.csv")


def test_ids_outside_the_vocabulary_and_clashing_first_tokens_are_refused(tmp_path):
    path = _csv(tmp_path, "clean,corrupted,correct_idx,incorrect_idx\nab,cd,5,6\nab,cd,5,100000\n")
    with pytest.raises(PairFileError, match=r"row 2 \(line 3\), column incorrect_idx: token id 100000 is outside"):
        read_pairs(path, TOK)
    path = _csv(tmp_path, "clean,corrupted,answer,distractor\nab,cd, Mary, John\n", "names.csv")
    with pytest.raises(PairFileError, match="start with the same token ' '"):
        read_pairs(path, TOK)


def test_a_task_names_a_known_metric():
    rows = pair_dataset(TOK, read_pair_rows_from([("ab", "cd", "x", "y")]))
    with pytest.raises(Exception, match="Unknown task metric 'accuracy'"):
        PairTask("t", rows, "accuracy")
    with pytest.raises(Exception, match="prob_diff metric needs ordered_ids"):
        PairTask("t", rows, "prob_diff")


def read_pair_rows_from(quads):
    from circuits.pair_tasks import PairRow

    return [PairRow(c, k, answer=a, distractor=d, where=f"row {i}") for i, (c, k, a, d) in enumerate(quads, 1)]


PAIR_FILES = {  # two prompt lengths (EAP-IG pads them into one batch and reads each row's END; here a batch each)
    "lengths": "ab=1,cd=1,2,3\nxyz=4,zwq=4,5,6\nqr=7,st=7,8,9\n",
    # twins shorter and longer than their prompts (padded and cut here; EAP-IG pads both to one length)
    "twins": "abcd=1,cd=1,2,3\nxy=4,zwqr=4,5,6\n",
}


@pytest.mark.parametrize("method", ["EAP", "EAP-IG-inputs"])
@pytest.mark.parametrize("pairs", sorted(PAIR_FILES))
def test_edge_scores_on_a_pair_file_equal_eap_ig(tmp_path, pairs, method):
    """EAP and EAP-IG-inputs of a pair file against hannamw/EAP-IG's attribute on the same strings (skipped
    without it)."""
    pytest.importorskip("eap.attribute", reason="hannamw/EAP-IG (package 'eap') is not installed; install it in a "
                        "scratch dir and add it to PYTHONPATH to compare against it")
    from eap.attribute import attribute
    from eap.graph import Graph as EapGraph

    from patching import SweepOptions
    from patching.edges import edge_attribution
    from patching.edges.engine import edge_mode

    model = tiny_model(style="gpt2", n_layers=2, seed=3)
    rows = read_pairs(_csv(tmp_path, "clean,corrupted,answer,distractor\n" + PAIR_FILES[pairs]), model).rows
    ours = edge_attribution(model, rows, method=method, ig_steps=3,
                            options=SweepOptions(metric="logit_diff", progress=False)).scores
    labels = torch.tensor([[a[0], b] for a, b in zip(rows["answer_token_ids"], rows["alt_token_id"])])

    def logit_diff_sum(logits, clean_logits, input_lengths, label):
        end = logits[torch.arange(logits.shape[0]), input_lengths - 1]
        return (end.gather(-1, label[:, :1]) - end.gather(-1, label[:, 1:])).sum()

    with edge_mode(model, attn_result=True):
        graph = EapGraph.from_model(model)
        attribute(model, graph, [(list(rows["prompt"]), list(rows["counterfactual"]), labels)], logit_diff_sum,
                  method=method, ig_steps=None if method == "EAP" else 3, quiet=True)
    theirs = graph.scores.detach().float().cpu()
    real = ours.new_ones(ours.shape, dtype=torch.bool) & ~ours.isnan()
    assert ((ours - theirs)[real].abs().max() / theirs[real].abs().max()) < 1e-4
