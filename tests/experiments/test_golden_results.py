"""Refactors keep the numbers: the arithmetic pipeline on a tiny saved model against its golden results.json.

Cross-cutting (the golden-results test): every stage of the pipeline, hence every package, keeps its numbers."""

import json

from tests.experiments import golden


def test_results_match_the_golden_copy(tmp_path):
    expected = json.loads(golden.RESULTS_FILE.read_text())
    results = golden.run_pipeline(tmp_path / "run")
    problems = golden.compare(expected, results)
    assert not problems, "results.json differs from tests/data/golden/addition_results.json:\n" + "\n".join(problems[:40])
    assert results["status"] == "complete" and "finetune" in results and "af1" in results


def test_the_comparison_fails_on_a_changed_number_or_a_missing_key():
    base = {"a": 1.0, "b": {"c": [1, 2.5, "x"]}, "seconds": {"data": 1.0}}
    assert golden.compare(base, base | {"new": 3}) == []  # new keys are allowed, wall times ignored
    assert golden.compare(base, base | {"seconds": {}}) == []
    assert golden.compare(base, {"a": 1.0 + 1e-3, "b": {"c": [1, 2.5, "x"]}}) == [".a: 1.001 != golden 1.0"]
    assert golden.compare(base, {"a": 1.0}) == [".b: missing"]
    assert golden.compare(base, {"a": 1.0, "b": {"c": [1, 2.5]}})[0].startswith(".b.c: expected a list of 3")
    assert golden.compare(base, {"a": 1.0, "b": {"c": [1, 2.5, "y"]}}) == [".b.c[2]: 'y' != golden 'x'"]
