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

**Reading is validated.** :func:`load_eap_json` (and :func:`graph_from_eap_dict`, which it uses) refuses
anything that is not such a graph with a :class:`GraphFileError` that names the file: a folder (a MIB
submission folder: pass one of its files), a binary file, JSON that is not an object or nests too deep,
``cfg``/``nodes``/``edges`` of the wrong kind, sizes that are not whole numbers, an ``in_graph`` that is
not ``true``/``false`` (the string ``"false"`` would count as in the graph), a score that is not a
number, an edge the graph cannot have. Given ``model=``, the file must also be for that model's size
(``n_layers``, ``n_heads``, ``parallel_attn_mlp``, ``d_model``; :func:`check_graph_fits`). Infinite scores
load with a warning (they rank first in any selection).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Optional

import torch

from circuits.errors import InputError, ToolkitError
from circuits.file_reads import read_json
from circuits.graph import Graph, GraphLayout
from circuits.graph_selection import nodes_in_graph, select_fraction
from circuits.atomic_files import refuse_existing, write_text_atomic

__all__ = ["GraphFileError", "eap_edge_order", "graph_to_eap_dict", "graph_from_eap_dict", "save_eap_json",
           "load_eap_json", "check_graph_fits", "write_mib_submission", "MIB_SUBMISSION_PERCENTS"]

#: The largest graph a file may declare (n_forward * n_backward entries of its dense score matrix, ~1 GB).
MAX_GRAPH_ENTRIES = 2**28

#: The largest magnitude a score can have: graphs hold float32 scores.
FLOAT32_MAX = float(torch.finfo(torch.float32).max)

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
    real = scores[layout.real_edge_mask]
    if torch.isinf(real).any():
        f, b = (torch.isinf(scores) & layout.real_edge_mask).nonzero()[0].tolist()
        raise InputError(f"{int(torch.isinf(real).sum())} edge scores are infinite (e.g. {layout.edge_name(f, b)}: "
                         f"{float(scores[f, b])}); JSON has no infinity and any ranking among them is arbitrary: "
                         "rescore the graph, or clip its scores to finite values.")
    edges = {}
    for f, b in eap_edge_order(layout):
        score = float(scores[f, b])  # no score (NaN) is JSON null, as EAP-IG's from_json reads it
        edges[layout.edge_name(f, b)] = {"score": None if math.isnan(score) else score,
                                         "in_graph": bool(in_graph[f, b])}
    cfg = {"n_layers": layout.n_layers, "n_heads": layout.n_heads, "parallel_attn_mlp": layout.parallel_attn_mlp,
           "d_model": int(d_model)}
    return {"cfg": cfg, "nodes": node_dict, "edges": edges}


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _whole(cfg: dict, key: str, source: str, required: bool = True) -> Optional[int]:
    """``cfg[key]`` as an integer >= 1 (JSON's 4, not 4.0, "4" or true)."""
    if key not in cfg and not required:
        return None
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GraphFileError(f"{source}: cfg.{key} is {value!r} ({_kind(value)}); an EAP-IG graph file gives "
                             f"{key} as a whole number >= 1.")
    return value


def _flag(value: Any, where: str, source: str) -> bool:
    """A JSON ``true``/``false``; the string "false" (truthy in Python) or 0/1 are refused."""
    if not isinstance(value, bool):
        raise GraphFileError(f"{source}: {where} is {value!r} ({_kind(value)}); it must be true or false "
                             "(JSON booleans, unquoted).")
    return value


def _layout_of(cfg: dict, source: str) -> GraphLayout:
    n_layers, n_heads = _whole(cfg, "n_layers", source), _whole(cfg, "n_heads", source)
    parallel = _flag(cfg.get("parallel_attn_mlp", False), "cfg.parallel_attn_mlp", source)
    layout = GraphLayout(n_layers, n_heads, parallel)
    if layout.n_forward * layout.n_backward > MAX_GRAPH_ENTRIES:
        raise GraphFileError(f"{source}: cfg declares {n_layers} layers of {n_heads} heads, a graph of "
                             f"{layout.n_forward} x {layout.n_backward} entries (more than {MAX_GRAPH_ENTRIES}); "
                             "that is no model this toolkit can hold: the file is damaged or not a graph file.")
    return layout


def _flag_blamed(layout: GraphLayout, edge: str) -> Optional[str]:
    """Why ``edge``, not an edge of ``layout``, is one of the other block layout: ``cfg.parallel_attn_mlp`` is wrong."""
    other = GraphLayout(layout.n_layers, layout.n_heads, not layout.parallel_attn_mlp)
    try:
        other.edge_index(edge)
    except InputError:
        return None
    meaning = ("parallel blocks: attention and MLP read the same residual" if layout.parallel_attn_mlp
               else "sequential blocks: each MLP reads its own layer's attention")
    return (f"cfg.parallel_attn_mlp is {str(layout.parallel_attn_mlp).lower()} ({meaning}), but edge {edge!r} exists "
            f"only when it is {str(other.parallel_attn_mlp).lower()}: the flag disagrees with the edges. Set "
            "cfg.parallel_attn_mlp to the block layout of the model the graph was scored on.")


