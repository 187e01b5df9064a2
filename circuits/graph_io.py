"""Circuits on disk: hannamw/EAP-IG's ``Graph`` JSON (both directions) and MIB circuit-track submissions.

**EAP-IG JSON** (``eap.graph.Graph.to_json`` / ``from_json``)::

    {"cfg":   {"n_layers": L, "n_heads": H, "parallel_attn_mlp": false, "d_model": D},
     "nodes": {"input": {"in_graph": true}, "a0.h0": {"in_graph": false}, ..., "logits": {"in_graph": true}},
     "edges": {"input->a0.h0<q>": {"score": 0.12, "in_graph": true}, ...}}

Nodes and edges are written in the order EAP-IG creates them, so a file written here
is the file EAP-IG writes for the same scores. Node membership is derived from the
edges (:func:`circuits.graph_selection.nodes_in_graph`, what EAP-IG's ``prune`` leaves);
EAP-IG's own evaluation prunes before it runs, so node flags never change a result.
Neuron-level files (``"neurons"`` in a node) are refused: this toolkit's graphs are
edge graphs.

**MIB submissions** (hannamw/MIB-circuit-track): one folder per task and model,
``<task>_<model>`` (e.g. ``arithmetic-addition_gemma3``), holding either one
``importances.json`` with every edge's score, or one binary circuit per size
(at most 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50% of the edges). Both files are the
EAP-IG JSON above; :func:`write_mib_submission` writes either form.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Optional

import torch

from circuits.errors import InputError, ToolkitError
from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import nodes_in_graph, select_fraction
from circuits.atomic_files import write_text_atomic

__all__ = ["GraphFileError", "eap_edge_order", "graph_to_eap_dict", "graph_from_eap_dict", "save_eap_json",
           "load_eap_json", "write_mib_submission", "MIB_SUBMISSION_PERCENTS"]

#: The circuit sizes (percent of edges) MIB asks for when a submission gives binary circuits.
MIB_SUBMISSION_PERCENTS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50)


class GraphFileError(ToolkitError, ValueError):
    """A circuit file is not in EAP-IG's Graph JSON layout, or does not fit the graph."""


def eap_edge_order(layout: GraphLayout) -> list[tuple[int, int]]:
    """(forward, backward) indices of every edge in the order EAP-IG's ``Graph.from_model`` adds them."""
    order: list[tuple[int, int]] = []
    stream = [0]  # senders already written into the residual stream
    for layer in range(layout.n_layers):
        heads = [layout.head_forward(layer, h) for h in range(layout.n_heads)]
        mlp_b = layout.mlp_backward(layer)
        for f in stream:
            order += [(f, layout.head_backward(layer, h, x)) for h in range(layout.n_heads) for x in "qkv"]
            if layout.parallel_attn_mlp:
                order.append((f, mlp_b))
        stream += heads
        if not layout.parallel_attn_mlp:
            order += [(f, mlp_b) for f in stream]
        stream.append(layout.mlp_forward(layer))
    order += [(f, layout.logits_backward) for f in stream]
    return order


def graph_to_eap_dict(graph: Graph, d_model: Optional[int] = None) -> dict:
    """The EAP-IG JSON object of ``graph`` (``d_model`` from the argument or ``graph.meta['d_model']``)."""
    d_model = d_model if d_model is not None else graph.meta.get("d_model")
    if d_model is None:
        raise InputError("EAP-IG's JSON records d_model, and this graph does not know it: pass d_model=model.cfg.d_model.")
    layout = graph.layout
    scores = graph.scores.detach().float().cpu()
    in_graph = (graph.in_graph & layout.real_edge_mask).cpu()
    nodes = nodes_in_graph(graph).tolist()
    node_dict = {name: {"in_graph": bool(flag)} for name, flag in zip(layout.forward_names, nodes)}
    node_dict["logits"] = {"in_graph": True}
    edges = {}
    for f, b in eap_edge_order(layout):
        score = float(scores[f, b])
        edges[layout.edge_name(f, b)] = {"score": score, "in_graph": bool(in_graph[f, b])}
    cfg = {"n_layers": layout.n_layers, "n_heads": layout.n_heads, "parallel_attn_mlp": layout.parallel_attn_mlp,
           "d_model": int(d_model)}
    return {"cfg": cfg, "nodes": node_dict, "edges": edges}


