"""circuits.tasks: datasets of prompts and counterfactual twins, batches, accuracy and filtering, errors."""

from fractions import Fraction

import pytest
import torch

from circuits import tasks
from circuits.answer_scoring import first_token_hits
from circuits.counterfactuals import parse_shots
from circuits.errors import TaskDataError
from circuits.templates import Template, resolve_operation
from tests.tiny_models import char_tokenizer, tiny_model


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


@pytest.mark.parametrize("op", list("+-*/"))
def test_dataset_rows_are_consistent(tok, op):
    ds = tasks.make_dataset(tok, op=op, n_prompts=40, seed=1)
    assert len(ds) == 40
    for row in ds:
        assert len(row["tokens"]) == len(row["cf_tokens"])
        assert row["prompt"] != row["counterfactual"]
        # Twins differ only at the operator positions.
        differing = [i for i, (x, y) in enumerate(zip(row["tokens"], row["cf_tokens"])) if x != y]
        assert differing and set(differing) <= set(row["op_pos"])
        # Operand positions decode to the operands.
        assert tok.decode([row["tokens"][i] for i in row["a_pos"]]).strip() == row["a"]
        assert tok.decode([row["tokens"][i] for i in row["b_pos"]]).strip() == row["b"]
        assert row["end_pos"] == len(row["tokens"]) - 1
        # The answer is correct and its first token is its first character.
        a, b = Fraction(row["a"]), Fraction(row["b"])
        assert Fraction(row["answer"]) == resolve_operation(op).compute(a, b)
        assert tok.decode(row["answer_token_ids"]) == row["answer"]


def test_seeded_and_reproducible(tok):
    one = tasks.make_dataset(tok, n_prompts=30, seed=3).to_list()
    two = tasks.make_dataset(tok, n_prompts=30, seed=3).to_list()
    other = tasks.make_dataset(tok, n_prompts=30, seed=4).to_list()
    assert one == two
    assert one != other


def test_few_shot_prefix_has_n_shots_solved_lines(tok):
    ds = tasks.make_dataset(tok, n_prompts=5, n_shots=3)
    for row in ds:
        lines = row["prompt"].split("\n")
        assert len(lines) == 4 and row["n_shots"] == 3
    zero = tasks.make_dataset(tok, n_prompts=5, n_shots=0)
    assert all("\n" not in r["prompt"] for r in zero)


def test_multi_digit_and_decimal_operands(tok):
    ds = tasks.make_dataset(tok, n_prompts=10, operand_range=(10, 99))
    assert all(len(r["a_pos"]) == 2 for r in ds)
    dec = tasks.make_dataset(tok, n_prompts=10, decimals=1, styles=("equation",))
    assert any("." in r["a"] or "." in r["answer"] for r in dec)


def test_transfer_formats(tok):
    formats = tasks.transfer_datasets(tok, "+", n_prompts=6)
    assert set(formats) == {"multi_digit", "decimal", "word_problem", "zero_shot"}
    assert all(r["style"] == "word_problem" for r in formats["word_problem"])


def test_batches_group_equal_lengths_and_masks_mark_roles(tok):
    ds = tasks.make_dataset(tok, n_prompts=30)
    seen = []
    for batch in tasks.iter_batches(ds, batch_size=4):
        assert batch.tokens.shape == batch.cf_tokens.shape
        for j, index in enumerate(batch.indices):
            row = ds[index]
            assert batch.tokens[j].tolist() == row["tokens"]
            assert batch.role_masks["op"][j].nonzero()[:, 0].tolist() == row["op_pos"]
            assert batch.answer_ids[j].item() == row["answer_token_ids"][0]
        seen += batch.indices
    assert sorted(seen) == list(range(30))


def test_filter_correct_keeps_only_correct_rows():
    model = tiny_model()
    ds = tasks.make_dataset(model, n_prompts=16)
    mask = first_token_hits(model, ds)
    if not any(mask):
        with pytest.raises(TaskDataError, match="none of the 16 prompts"):
            tasks.filter_correct(model, ds)
        return
    kept, acc = tasks.filter_correct(model, ds)
    assert acc == sum(mask) / 16 and len(kept) == sum(mask)