def _parallel_mask(layout: GraphLayout) -> torch.Tensor:
    return GraphLayout(layout.n_layers, layout.n_heads, True).real_edge_mask


def check_graph_fits(graph: Graph, model, source: str = "the graph") -> None:
    """Raise :class:`GraphFileError` unless ``graph`` is the edge graph of ``model``'s size.

    Compares the layers, heads and block layout (``parallel_attn_mlp``) and, when the graph records it
    (EAP-IG files do), ``d_model``: a graph of another model would otherwise be read with the wrong
    components or evaluated on a model it was never scored on.
    """
    cfg = getattr(model, "cfg", model)
    want = GraphLayout.of(cfg)
    differ = [f"{name} {got} (the model has {have})" for name, got, have in (
        ("n_layers", graph.layout.n_layers, want.n_layers), ("n_heads", graph.layout.n_heads, want.n_heads),
        ("parallel_attn_mlp", graph.layout.parallel_attn_mlp, want.parallel_attn_mlp),
        ("d_model", graph.meta.get("d_model"), cfg.d_model)) if got is not None and got != have]
    if differ:
        raise GraphFileError(f"{source} is for another model: it records {', '.join(differ)}. Use the graph "
                             "scored on this model (or load this model's size).")


def graph_from_eap_dict(data: Any, source: str = "the circuit", *, model=None) -> Graph:
    """A :class:`Graph` from an EAP-IG JSON object (see the module docstring); anything else is a GraphFileError.

    ``model`` (optional): the model the graph must fit (:func:`check_graph_fits`).
    """
    if not isinstance(data, dict):
        raise GraphFileError(f"{source} holds {_kind(data)}; expected an EAP-IG graph object with 'cfg', 'nodes' "
                             "and 'edges'.")
    missing = [k for k in ("cfg", "nodes", "edges") if k not in data]
    if missing:
        raise GraphFileError(f"{source} lacks {missing}: an EAP-IG graph JSON has 'cfg', 'nodes' and 'edges'.")
    for key in ("cfg", "nodes", "edges"):
        if not isinstance(data[key], dict):
            raise GraphFileError(f"{source}: {key!r} is {_kind(data[key])}; an EAP-IG graph JSON maps each "
                                 f"of 'cfg', 'nodes' and 'edges' to an object.")
    cfg, nodes, edges = data["cfg"], data["nodes"], data["edges"]
    layout = _layout_of(cfg, source)
    d_model = _whole(cfg, "d_model", source, required=False)
    for name, node in nodes.items():
        if not isinstance(node, dict):
            raise GraphFileError(f"{source}: node {name!r} is {_kind(node)}; a node is an object such as "
                                 '{"in_graph": true}.')
        if "neurons" in node:
            raise GraphFileError(f"{source} is a neuron-level circuit; only edge-level circuits can be loaded.")
        if "in_graph" in node:
            _flag(node["in_graph"], f"node {name!r}: in_graph", source)
    scores = torch.full((layout.n_forward, layout.n_backward), torch.nan)
    in_graph = torch.zeros(layout.n_forward, layout.n_backward, dtype=torch.bool)
    for name, info in edges.items():
        try:
            f, b = layout.edge_index(name)
        except InputError as err:
            raise GraphFileError(f"{source}: {_flag_blamed(layout, name) or err}") from None
        if not isinstance(info, dict):
            raise GraphFileError(f"{source}: edge {name!r} is {_kind(info)}; an edge is an object such as "
                                 '{"score": 0.1, "in_graph": true}.')
        score = info.get("score")
        if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))):
            raise GraphFileError(f"{source}: edge {name!r} has score {score!r} ({_kind(score)}); a score is a "
                                 "number (or null for none).")
        if score is not None and math.isfinite(score) and abs(score) > FLOAT32_MAX:
            raise GraphFileError(f"{source}: edge {name!r} has score {score!r}, beyond what a float32 score holds "
                                 f"(±{FLOAT32_MAX:.4g}); rescale the scores (only their order and ratios matter).")
        scores[f, b] = math.nan if score is None else float(score)
        in_graph[f, b] = _flag(info.get("in_graph", False), f"edge {name!r}: in_graph", source)
    real = scores[layout.real_edge_mask]
    n_missing = int(torch.isnan(real).sum())
    if n_missing == layout.n_edges:  # a binary circuit without scores is still a circuit, but ranks nothing
        warnings.warn(f"{source} gives no score for any of its {layout.n_edges} edges: it ranks nothing (a "
                      f"faithfulness curve refuses it), and names a circuit of {int(in_graph.sum())} in-graph "
                      "edges. Check that it is the file you meant.", stacklevel=2)
    elif n_missing and not layout.parallel_attn_mlp and torch.equal(
            torch.isnan(scores) & layout.real_edge_mask, layout.real_edge_mask & ~_parallel_mask(layout)):
        warnings.warn(f"{source} gives no score for exactly the {n_missing} edges from a layer's heads to its own "
                      "MLP, the edges parallel blocks lack: its cfg.parallel_attn_mlp (false) is probably wrong. Set "
                      "it to the block layout of the model the graph was scored on.", stacklevel=2)
    elif n_missing:
        warnings.warn(f"{source} gives no score for {n_missing} of {layout.n_edges} edges; they are NaN.", stacklevel=2)
    n_inf = int(torch.isinf(real).sum())
    if n_inf:
        which = "all" if n_inf == layout.n_edges else str(n_inf)
        warnings.warn(f"{source}: {which} of its {layout.n_edges} edge scores are infinite; they rank before every "
                      "finite score, so a circuit chosen among them is arbitrary. Rescore the graph.", stacklevel=2)
    meta = {"d_model": d_model} if d_model is not None else {}
    graph = Graph(layout, scores, in_graph, meta)
    if model is not None:
        check_graph_fits(graph, model, source)
    stated = [nodes.get(name, {}).get("in_graph", False) for name in layout.forward_names]
    if stated != nodes_in_graph(graph).tolist():
        warnings.warn(f"{source}: its node flags differ from those its edges imply; nodes follow the edges here "
                      f"(EAP-IG prunes to the same before it evaluates).", stacklevel=2)
    return graph


