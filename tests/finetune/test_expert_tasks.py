"""finetune.expert_tasks: the merge experiment's three tasks, split so that no test item is trained on."""

import pytest

from tests.tiny_models import char_tokenizer
from finetune.expert_tasks import (
    ENGLISH, EXPERT_TASKS, FRENCH, SPLITS, ExpertTaskConfig, expert_task_data, french_pairs, number_word_split,
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


def test_translation_prompts_use_training_words_as_shots_and_answer_in_french(data):
    words = number_word_split(seed=3)
    english_test = {ENGLISH[n] for n in words["test"]}
    for row in data[("en_fr", "test")]:
        *shots, query = row["prompt"].split("English: ")[1:]
        assert query.split("\n")[0] in english_test and len(shots) == 2
        assert all(shot.split("\n")[0] not in english_test for shot in shots)  # no test word leaks into a shot
        assert row["answer"] == " " + FRENCH[ENGLISH.index(query.split("\n")[0])]


def test_french_pairs_cycle_through_the_queries():
    words = {"train": [1, 2, 3], "val": [], "test": [4, 5]}
    pairs = french_pairs(words, [4, 5], n=4, n_shots=1, seed=0)
    assert [p[1] for p in pairs] == [" quatre", " cinq", " quatre", " cinq"]


def test_arithmetic_tasks_hold_out_their_test_templates(data):
    for task in ("add_word", "mul"):
        train = set(data[(task, "train")]["template_id"])
        test = set(data[(task, "test")]["template_id"])
        assert train and test and not train & test