def test_filter_correct_on_a_model_that_always_answers():
    model = tiny_model()
    ds = tasks.make_dataset(model, n_prompts=12, template_ids=("add-equation-0",))
    answers = torch.tensor([r["answer_token_ids"][0] for r in ds])
    # Steer the unembedding bias: first no answer can win, then one answer token always wins.
    with torch.no_grad():
        model.unembed.b_U.fill_(0)
        model.unembed.b_U[0] = 1e4  # token 0 (<pad>) always wins: every answer is wrong
    with pytest.raises(TaskDataError, match="answers none"):
        tasks.filter_correct(model, ds)
    with torch.no_grad():
        model.unembed.b_U[0] = 0
        model.unembed.b_U[answers[0]] = 1e4
    kept, acc = tasks.filter_correct(model, ds)
    expected = (answers == answers[0]).float().mean().item()
    assert acc == pytest.approx(expected) and len(kept) == int((answers == answers[0]).sum())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(op="%"), "Unknown operation"),
        (dict(n_prompts=0), "n_prompts"),
        (dict(template_ids=("sub-equation-0",)), "not for operation"),
        (dict(op="/", operand_range=(7, 7)), "No exact divisions"),
        (dict(styles=("poem",)), "Unknown template styles"),
    ],
)
def test_bad_specifications_raise_clear_errors(tok, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tasks.make_dataset(tok, **kwargs)


def test_division_with_remainder_is_an_error():
    with pytest.raises(TaskDataError, match="not an integer"):
        tasks.format_answer("/", Fraction(7), Fraction(2))
    with pytest.raises(TaskDataError, match="Division by zero"):
        tasks.format_answer("/", Fraction(7), Fraction(0))


def test_operand_merged_with_neighbour_is_an_error(tok):
    glued = Template("glued", "+", "equation", "x{A}y [+] {B} = ")
    # With the char tokenizer every character is its own token, so this is fine...
    tasks.make_row(tok, glued, Fraction(3), Fraction(4))

    class MergingTokenizer:
        """Wraps the char tokenizer but reports 'x3' as one token, as a BPE tokenizer might."""

        is_fast = True

        def __call__(self, text, **kwargs):
            enc = tok(text, **kwargs)
            offsets = list(enc["offset_mapping"])
            offsets[1] = (0, 2)
            offsets[2] = (1, 2)
            enc["offset_mapping"] = offsets
            return enc

        def decode(self, ids):
            return tok.decode(ids)

    with pytest.raises(TaskDataError, match="shares token"):
        tasks.make_row(MergingTokenizer(), glued, Fraction(3), Fraction(4))


def test_single_batch_refuses_mixed_lengths(tok):
    ds = tasks.make_dataset(tok, n_prompts=12)
    with pytest.raises(TaskDataError, match="different token lengths"):
        tasks.single_batch(ds)


def test_prompts_of_one_template_share_the_prefix_and_positions(tok):
    ds = tasks.make_dataset(tok, n_prompts=24, template_ids=("add-equation-0",), n_shots=3)
    prefixes = {r["prompt"].rsplit("\n", 1)[0] for r in ds}
    assert len(prefixes) == 1
    assert len({(tuple(r["a_pos"]), tuple(r["op_pos"]), r["end_pos"]) for r in ds}) == 1


def test_multi_token_operator_gets_a_multi_word_twin(tok):
    template = Template("multi", "*", "word_problem", "Anna has {A} bags with {B} apples [in each]. Total: ")
    row = tasks.make_row(tok, template, Fraction(3), Fraction(4))
    assert len(row["cf_tokens"]) == len(row["tokens"]) and "in each" not in row["counterfactual"]


@pytest.mark.integration
def test_gemma_keeps_at_least_sixty_percent_of_few_shot_addition(gemma):
    ds = tasks.make_dataset(gemma, op="+", n_prompts=200)
    assert len(ds) == 200 and all(len(r["tokens"]) == len(r["cf_tokens"]) for r in ds)
    kept, base_accuracy = tasks.filter_correct(gemma, ds)
    assert base_accuracy >= 0.6 and len(kept) == round(base_accuracy * 200)


@pytest.mark.parametrize("op", ["+", "*"])
def test_corrupt_all_changes_every_operator_and_nothing_else(tok, op):
    from circuits.templates import COUNTERFACTUAL_SYMBOLS, COUNTERFACTUAL_WORDS

    words = COUNTERFACTUAL_SYMBOLS + COUNTERFACTUAL_WORDS
    words += tuple(f"{w} {v}" for w in COUNTERFACTUAL_WORDS for v in COUNTERFACTUAL_WORDS if w != v)
    query = tasks.make_dataset(tok, op=op, n_prompts=12, n_shots=3, seed=2)
    every = tasks.make_dataset(tok, op=op, n_prompts=12, n_shots=3, seed=2, corrupt="all")
    assert every["prompt"] == query["prompt"] and set(every["corrupt"]) == {"all"} and set(query["corrupt"]) == {"query"}
    for row in every:
        template = tasks.template_by_id(row["template_id"])
        shots = parse_shots(template, row["prompt"].rsplit("\n", 1)[0] + "\n")
        assert len(shots) == 3 and len(row["cf_tokens"]) == len(row["tokens"])

        def written(operator_text):  # the prompt with every operator written as operator_text
            lines = [template.fill(a, b, operator_text=operator_text) + answer for a, b, answer in shots]
            return "\n".join(lines + [template.fill(row["a"], row["b"], operator_text=operator_text)])

        assert written(None) == row["prompt"]
        assert any(written(w) == row["counterfactual"] for w in words)  # every operator replaced, nothing else
        assert all(x != y for x, y in zip(row["prompt"].split("\n"), row["counterfactual"].split("\n")))
        assert sum(x != y for x, y in zip(row["tokens"], row["cf_tokens"])) >= 4  # three shots and the query


def test_corrupt_must_be_query_or_all(tok):
    with pytest.raises(TaskDataError, match="corrupt must be one of"):
        tasks.make_dataset(tok, n_prompts=2, corrupt="shots")


def test_filter_correct_names_nan_weights_instead_of_blaming_the_prompts():
    from circuits.errors import InputError

    model = tiny_model(n_layers=1)
    data = tasks.make_dataset(model, n_prompts=3, n_shots=0, seed=1)
    with torch.no_grad():
        model.blocks[0].attn.W_Q[0, 0, 0] = float("nan")
    with pytest.raises(InputError, match=r"NaN or Inf weights .*every result computed with it would be meaningless"):
        tasks.filter_correct(model, data)
