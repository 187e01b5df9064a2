"""Run by test_distributed.py under ``accelerate launch``: the split edge sweeps on a tiny gemma-style model.

Usage: ``python distributed_script.py OUT_DIR``. Every rank writes ``OUT_DIR/rank{r}.safetensors``
(the gathered results it holds) and ``OUT_DIR/rank{r}.json``.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from circuits.graph import GraphLayout
from circuits.process_group import end_process_group
from circuits.tasks import make_dataset
from tests.tiny_models import tiny_model
from patching.edges import distributed
from patching import SweepOptions

FRACTIONS = (0.05, 0.2, 0.5, 1.0)


def setup():
    """The model, prompts (two lengths, 7 prompts: the shards are uneven) and per-prompt wrong answers."""
    torch.set_num_threads(1)
    model = tiny_model(style="gemma", n_layers=2, seed=5)
    data = make_dataset(model, n_prompts=7, n_shots=1, template_ids=["add-equation-0", "add-question-0"], seed=2)
    alt_ids = (torch.tensor([ids[0] for ids in data["answer_token_ids"]]) + 1) % model.cfg.d_vocab
    return model, data, alt_ids


def run(out: Path) -> None:
    model, data, alt_ids = setup()
    shard = distributed.current_shard()  # set up from the launch's environment
    graph = distributed.distributed_edge_attribution(model, data, method="EAP-IG-inputs", ig_steps=3,
                                                     options=SweepOptions(metric="logit_diff"), alt_ids=alt_ids)
    nodes = distributed.distributed_edge_attribution(model, data, method="EAP", level="node")
    layout = GraphLayout.of(model)
    edges = layout.real_edge_mask.nonzero().tolist()[::3]
    effects = distributed.distributed_edge_patch(model, edges, data)
    curve = distributed.distributed_faithfulness_curve(model, graph, data, fractions=FRACTIONS, n_bootstrap=200)
    tensors = {"scores": graph.scores, "node_heads": nodes.heads, "node_mlps": nodes.mlps,
               "edge_per_prompt": effects.per_prompt, "curve_metric": curve.circuit_metric}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / f"rank{shard.rank}.safetensors"))
    info = {"world": shard.world_size, "edges": [list(e) for e in effects.edges], "curve": curve.to_dict(),
            "n_prompts": graph.meta["n_prompts"], "reference_metric": graph.meta["reference_metric"]}
    (out / f"rank{shard.rank}.json").write_text(json.dumps(info))


if __name__ == "__main__":
    run(Path(sys.argv[1]))
    end_process_group()
