"""circuits.graph_io: EAP-IG JSON files (round trip, edge order, bad files) and MIB submission folders."""

from __future__ import annotations

import json

import pytest
import torch

from circuits.errors import InputError
from circuits.graph import Graph, GraphLayout
from circuits.graph_io import (
    GraphFileError, eap_edge_order, graph_to_eap_dict, load_eap_json, save_eap_json, write_mib_submission,
    MIB_SUBMISSION_PERCENTS,
)
from circuits.graph_selection import select_top_n
from tests.tiny_models import tiny_model


def scored_graph(n_layers=3, n_heads=2, parallel=False, seed=0) -> Graph:
    layout = GraphLayout(n_layers, n_heads, parallel)
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(layout.n_forward, layout.n_backward, generator=g)
    scores = torch.where(layout.real_edge_mask, scores, torch.nan)
    return Graph(layout, scores, meta={"d_model": 16})


def test_edge_order_lists_every_edge_once():
    for parallel in (False, True):
        layout = GraphLayout(3, 2, parallel)
        order = eap_edge_order(layout)
        assert len(order) == len(set(order)) == layout.n_edges
        assert all(layout.real_edge_mask[f, b] for f, b in order)


def test_eap_json_round_trip(tmp_path):
    graph = select_top_n(scored_graph(parallel=False), 9)
    path = save_eap_json(graph, tmp_path / "g.json")
    data = json.loads(path.read_text())
    assert list(data) == ["cfg", "nodes", "edges"] and data["cfg"]["d_model"] == 16
    assert len(data["edges"]) == graph.n_edges and data["nodes"]["logits"] == {"in_graph": True}
    back = load_eap_json(path)
    assert back.layout == graph.layout
    real = graph.layout.real_edge_mask
    assert torch.equal(back.scores[real], graph.scores[real].float())
    assert torch.isnan(back.scores[~real]).all()
    assert torch.equal(back.in_graph, graph.in_graph)


def test_eap_json_needs_d_model_and_rejects_bad_files(tmp_path):
    graph = scored_graph()
    graph.meta.clear()
    with pytest.raises(InputError, match="pass d_model"):
        save_eap_json(graph, tmp_path / "x.json")
    (tmp_path / "bad.json").write_text(json.dumps({"cfg": {}, "edges": {}}))
    with pytest.raises(GraphFileError, match="lacks"):
        load_eap_json(tmp_path / "bad.json")
    (tmp_path / "worse.json").write_text(json.dumps(
        {"cfg": {"n_layers": 1, "n_heads": 1, "d_model": 4}, "nodes": {}, "edges": {"m0->a0.h0<q>": {"score": 1.0}}}))
    with pytest.raises(GraphFileError, match="not an edge"):
        load_eap_json(tmp_path / "worse.json")


def test_mib_submission_folders(tmp_path):
    graph = scored_graph(n_layers=4, n_heads=4)
    folder = write_mib_submission(graph, tmp_path, "arithmetic-addition", "gemma3")
    assert folder.name == "arithmetic-addition_gemma3" and (folder / "importances.json").is_file()
    folder = write_mib_submission(graph, tmp_path / "c", "arithmetic-addition", "gemma3", mode="circuits")
    files = sorted(folder.glob("circuit_*.json"))
    assert len(files) == len(MIB_SUBMISSION_PERCENTS)
    for percent in MIB_SUBMISSION_PERCENTS:
        circuit = load_eap_json(folder / f"circuit_{percent:g}.json")
        assert circuit.n_edges_in_graph <= percent / 100 * graph.n_edges
    with pytest.raises(InputError, match="contains '_'"):
        write_mib_submission(graph, tmp_path, "arithmetic_addition", "gemma3")


