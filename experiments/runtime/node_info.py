"""What the edge-circuit explorer shows on hovering a node, gathered from what a run has already measured.

:func:`circuits.show.explorer.circuit_explorer` takes ``node_info``: per node, the fields its hover lists. The runs
measure those fields in other stages and other experiments; the functions here turn each result into that form,
keyed by the toolkit's node names (``L3H1``, ``MLP 3``), so that a stage only merges them:

* :func:`path_patching_info`: each head's and MLP's path-patching effect on the answer logit
  (``results["path_patching"]`` of the main job, :meth:`patching.sweeps.results.NodeScores.to_dict`), with its 95%
  interval and its share of the mean logit: ``{"path-patching effect": "-1.52 [-1.9, -1.1] (-12.3%)"}``;
* :func:`iia_info`: each node's interchange-intervention accuracy per causal variable (the rows of
  ``python -m experiments.variables --circuit``, results.json ``circuit.rows``): ``{"IIA a": "0.84 [0.75, 0.90]"}``;
  :func:`read_variables_rows` reads those rows from a run folder, checked, every failure naming the file;
* :func:`merge_node_info`: several such tables in one (a node's fields in the order given).

The attention-read class needs nothing here: the explorer's ``head_roles`` shows it in the hover itself.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from circuits.errors import InputError
from circuits.file_reads import read_json

__all__ = ["path_patching_info", "iia_info", "read_variables_rows", "merge_node_info"]


def _num(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}g}" if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


def _interval(value: Any, ci: Optional[Sequence]) -> str:
    """``value [low, high]`` (``value`` alone when no interval was measured)."""
    if not ci or len(ci) != 2 or ci[0] is None or ci[1] is None:
        return _num(value)
    return f"{_num(value)} [{_num(ci[0])}, {_num(ci[1])}]"


def path_patching_info(scores: Optional[Mapping]) -> dict[str, dict[str, str]]:
    """Per head and MLP that was scored, ``{"path-patching effect": "value [low, high] (percent%)"}`` from
    ``NodeScores.to_dict()`` (the main job's ``results["path_patching"]``); ``{}`` for None."""
    if not scores:
        return {}
    info: dict[str, dict[str, str]] = {}
    for layer, row in enumerate(scores.get("heads") or []):
        for head, value in enumerate(row):
            if value is not None:
                info[f"L{layer}H{head}"] = {"path-patching effect": _effect(
                    value, _at(scores, "heads_ci", layer, head), _at(scores, "heads_percent", layer, head))}
    for layer, value in enumerate(scores.get("mlps") or []):
        if value is not None:
            info[f"MLP {layer}"] = {"path-patching effect": _effect(
                value, _at(scores, "mlps_ci", layer), _at(scores, "mlps_percent", layer))}
    return info


def _at(scores: Mapping, key: str, *index: int) -> Any:
    """``scores[key][i][j]``, or None where the table or the entry is missing."""
    value = scores.get(key)
    for i in index:
        if not isinstance(value, list) or i >= len(value):
            return None
        value = value[i]
    return value


def _effect(value: Any, ci: Optional[Sequence], percent: Any) -> str:
    text = _interval(value, ci)
    if isinstance(percent, (int, float)) and math.isfinite(percent):
        text += f" ({percent:.1f}% of the logit)"
    return text


def iia_info(rows: Sequence[Mapping]) -> dict[str, dict[str, str]]:
    """Per node, ``{"IIA <variable>": "value [low, high]"}`` from ``experiments.variables``' circuit rows (each
    ``{"variable", "node", "position", "iia": {"value", "low", "high"}}``); a variable measured at several positions
    names the position (``"IIA a at a_last"``)."""
    positions: dict[str, set] = {}
    for row in rows:
        positions.setdefault(row["variable"], set()).add(row.get("position"))
    info: dict[str, dict[str, str]] = {}
    for row in rows:
        key = f"IIA {row['variable']}"
        if len(positions[row["variable"]]) > 1:
            key += f" at {row.get('position')}"
        iia = row["iia"]
        info.setdefault(str(row["node"]), {})[key] = _interval(iia.get("value"), [iia.get("low"), iia.get("high")])
    return info


def read_variables_rows(folder: str | os.PathLike) -> list[dict]:
    """The circuit rows (``circuit.rows``) of a ``python -m experiments.variables --circuit`` run folder (or its
    results.json), checked: each row a variable, a node and an IIA estimate."""
    given = Path(folder)
    path = given / "results.json" if given.is_dir() else given
    results = read_json(path, "the results.json of a python -m experiments.variables run", error=InputError)
    rows = results.get("circuit", {}).get("rows") if isinstance(results, dict) else None
    if not isinstance(rows, list) or not rows:
        raise InputError(f"{path} holds no per-node IIA rows (circuit.rows): give the folder of a run of "
                         "python -m experiments.variables with --circuit (or --nodes).")
    for i, row in enumerate(rows):
        if not (isinstance(row, dict) and isinstance(row.get("variable"), str) and isinstance(row.get("node"), str)
                and isinstance(row.get("iia"), dict) and isinstance(row["iia"].get("value"), (int, float))):
            raise InputError(f"{path}: circuit.rows[{i}] is not a row of experiments.variables (a variable, a node "
                             "and an iia estimate with a value); the file was edited or comes from another tool.")
    return rows


def merge_node_info(*tables: Optional[Mapping[Any, Mapping[str, Any]]]) -> dict[Any, dict[str, Any]]:
    """The fields of every table per node, in the order given (a later table's field of the same name wins)."""
    merged: dict[Any, dict[str, Any]] = {}
    for table in tables:
        for node, fields in (table or {}).items():
            merged.setdefault(str(node), {}).update(fields)
    return merged