def save_eap_json(graph: Graph, path: str | Path, d_model: Optional[int] = None, *, overwrite: bool = False) -> Path:
    """Write ``graph`` as EAP-IG's ``Graph.to_json`` would (atomically); ``eap.graph.Graph.from_json`` reads it.

    An existing file is replaced only with ``overwrite=True``. Edges without a score (NaN) are written
    with ``"score": null``; infinite scores are refused (strict JSON has no infinity).
    """
    data = graph_to_eap_dict(graph, d_model)
    return write_text_atomic(refuse_existing(path, overwrite), json.dumps(data, allow_nan=False))


def load_eap_json(path: str | Path, *, model=None) -> Graph:
    """Read a graph written by EAP-IG's ``Graph.to_json`` (or :func:`save_eap_json`), validated.

    Every problem is a :class:`GraphFileError` naming ``path`` (see the module docstring). ``model``
    (optional): refuse a file written for another model size (:func:`check_graph_fits`).
    """
    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.json"))
        example = f", e.g. {path / inside[0]}" if inside else ""
        raise GraphFileError(f"{path} is a folder, not an EAP-IG graph file (a MIB submission folder holds one file "
                             f"per circuit, or importances.json): pass one of its files{example}.")
    data = read_json(path, "an EAP-IG graph file", error=GraphFileError)
    return graph_from_eap_dict(data, source=str(path), model=model)


def write_mib_submission(graph: Graph, out_dir: str | Path, task: str, model_name: str, *,
                         mode: str = "importances", d_model: Optional[int] = None, overwrite: bool = False) -> Path:
    """Write ``graph`` as a MIB circuit-track submission folder ``out_dir/<task>_<model_name>``.

    ``mode="importances"``: one ``importances.json`` with every edge's score (MIB picks the sizes).
    ``mode="circuits"``: one pruned top-n circuit per size in :data:`MIB_SUBMISSION_PERCENTS`,
    ``circuit_<percent>.json``, each with at most that percentage of the edges.
    Files already in the folder are replaced only with ``overwrite=True``. Returns the folder.
    """
    if "_" in task:
        raise InputError(f"task {task!r} contains '_', which MIB uses to split task from model: "
                         f"write it with '-' (e.g. 'arithmetic-addition').")
    if isinstance(model_name, str) and "_" in model_name:
        raise InputError(f"model_name {model_name!r} contains '_', which MIB uses to split task from model: "
                         f"write it with '-' (e.g. 'gemma-3').")
    for what, name in (("task", task), ("model_name", model_name)):
        _check_folder_part(what, name)
    folder = Path(out_dir) / f"{task}_{model_name}"
    if folder.resolve().parent != Path(out_dir).resolve():
        raise InputError(f"The MIB folder {folder} would not lie directly in {out_dir}: give task and model_name "
                         "as plain names.")
    if mode == "importances":
        files = {"importances.json": None}
    elif mode == "circuits":
        files = {f"circuit_{percent:g}.json": percent for percent in MIB_SUBMISSION_PERCENTS}
    else:
        raise InputError(f"mode must be 'importances' or 'circuits', got {mode!r}.")
    for name in files:  # all refused before any is written
        refuse_existing(folder / name, overwrite)
    for name, percent in files.items():
        save_eap_json(graph if percent is None else select_fraction(graph, percent / 100), folder / name, d_model,
                      overwrite=overwrite)
    return folder


def _check_folder_part(what: str, name: Any) -> None:
    """``task``/``model_name`` become one folder name, ``<task>_<model>``: no path separator, no ``..``."""
    seps = {"/", "\\", os.sep, *([os.altsep] if os.altsep else [])}
    if not isinstance(name, str) or not name.strip() or any(c in name for c in seps) or ".." in name \
            or name.startswith(".") or "\0" in name:
        raise InputError(f"{what} {name!r} cannot be part of a MIB folder name <task>_<model>: it must be a plain, "
                         "non-empty name without '/', '\\', '..' or a leading '.' (e.g. 'gemma3'), so the "
                         "submission stays inside out_dir.")