def graph_from_eap_dict(data: dict, source: str = "the circuit") -> Graph:
    """A :class:`Graph` from an EAP-IG JSON object (see the module docstring)."""
    missing = [k for k in ("cfg", "nodes", "edges") if k not in data]
    if missing:
        raise GraphFileError(f"{source} lacks {missing}: an EAP-IG graph JSON has 'cfg', 'nodes' and 'edges'.")
    cfg = data["cfg"]
    try:
        layout = GraphLayout(int(cfg["n_layers"]), int(cfg["n_heads"]), bool(cfg.get("parallel_attn_mlp", False)))
    except (KeyError, TypeError, ValueError) as err:
        raise GraphFileError(f"{source}: cfg must give integers n_layers and n_heads ({err}).") from None
    if any("neurons" in node for node in data["nodes"].values()):
        raise GraphFileError(f"{source} is a neuron-level circuit; only edge-level circuits can be loaded.")
    scores = torch.full((layout.n_forward, layout.n_backward), torch.nan)
    in_graph = torch.zeros(layout.n_forward, layout.n_backward, dtype=torch.bool)
    for name, info in data["edges"].items():
        try:
            f, b = layout.edge_index(name)
        except InputError as err:
            raise GraphFileError(f"{source}: {err}") from None
        score = info.get("score")
        scores[f, b] = math.nan if score is None else float(score)
        in_graph[f, b] = bool(info.get("in_graph", False))
    n_missing = int((torch.isnan(scores) & layout.real_edge_mask).sum())
    if n_missing and not torch.isnan(scores[layout.real_edge_mask]).all():
        warnings.warn(f"{source} gives no score for {n_missing} of {layout.n_edges} edges; they are NaN.", stacklevel=2)
    meta = {"d_model": int(cfg["d_model"])} if "d_model" in cfg else {}
    graph = Graph(layout, scores, in_graph, meta)
    stated = [bool(data["nodes"].get(name, {}).get("in_graph", False)) for name in layout.forward_names]
    if stated != nodes_in_graph(graph).tolist():
        warnings.warn(f"{source}: its node flags differ from those its edges imply; nodes follow the edges here "
                      f"(EAP-IG prunes to the same before it evaluates).", stacklevel=2)
    return graph


def save_eap_json(graph: Graph, path: str | Path, d_model: Optional[int] = None) -> Path:
    """Write ``graph`` as EAP-IG's ``Graph.to_json`` would (atomically); ``eap.graph.Graph.from_json`` reads it."""
    return write_text_atomic(path, json.dumps(graph_to_eap_dict(graph, d_model)))


def load_eap_json(path: str | Path) -> Graph:
    """Read a graph written by EAP-IG's ``Graph.to_json`` (or :func:`save_eap_json`)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise GraphFileError(f"{path} is not valid JSON ({err}); expected an EAP-IG graph file.") from None
    if not isinstance(data, dict):
        raise GraphFileError(f"{path} holds a JSON {type(data).__name__}; expected an EAP-IG graph object.")
    return graph_from_eap_dict(data, source=str(path))


def write_mib_submission(graph: Graph, out_dir: str | Path, task: str, model_name: str, *,
                         mode: str = "importances", d_model: Optional[int] = None) -> Path:
    """Write ``graph`` as a MIB circuit-track submission folder ``out_dir/<task>_<model_name>``.

    ``mode="importances"``: one ``importances.json`` with every edge's score (MIB picks the sizes).
    ``mode="circuits"``: one pruned top-n circuit per size in :data:`MIB_SUBMISSION_PERCENTS`,
    ``circuit_<percent>.json``, each with at most that percentage of the edges.
    Returns the folder.
    """
    if "_" in task:
        raise InputError(f"task {task!r} contains '_', which MIB uses to split task from model: "
                         f"write it with '-' (e.g. 'arithmetic-addition').")
    folder = Path(out_dir) / f"{task}_{model_name}"
    if mode == "importances":
        save_eap_json(graph, folder / "importances.json", d_model)
    elif mode == "circuits":
        for percent in MIB_SUBMISSION_PERCENTS:
            circuit = select_fraction(graph, percent / 100)
            save_eap_json(circuit, folder / f"circuit_{percent:g}.json", d_model)
    else:
        raise InputError(f"mode must be 'importances' or 'circuits', got {mode!r}.")
    return folder
