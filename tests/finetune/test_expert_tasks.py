"""finetune.expert_tasks: the merge experiment's three tasks, split so that no test item is trained on."""

import re

import pytest

from circuits.errors import InputError
from tests.tiny_models import char_tokenizer
from finetune.expert_tasks import (
    EXPERT_TASKS, SPLITS, ExpertTaskConfig, english_word, expert_task_data, french_pairs, french_word,
    number_word_split,
)


@pytest.fixture(scope="module")
def data():
    return expert_task_data(char_tokenizer(), ExpertTaskConfig(n_train=20, n_val=4, n_test=6, n_shots=2, seed=3))


def test_every_task_and_split_has_the_asked_size(data):
    sizes = {"train": 20, "val": 4, "test": 6}
    assert set(data) == {(t, s) for t in EXPERT_TASKS for s in SPLITS}
    for (task, split), rows in data.items():
        assert len(rows) == sizes[split], (task, split)
        assert {"prompt", "answer"} <= set(rows.column_names)


def test_number_words_are_split_without_overlap():
    words = number_word_split(seed=7)
    assert sorted(words["train"] + words["val"] + words["test"]) == list(range(31))
    assert (len(words["test"]), len(words["val"]), len(words["train"])) == (9, 6, 16)
    assert number_word_split(seed=7) == words and number_word_split(seed=8) != words
    big = number_word_split(seed=0, max_number=999, n_test=250, n_val=100)
    assert sorted(big["train"] + big["val"] + big["test"]) == list(range(1000))
    assert (len(big["test"]), len(big["val"]), len(big["train"])) == (250, 100, 650)


def test_number_words_are_num2words_spellings():
    # Hand-written reference spellings (traditional French orthography, as num2words writes it).
    assert [english_word(n) for n in (7, 21, 307)] == ["seven", "twenty-one", "three hundred and seven"]
    assert [french_word(n) for n in (7, 21, 71, 80, 97, 307)] == [
        "sept", "vingt et un", "soixante et onze", "quatre-vingts", "quatre-vingt-dix-sept", "trois cent sept"]


def test_translation_prompts_use_training_words_as_shots_and_answer_in_french(data):
    words = number_word_split(seed=3)
    english_test = {english_word(n): n for n in words["test"]}
    for row in data[("en_fr", "test")]:
        *shots, query = row["prompt"].split("English: ")[1:]
        assert query.split("\n")[0] in english_test and len(shots) == 2
        assert all(shot.split("\n")[0] not in english_test for shot in shots)  # no test word leaks into a shot
        assert row["answer"] == " " + french_word(english_test[query.split("\n")[0]])


def test_many_translation_numbers_keep_test_validation_and_training_queries_apart():
    cfg = ExpertTaskConfig(n_train=300, n_val=100, n_test=250, n_shots=1, max_number=999, n_test_numbers=250,
                           n_val_numbers=100)
    data = expert_task_data(char_tokenizer(), cfg)
    english = {english_word(n): n for n in range(1000)}
    queries = {s: {english[r["prompt"].split("English: ")[-1].split("\n")[0]] for r in data[("en_fr", s)]}
               for s in SPLITS}
    assert len(queries["test"]) == 250 and len(queries["val"]) == 100  # every test number asked once
    assert not queries["test"] & queries["val"] and not (queries["test"] | queries["val"]) & queries["train"]


def test_french_pairs_cycle_through_the_queries():
    words = {"train": [1, 2, 3], "val": [], "test": [4, 5]}
    pairs = french_pairs(words, [4, 5], n=4, n_shots=1, seed=0)
    assert [p[1] for p in pairs] == [" quatre", " cinq", " quatre", " cinq"]


def test_arithmetic_tasks_hold_out_their_test_templates(data):
    for task in ("add_word", "mul"):
        train = set(data[(task, "train")]["template_id"])
        test = set(data[(task, "test")]["template_id"])
        assert train and test and not train & test


def test_mul_operands_follow_the_configured_range():
    data = expert_task_data(char_tokenizer(), ExpertTaskConfig(n_train=40, n_val=4, n_test=40, mul_operands=(10, 19)))
    for split in ("train", "test"):
        for row in data[("mul", split)]:
            numbers = [int(x) for x in re.findall(r"\d+", row["query"])]
            assert all(10 <= x <= 19 for x in numbers[:2]), row["query"]
            assert int(row["answer"]) == numbers[0] * numbers[1]


def test_too_few_training_numbers_is_a_clear_error():
    with pytest.raises(InputError, match="raise max_number"):
        ExpertTaskConfig(max_number=10, n_test_numbers=6, n_val_numbers=4, n_shots=1)