def _eap_file(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_malformed_and_foreign_files_are_graph_file_errors_naming_the_file(tmp_path):
    """Each of these was a raw AttributeError, ValueError, RuntimeError, IsADirectoryError or UnicodeDecodeError."""
    good = json.loads(json.dumps(graph_to_eap_dict(scored_graph())))
    folder = write_mib_submission(scored_graph(), tmp_path, "arithmetic-addition", "tiny", mode="circuits")
    (tmp_path / "weights.json").write_bytes(b"\x00\x01\xffPK\x03\x04 binary")
    cases = [
        (folder, r"arithmetic-addition_tiny is a folder, not an EAP-IG graph file \(a MIB submission folder .*\): "
                 r"pass one of its files, e.g. .*circuit_0\.1\.json"),
        (tmp_path / "weights.json", r"weights\.json is not a text file \(byte \d+ is not UTF-8\); expected an EAP-IG graph"),
        (_eap_file(tmp_path, "list.json", [1, 2]), r"list\.json holds a list; expected an EAP-IG graph object"),
        (_eap_file(tmp_path, "deep.json", "[" * 100_000 + "]" * 100_000), r"deep\.json nests its JSON deeper"),
        (_eap_file(tmp_path, "nodes.json", good | {"nodes": ["input"]}), r"nodes\.json: 'nodes' is a list"),
        (_eap_file(tmp_path, "sizes.json", good | {"cfg": {**good["cfg"], "n_layers": "3"}}),
         r"sizes\.json: cfg\.n_layers is '3' \(a string\); an EAP-IG graph file gives n_layers as a whole number"),
        (_eap_file(tmp_path, "negative.json", good | {"cfg": {**good["cfg"], "n_heads": -2}}), r"cfg\.n_heads is -2"),
        (_eap_file(tmp_path, "huge.json", good | {"cfg": {**good["cfg"], "n_layers": 10**6}}),
         r"huge\.json: cfg declares 1000000 layers .*no model this toolkit can hold"),
        (_eap_file(tmp_path, "d_model.json", good | {"cfg": {**good["cfg"], "d_model": "wide"}}), r"cfg\.d_model is 'wide'"),
        (_eap_file(tmp_path, "edge.json", good | {"edges": {"input->logits": 0.5}}),
         r"edge\.json: edge 'input->logits' is a number; an edge is an object"),
        (_eap_file(tmp_path, "score.json", good | {"edges": {"input->logits": {"score": "high"}}}),
         r"score\.json: edge 'input->logits' has score 'high' \(a string\); a score is a number"),
        (_eap_file(tmp_path, "flag.json", good | {"edges": {"input->logits": {"score": 1.0, "in_graph": "false"}}}),
         r"flag\.json: edge 'input->logits': in_graph is 'false' \(a string\); it must be true or false"),
        (_eap_file(tmp_path, "node_flag.json", good | {"nodes": {**good["nodes"], "input": {"in_graph": 1}}}),
         r"node 'input': in_graph is 1"),
    ]
    for path, message in cases:
        with pytest.raises(GraphFileError, match=message):
            load_eap_json(path)


def test_a_graph_of_another_model_size_is_refused(tmp_path):
    model = tiny_model(style="gpt2")  # 2 layers, 4 heads, d_model 32
    graph = scored_graph(n_layers=2, n_heads=4)
    path = save_eap_json(graph, tmp_path / "fits.json", d_model=32)
    assert load_eap_json(path, model=model).layout == GraphLayout.of(model)
    for name, layers, heads, d_model, message in [
        ("wider.json", 2, 4, 64, r"records d_model 64 \(the model has 32\)"),
        ("deeper.json", 3, 4, 32, r"records n_layers 3 \(the model has 2\)"),
        ("heads.json", 2, 2, 32, r"records n_heads 2 \(the model has 4\)"),
    ]:
        path = save_eap_json(scored_graph(n_layers=layers, n_heads=heads), tmp_path / name, d_model=d_model)
        with pytest.raises(GraphFileError, match=rf"{name.replace('.', '[.]')} is for another model: it {message}"):
            load_eap_json(path, model=model)


def test_infinite_scores_load_with_a_warning(tmp_path):
    data = graph_to_eap_dict(scored_graph())
    for edge in data["edges"].values():
        edge["score"] = float("inf")
    path = _eap_file(tmp_path, "inf.json", json.dumps(data))  # json writes Infinity, and reads it back
    with pytest.warns(UserWarning, match=r"inf\.json: all of its \d+ edge scores are infinite"):
        graph = load_eap_json(path)
    assert torch.isinf(graph.scores[graph.layout.real_edge_mask]).all()


def test_mib_names_cannot_leave_the_submission_folder(tmp_path):
    graph = scored_graph()
    (tmp_path / "out").mkdir()
    for model_name in ("../escaped", "a/b", "..", "", ".hidden", "x\\y"):
        with pytest.raises(InputError, match=r"model_name .* cannot be part of a MIB folder name <task>_<model>"):
            write_mib_submission(graph, tmp_path / "out", "arithmetic-addition", model_name)
    with pytest.raises(InputError, match=r"task '\.\./up' cannot be part of a MIB folder name"):
        write_mib_submission(graph, tmp_path / "out", "../up", "gemma3")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["out"]  # nothing written anywhere


def test_graph_files_and_mib_folders_replace_existing_files_only_when_asked(tmp_path):
    from circuits.atomic_files import DestinationExistsError

    graph = scored_graph()
    mine = tmp_path / "user_graph.json"
    mine.write_text("my annotations")
    with pytest.raises(DestinationExistsError, match="user_graph.json already exists; pass overwrite=True"):
        save_eap_json(graph, mine)
    assert mine.read_text() == "my annotations"
    save_eap_json(graph, mine, overwrite=True)
    assert load_eap_json(mine).n_edges == graph.n_edges
    folder = tmp_path / "out" / "arithmetic-addition_gemma3"
    folder.mkdir(parents=True)
    (folder / "importances.json").write_text("my own submission")
    (folder / "circuit_1.json").write_text("another")
    for mode in ("importances", "circuits"):
        with pytest.raises(DestinationExistsError, match="already exists"):
            write_mib_submission(graph, tmp_path / "out", "arithmetic-addition", "gemma3", mode=mode)
    assert (folder / "importances.json").read_text() == "my own submission"
    assert sorted(p.name for p in folder.iterdir()) == ["circuit_1.json", "importances.json"]  # nothing written
    write_mib_submission(graph, tmp_path / "out", "arithmetic-addition", "gemma3", overwrite=True)
    assert load_eap_json(folder / "importances.json").n_edges == graph.n_edges


def test_missing_scores_are_written_as_json_null_and_read_back_as_nan(tmp_path):
    graph = scored_graph()
    f, b = eap_edge_order(graph.layout)[3]
    graph.scores[f, b] = torch.nan
    path = save_eap_json(graph, tmp_path / "g.json")
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    with pytest.warns(UserWarning, match="gives no score for 1 of"):
        back = load_eap_json(path)
    assert torch.isnan(back.scores[f, b]) and torch.isfinite(back.scores[graph.layout.real_edge_mask]).sum() == \
        graph.layout.n_edges - 1


def test_infinite_scores_are_refused_when_saving(tmp_path):
    graph = scored_graph()
    f, b = eap_edge_order(graph.layout)[0]
    graph.scores[f, b] = -torch.inf
    with pytest.raises(InputError, match="edge scores are infinite .*clip its scores to finite values"):
        save_eap_json(graph, tmp_path / "g.json")
    assert not (tmp_path / "g.json").exists()


def test_a_score_beyond_float32_is_a_graph_file_error(tmp_path):
    data = graph_to_eap_dict(scored_graph())
    name = next(iter(data["edges"]))
    data["edges"][name]["score"] = 1.7976931348623157e308
    (tmp_path / "big.json").write_text(json.dumps(data))
    with pytest.raises(GraphFileError, match=r"beyond what a float32 score holds.*rescale the scores"):
        load_eap_json(tmp_path / "big.json")


@pytest.mark.parametrize("in_graph", [False, True])
def test_a_file_with_no_score_at_all_warns(tmp_path, in_graph):
    data = graph_to_eap_dict(scored_graph())
    for edge in data["edges"].values():
        edge["score"], edge["in_graph"] = None, in_graph
    (tmp_path / "empty.json").write_text(json.dumps(data))
    n = len(data["edges"])
    with pytest.warns(UserWarning, match=rf"gives no score for any of its {n} edges: it ranks nothing .*a circuit of "
                                         rf"{n if in_graph else 0} in-graph edges"):
        load_eap_json(tmp_path / "empty.json")


def test_a_parallel_flag_that_disagrees_with_the_edges_names_the_flag(tmp_path):
    """It used to blame the edge ('its sender does not come before its receiver') and never name the flag."""
    data = graph_to_eap_dict(scored_graph(parallel=False), d_model=16)
    data["cfg"]["parallel_attn_mlp"] = True
    path = _eap_file(tmp_path, "parallel.json", data)
    with pytest.raises(GraphFileError, match=r"parallel\.json: cfg\.parallel_attn_mlp is true \(parallel blocks.*"
                                             r"but edge 'a0\.h0->m0' exists only when it is false: the flag disagrees"):
        load_eap_json(path)
    data = graph_to_eap_dict(scored_graph(parallel=True), d_model=16)
    data["cfg"]["parallel_attn_mlp"] = False  # every edge fits, but the within-layer head -> MLP edges are absent
    with pytest.warns(UserWarning, match=r"exactly the \d+ edges from a layer's heads to its own MLP.*"
                                         r"cfg\.parallel_attn_mlp \(false\) is probably wrong"):
        load_eap_json(_eap_file(tmp_path, "sequential.json", data))


def test_a_model_name_with_an_underscore_is_refused_like_the_task(tmp_path):
    """It used to write arith-add_gemma_3, which MIB splits into task 'arith-add' and model 'gemma'."""
    with pytest.raises(InputError, match=r"model_name 'gemma_3' contains '_', which MIB uses to split task from model"):
        write_mib_submission(scored_graph(), tmp_path, "arith-add", "gemma_3")
    assert list(tmp_path.iterdir()) == []
