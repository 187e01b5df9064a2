"""The edge-circuit explorer in headless Chromium: the size control, hover, compare mode and click redraw what the
page's data says, offline and without console errors; a gemma-sized and a 7B-sized graph open within a bound.

Screenshots go to the test's tmp folder. Skips when Chromium, chromedriver or selenium is missing
(see tests/browser.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from circuits.graph import Graph, GraphLayout
from circuits.nodes import Head
from circuits.show.explorer import circuit_explorer
from tests.browser import browser_or_skip, chromium, errors_and_requests

CURVE = {"fractions": [0.05, 0.1, 0.2, 0.5, 1.0],
         "faithfulness": [{"value": v, "low": v - 0.1, "high": v + 0.05} for v in (0.25, 0.4, 0.6, 0.9, 1.0)]}
#: generous: a page that freezes takes minutes; on the 2-core test machine both pages open in a few seconds
LOAD_BOUND_S = 20.0


def scored(layout: GraphLayout, seed: int) -> Graph:
    g = torch.Generator().manual_seed(seed)
    random = torch.randn(layout.n_forward, layout.n_backward, generator=g)
    return Graph(layout, torch.where(layout.real_edge_mask, random, torch.nan))


def wait_for(driver, expression: str, expected, timeout_s: float = LOAD_BOUND_S):
    """Poll a JavaScript expression until it returns ``expected``; fail with its last value after ``timeout_s``."""
    deadline, value = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        value = driver.execute_script(f"return ({expression});")
        if value == expected:
            return value
        time.sleep(0.05)
    pytest.fail(f"{expression} is {value!r} after {timeout_s} s, expected {expected!r}")


def painted(driver) -> None:
    """Return once the browser has painted what is drawn (two animation frames later)."""
    driver.execute_script("return new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));")


def open_page(driver, path: Path) -> float:
    """Open ``path``; seconds until the explorer's first view is drawn and painted."""
    started = time.monotonic()
    driver.get(path.resolve().as_uri())
    wait_for(driver, "document.querySelector('.circuit-explorer').dataset.ready", "1")
    painted(driver)
    return time.monotonic() - started


ROOT = "document.querySelector('.circuit-explorer')"
GD = "document.querySelector('.explorer-plot')"
SEGMENTS = (f"{GD}.data.filter(t => t.meta === %r).reduce((n, t) => n + t.x.length / 3, 0)")


def set_control(driver, selector: str, value, event: str, rendered: str) -> None:
    driver.execute_script(f"var c = {ROOT}.querySelector({selector!r}); c.value = {json.dumps(str(value))}; "
                          f"c.dispatchEvent(new Event({event!r}));")
    wait_for(driver, f"{ROOT}.dataset.rendered", rendered)


def hover_text(driver, meta: str, node_or_point: int, by_node: bool, expected: str) -> str:
    """Hover one point of the first trace of kind ``meta`` (a node by its row, or an edge by its point index); the
    tooltip plotly shows, once it holds ``expected`` (or as it is after 5 s)."""
    driver.execute_script(f"""
        var gd = {GD}, want = {node_or_point}, byNode = {str(by_node).lower()};
        Plotly.Fx.unhover(gd);
        for (var c = 0; c < gd.data.length; c++) {{
          var t = gd.data[c]; if (t.meta !== {meta!r}) continue;
          var p = byNode ? t.customdata.indexOf(want) : want;
          if (p >= 0) {{ Plotly.Fx.hover(gd, [{{curveNumber: c, pointNumber: p}}]); return; }}
        }}""")
    deadline, text = time.monotonic() + 5, None
    while time.monotonic() < deadline and expected not in (text or ""):
        text = driver.execute_script("var e = document.querySelector('.hoverlayer .hovertext'); "
                                     "return e ? e.textContent : null;")
        time.sleep(0.05)
    return text or ""


def paths_to_logits(page: dict, rows: list[int], node: int) -> int:
    """How many of the drawn ``rows`` lie on a path from ``node`` to the logits (what a click highlights)."""
    src, dst, logits = page["edges"]["src"], page["edges"]["dst"], len(page["nodes"]["name"]) - 1
    down, up = {node}, {logits}
    for _ in range(len(rows)):
        down |= {dst[i] for i in rows if src[i] in down}
        up |= {src[i] for i in rows if dst[i] in up}
    return sum(1 for i in rows if src[i] in down and dst[i] in up)


