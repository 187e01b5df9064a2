"""The golden run of the arithmetic pipeline: a tiny saved model, fixed flags, and the comparison rule.

``tests/data/golden/tiny_gemma/`` is a tiny random gemma-style model saved by ``circuits.save_model``
(its digit logits raised so some answers are right); ``tests/data/golden/addition_results.json`` is
what ``python -m experiments.addition`` wrote for it with :data:`FLAGS`. :func:`compare` checks that every golden key is still present with the same value (numbers
to a tolerance); new keys are allowed, so a stage may be added without touching the golden copy.

Regenerate (only when a change of numbers is intended, and say so in the commit)::

    python -m tests.experiments.golden --write
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "data" / "golden"
MODEL_DIR = GOLDEN_DIR / "tiny_gemma"
RESULTS_FILE = GOLDEN_DIR / "addition_results.json"

FLAGS = ["--n-prompts", "60", "--top-k", "2", "--knockout-prompts", "6", "--knockout-ks", "1,2",
         "--knockout-seeds", "2", "--knockout-pool", "120", "--transfer-prompts", "6", "--af1-stride", "1",
         "--af1-prompts", "30", "--batch-size", "16", "--finetune", "--finetune-steps", "2", "--device", "cpu"]

# Wall times and paths differ between runs; everything else must not.
VOLATILE_KEYS = {"seconds", "wall_seconds", "seconds_per_step", "out", "model", "static_figures"}
REL, ABS = 1e-4, 1e-6


def write_model(path: Path = MODEL_DIR) -> Path:
    """The tiny model the golden run uses (deterministic: its seed is fixed)."""
    import torch

    from circuits.loading import save_model
    from tests.tiny_models import tiny_model

    model = tiny_model(style="gemma", n_layers=2, n_ctx=1024, seed=0)
    digits = [model.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    with torch.no_grad():  # make the random model answer with digits, so some answers are right
        model.unembed.b_U[digits] += 20.0
    return save_model(model, path, overwrite=True)


def run_pipeline(out: Path) -> dict:
    """``python -m experiments.addition`` on the golden model with :data:`FLAGS`; the saved results.json."""
    from experiments import arithmetic as _arithmetic

    _arithmetic.main("+", ["--model", str(MODEL_DIR), "--out", str(out), *FLAGS])
    return json.loads((out / "results.json").read_text())


def compare(golden, new, path: str = "") -> list[str]:
    """Every difference of ``new`` from ``golden`` (keys only in ``new`` are allowed), as readable lines."""
    if isinstance(golden, dict):
        if not isinstance(new, dict):
            return [f"{path or '<top>'}: expected a dict, got {type(new).__name__}"]
        problems = []
        for key, value in golden.items():
            if key in VOLATILE_KEYS:
                continue
            if key not in new:
                problems.append(f"{path}.{key}: missing")
                continue
            problems += compare(value, new[key], f"{path}.{key}")
        return problems
    if isinstance(golden, list):
        if not isinstance(new, list) or len(new) != len(golden):
            return [f"{path}: expected a list of {len(golden)}, got {new!r:.200}"]
        return [p for i, (g, n) in enumerate(zip(golden, new)) for p in compare(g, n, f"{path}[{i}]")]
    if isinstance(golden, float) or (isinstance(golden, int) and isinstance(new, float)):
        if not isinstance(new, (int, float)) or isinstance(new, bool):
            return [f"{path}: expected a number, got {new!r}"]
        if math.isnan(golden) and math.isnan(new):
            return []
        return [] if math.isclose(golden, new, rel_tol=REL, abs_tol=ABS) else [f"{path}: {new!r} != golden {golden!r}"]
    return [] if golden == new else [f"{path}: {new!r:.200} != golden {golden!r:.200}"]


if __name__ == "__main__":
    if "--write" not in sys.argv:
        sys.exit("usage: python -m tests.experiments.golden --write   (rewrites the golden model and results)")
    write_model()
    with tempfile.TemporaryDirectory() as tmp:
        results = run_pipeline(Path(tmp) / "run")
    RESULTS_FILE.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {MODEL_DIR} and {RESULTS_FILE}")
