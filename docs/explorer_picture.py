"""The README's picture of the circuit explorer: a run's report opened in headless Chromium, its first explorer set
to one circuit size, one node hovered, and that explorer saved as a PNG.

    python docs/explorer_picture.py runs/explorer-addition/report.html docs/explorer.png --size 5% --hover "MLP 0"

It needs what the browser tests need (selenium, Chromium and chromedriver: tests/browser.py). The picture is of
the page as a reader sees it; what the run measured is in its results.json, and docs/results.md says which run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser import chromium  # noqa: E402  (the repository root is on the path only now)

SET_SIZE = """
const root = document.querySelector('.circuit-explorer');
const slider = root.querySelector('.explorer-size');
for (let k = 0; k <= Number(slider.max); k++) {
  slider.value = k; slider.dispatchEvent(new Event('input'));
  if (root.querySelector('.explorer-size-label').textContent.trim().startsWith(arguments[0] + ' ')) return k;
}
return -1;
"""
HOVER_NODE = """
const gd = document.querySelector('.circuit-explorer .explorer-plot');
for (let c = 0; c < gd.data.length; c++) {
  const text = gd.data[c].text || gd.data[c].hovertext || [];
  const p = Array.from(text).findIndex(t => String(t).includes(arguments[0]));
  if (p >= 0) { Plotly.Fx.hover(gd, [{curveNumber: c, pointNumber: p}]); return true; }
}
return false;
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a run's report.html with an edge-circuit explorer")
    parser.add_argument("png", type=Path, help="where the picture goes")
    parser.add_argument("--size", default="5%", help="the circuit size to show, as the size label writes it")
    parser.add_argument("--hover", default="", help="a node whose hover to show (its name, e.g. 'MLP 0')")
    args = parser.parse_args(argv)
    if not args.report.is_file():
        parser.error(f"{args.report}: no such report; run an experiment that draws an edge circuit first.")
    with chromium() as driver:
        driver.get(args.report.resolve().as_uri())
        time.sleep(3)  # plotly draws after the page's scripts run
        if driver.execute_script(SET_SIZE, args.size) < 0:
            raise SystemExit(f"{args.report}: the explorer has no size labelled {args.size!r}.")
        time.sleep(1)
        if args.hover and not driver.execute_script(HOVER_NODE, args.hover):
            raise SystemExit(f"{args.report}: no node {args.hover!r} is drawn at {args.size}.")
        element = driver.find_element("css selector", ".circuit-explorer")
        driver.execute_script("arguments[0].scrollIntoView();", element)
        time.sleep(0.5)
        tmp = args.png.with_suffix(".tmp.png")
        element.screenshot(str(tmp))
        tmp.replace(args.png)  # written whole, then renamed
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
