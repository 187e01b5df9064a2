"""experiments.transfer end to end on a tiny saved model."""

import json

from experiments import transfer


def test_transfer_compares_key_heads_across_operations(tiny_dir, tmp_path):
    out = tmp_path / "run"
    transfer.main(["--model", str(tiny_dir), "--ops", "+", "*", "--n-prompts", "40", "--knockout-prompts", "6",
                   "--top-k", "2", "--random-seeds", "1", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    assert set(results["key_heads"]) == {"addition", "multiplication"}
    assert all(len(h) == 2 for h in results["key_heads"].values())
    pair = results["overlap"][0]
    assert pair["pair"] == "addition / multiplication" and 0 <= pair["jaccard"] <= 1
    row = results["cross_knockout"]["addition"]
    assert set(row) == {"base", "random", "addition", "multiplication"}
    assert (out / "report.html").exists() and (out / "figures" / "cross_knockout.json").exists()
    assert results["key_heads_rule"]["combine"] == "per-op" and results["key_heads_rule"]["top_k"] == 2
