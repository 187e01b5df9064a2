"""Edge sweeps split over processes (patching.edges.distributed): two CPU processes under accelerate launch give the
one-process results; prompt shards cover the prompts exactly once; a shard without a process group is refused.

The two-process run (tests.launch) takes about 20-40 s.
"""

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from circuits.errors import InputError
from circuits.graph import GraphLayout
from circuits.tasks import iter_batches
from patching.edges import distributed
from patching.edges.attribute import edge_attribution
from patching.edges.patch import edge_patch
from patching.edges.curves import faithfulness_curve
from patching import SweepOptions
from tests.launch import launch_two_processes

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import distributed_script as script  # noqa: E402

sys.path.remove(str(HERE))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the two-process launch is a CPU (gloo) check")
def test_two_processes_give_the_one_process_results(tmp_path):
    launch_two_processes(HERE / "distributed_script.py", str(tmp_path), port=29733, timeout=240)

    model, data, alt_ids = script.setup()
    graph = edge_attribution(model, data, method="EAP-IG-inputs", ig_steps=3,
                             options=SweepOptions(metric="logit_diff", progress=False), alt_ids=alt_ids)
    nodes = edge_attribution(model, data, method="EAP", level="node", options=SweepOptions(progress=False))
    layout = GraphLayout.of(model)
    edges = layout.real_edge_mask.nonzero().tolist()[::3]
    effects = edge_patch(model, edges, data, options=SweepOptions(progress=False))
    curve = faithfulness_curve(model, graph, data, fractions=script.FRACTIONS, n_bootstrap=200,
                               options=SweepOptions(progress=False))
    scale = float(torch.nan_to_num(graph.scores).abs().max())
    for rank in (0, 1):  # every rank holds the gathered results
        info = json.loads((tmp_path / f"rank{rank}.json").read_text())
        got = load_file(str(tmp_path / f"rank{rank}.safetensors"))
        assert info["world"] == 2 and info["n_prompts"] == len(data)
        assert info["reference_metric"] == pytest.approx(graph.meta["reference_metric"], rel=1e-5)
        # the split sums prompts in another order: equal to float tolerance
        torch.testing.assert_close(got["scores"], graph.scores, rtol=1e-4, atol=1e-5 * scale, equal_nan=True)
        torch.testing.assert_close(got["node_heads"], nodes.heads, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(got["node_mlps"], nodes.mlps, rtol=1e-4, atol=1e-6)
        assert [tuple(e) for e in info["edges"]] == effects.edges
        torch.testing.assert_close(got["edge_per_prompt"], effects.per_prompt, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got["curve_metric"], curve.circuit_metric, rtol=1e-4, atol=1e-5)
        for mine, plain in zip(info["curve"]["faithfulness"], curve.faithfulness):
            assert mine["value"] == pytest.approx(plain.value, rel=1e-4, abs=1e-5)
        assert info["curve"]["cpr"]["value"] == pytest.approx(curve.cpr.value, rel=1e-4, abs=1e-6)
        assert info["curve"]["cmd"]["value"] == pytest.approx(curve.cmd.value, rel=1e-4, abs=1e-6)


def test_prompt_shards_cover_every_prompt_once():
    model, data, alt_ids = script.setup()
    parts = [distributed.shard_prompts(distributed.Shard(r, 3), data, None, None, alt_ids) for r in range(3)]
    assert [len(p[0]) for p in parts] == [2, 2, 3]
    assert sum((list(p[0]["prompt"]) for p in parts), []) == list(data["prompt"])
    assert torch.equal(torch.cat([p[3] for p in parts]), alt_ids)
    batch = next(iter_batches(data, batch_size=len(data)))
    tokens = [distributed.shard_prompts(distributed.Shard(r, 2), batch.tokens, batch.cf_tokens, batch.answer_ids, 7)
              for r in range(2)]
    assert torch.equal(torch.cat([t[0] for t in tokens]), batch.tokens)
    assert torch.equal(torch.cat([t[1] for t in tokens]), batch.cf_tokens)
    assert torch.equal(torch.cat([t[2] for t in tokens]), batch.answer_ids) and tokens[1][3] == 7
    halves = [distributed.shard_prompts(distributed.Shard(r, 2), batch) for r in range(2)]
    assert torch.equal(torch.cat([h[0].tokens for h in halves]), batch.tokens)
    assert sum((h[0].indices for h in halves), []) == batch.indices


def test_one_process_is_the_plain_call_and_a_missing_group_is_refused():
    model, data, _ = script.setup()
    plain = edge_attribution(model, data, method="EAP", options=SweepOptions(progress=False))
    split = distributed.distributed_edge_attribution(model, data, method="EAP", shard=distributed.Shard(0, 1))
    assert torch.equal(torch.nan_to_num(split.scores), torch.nan_to_num(plain.scores))
    with pytest.raises(InputError, match="initialised torch.distributed group"):
        distributed.distributed_edge_patch(model, None, data, shard=distributed.Shard(1, 2))
    with pytest.raises(InputError, match="rank < world_size"):
        distributed.Shard(2, 2)
