"""patching.all_for_one.template_prompts: the fit/eval split is disjoint and stratified by template."""

from tests.tiny_models import tiny_model
from patching.all_for_one.template_prompts import AUTHORS_TEMPLATES, make_template_dataset, split_fit_eval
from tests.patching.all_for_one.af1_data import EQ


def test_split_is_disjoint_and_stratified():
    model = tiny_model()
    data = make_template_dataset(model, [EQ, AUTHORS_TEMPLATES[1]], n_per_template=30)
    fit, ev = split_fit_eval(data, 0.5, seed=1)
    assert not set(fit["prompt"]) & set(ev["prompt"])
    assert len(fit) + len(ev) == len(data)
    assert set(fit["template_id"]) == set(ev["template_id"]) == {"t-eq", "af1-verbal"}