def test_size_control_hover_click_and_compare_redraw_the_right_edges(tmp_path):
    browser_or_skip()
    layout = GraphLayout(4, 3)
    graph = scored(layout, 0)
    explorer = circuit_explorer(graph, curve=CURVE, compare=scored(layout, 1), labels=("EAP-IG", "learned"),
                                edge_share=torch.full((layout.n_forward, layout.n_backward), 0.75), prune=False,
                                max_edges=25, node_info={Head(3, 2): {"key-head rank": 2}}, start=0.05)
    page = explorer.payload
    path = explorer.save(tmp_path / "explorer.html")
    with chromium() as driver:
        open_page(driver, path)
        for k, size in enumerate(page["sizes"]):
            set_control(driver, ".explorer-size", k, "input", f"circuit:{k}:null")
            drawn = min(int(size["fraction"] * layout.n_edges), 25)
            assert driver.execute_script(f"return {SEGMENTS % 'edges'};") == drawn == len(size["drawn"])
            status = driver.execute_script(f"return {ROOT}.querySelector('.explorer-status').textContent;")
            f = CURVE["faithfulness"][k]
            assert f"f = {f['value']:.3f} [{f['low']:.3f}, {f['high']:.3f}]" in status
            assert f"{drawn} drawn, {size['n_circuit'] - drawn} hidden" in status
        driver.save_screenshot(str(tmp_path / "explorer_full_size.png"))
        logits = len(page["nodes"]["name"]) - 1
        node = hover_text(driver, "nodes", page["nodes"]["name"].index("a3.h2"), True, "key-head rank: 2")
        assert node == "L3H2 (a3.h2)key-head rank: 2"
        edge = hover_text(driver, "edge-hover", 0, False, "share of runs")
        assert "score" in edge and "share of runs keeping it: 0.75" in edge
        head = page["edges"]["src"][page["sizes"][-1]["drawn"][0]]  # the sender of the strongest drawn edge
        click = f"{{points: [{{data: {{meta: 'nodes'}}, customdata: {head}}}]}}"  # what plotly sends on a click
        driver.execute_script(f"{GD}.emit('plotly_click', {click});")
        wait_for(driver, f"{ROOT}.dataset.rendered", f"circuit:{len(page['sizes']) - 1}:{head}")
        assert driver.execute_script(f"return {SEGMENTS % 'focus'};") == paths_to_logits(
            page, page["sizes"][-1]["drawn"], head) > 0
        driver.save_screenshot(str(tmp_path / "explorer_paths_to_logits.png"))
        set_control(driver, ".explorer-mode", "compare", "change", f"compare:{len(page['sizes']) - 1}:{head}")
        parts = page["sizes"][-1]["compare"]
        status = driver.execute_script(f"return {ROOT}.querySelector('.explorer-status').textContent;")
        assert (f"{parts['both']['count']} in both circuits, {parts['only_a']['count']} only in EAP-IG, "
                f"{parts['only_b']['count']} only in learned") in status
        names = driver.execute_script(f"return {GD}.data.filter(t => t.meta === 'edges').map(t => t.name);")
        assert any(n.startswith("only in learned (") for n in names) and logits > 0
        assert driver.execute_script(f"return {SEGMENTS % 'edges'};") == sum(len(p["rows"]) for p in parts.values())
        driver.save_screenshot(str(tmp_path / "explorer_compare.png"))
        errors, requests = errors_and_requests(driver)
    assert errors == [] and requests == []
    assert (tmp_path / "explorer_compare.png").stat().st_size > 10_000


@pytest.mark.parametrize("n_layers, n_heads, n_edges", [(18, 4, 10_342), (32, 32, 1_592_881)],
                         ids=["gemma-3-270m-sized", "7b-sized"])
def test_large_graphs_open_without_freezing(tmp_path, n_layers, n_heads, n_edges):
    browser_or_skip()
    layout = GraphLayout(n_layers, n_heads)
    assert layout.n_edges == n_edges
    started = time.monotonic()
    explorer = circuit_explorer(scored(layout, 2), sizes=(0.01, 0.05, 0.2, 1.0), max_edges=3000, start=0.05)
    build_s = time.monotonic() - started
    path = explorer.save(tmp_path / "explorer.html")
    with chromium() as driver:
        load_s = open_page(driver, path)
        start = explorer.payload["sizes"][1]
        drawn = driver.execute_script(f"return {SEGMENTS % 'edges'};")
        assert drawn == len(start["drawn"]) == min(3000, start["n_circuit"])
        status = driver.execute_script(f"return {ROOT}.querySelector('.explorer-status').textContent;")
        assert f"{start['n_circuit'] - len(start['drawn'])} hidden" in status
        started = time.monotonic()
        set_control(driver, ".explorer-size", 3, "input", "circuit:3:null")  # every edge: 3000 drawn, the rest hidden
        painted(driver)
        redraw_s = time.monotonic() - started
        driver.save_screenshot(str(tmp_path / f"explorer_{n_layers}x{n_heads}.png"))
    print(f"{n_edges} edges: built in {build_s:.1f} s, page {path.stat().st_size / 1e6:.1f} MB, opened in "
          f"{load_s:.2f} s, redrawn at 100% in {redraw_s:.2f} s")
    assert load_s < LOAD_BOUND_S and redraw_s < LOAD_BOUND_S
