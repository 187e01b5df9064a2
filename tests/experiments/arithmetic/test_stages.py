"""experiments.arithmetic.stages: the settings only the loaded model can check are refused before any stage runs."""

import json

import pytest

from circuits.errors import InputError
from experiments import arithmetic as _arithmetic

FAST = ["--n-prompts", "20", "--knockout-prompts", "4", "--knockout-seeds", "1", "--transfer-prompts", "4",
        "--af1-stride", "0", "--circuit-prompts", "0", "--batch-size", "16", "--threads", "1"]


@pytest.mark.parametrize("flags, message", [
    (["--knockout-ks", "1,99", "--top-k", "2"],
     r"--knockout-ks 1,99: 99 is more heads than .*tiny has \(8 = 2 layers x 4 heads\); give counts in 1\.\.8\."),
    (["--knockout-ks", "1,2", "--top-k", "99"], r"--top-k 99 is more heads than .*tiny has \(8 = 2 layers x 4 heads\)"),
])
def test_head_counts_the_model_lacks_are_refused_before_the_work(flags, message, tiny_dir, tmp_path):
    """--knockout-ks 1,99 knocked out 1 head, dropped 99 without a word and ended complete."""
    out = tmp_path / "run"
    with pytest.raises(InputError, match=message):
        _arithmetic.main("+", ["--model", str(tiny_dir), "--out", str(out), *FAST, *flags])
    saved = json.loads((out / "results.json").read_text())
    assert saved["status"].startswith("failed: addition: InputError: --")
    assert set(saved["seconds"]) == {"load model"}  # nothing ran after the model loaded
