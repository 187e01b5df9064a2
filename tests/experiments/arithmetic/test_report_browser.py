"""The main job's report.html as a reader meets it, in headless Chromium: every figure captioned, the key heads
marked on the path-patching map, prompts with their line breaks, one titled attention view per key head, folded.

Runs `experiments.addition` end to end on a tiny saved model (tests/experiments/conftest.py). Skips when
Chromium, chromedriver or selenium is missing (see tests/browser.py). The first screen is saved under
test-artifacts/ (gitignored).

Cross-cutting (a browser test): the whole pipeline's page (experiments.arithmetic and its report,
circuits.show.html_report, the figures of circuits.show) as a reader sees it.
"""

from pathlib import Path

from experiments import arithmetic as _arithmetic
from tests.browser import browser_or_skip, load_page

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"
FAST = ["--n-prompts", "60", "--top-k", "4", "--knockout-prompts", "6", "--knockout-ks", "1,2", "--knockout-seeds", "1",
        "--transfer-prompts", "4", "--af1-stride", "0", "--batch-size", "16", "--circuit-prompts", "4"]

CHECKS = {
    "figures": "document.querySelectorAll('figure.figure-block').length",
    "uncaptioned": "[...document.querySelectorAll('figure.figure-block')].filter("
                   "f => !(f.querySelector('figcaption') && f.querySelector('figcaption').textContent.trim().length > 40)).length",
    "key_head_marks": "[...document.querySelectorAll('.plotly-figure')].filter(f => f.textContent.includes('Path patching'))"
                      ".map(f => [...f.querySelectorAll('text')].filter(t => /^#\\d+$/.test(t.textContent)).length)[0]",
    "prompt_lines": "Math.max(...[...document.querySelectorAll('td.text')].map(td => td.innerText.split('\\n').length))",
    "view_titles": "[...document.querySelectorAll('figure.figure-block')].filter(f => f.querySelector('.attention-view'))"
                   ".map(f => f.querySelector('figcaption') ? f.querySelector('figcaption').textContent : '')",
    "views_folded": "[...document.querySelectorAll('.attention-view')].every(v => v.closest('details.fold'))",
    "view_prompt_lines": "Math.min(...[...document.querySelectorAll('.attention-view')].map("
                         "v => v.parentElement.querySelector('pre.prompt').innerText.split('\\n').length))",
}


def test_run_report_reads_in_chromium(tiny_dir, tmp_path):
    browser_or_skip()
    out = tmp_path / "run"
    results = _arithmetic.main("+", ["--model", str(tiny_dir), "--out", str(out), *FAST])
    page = load_page(out / "report.html", {"drawn": ".plotly-figure:has(.main-svg)", "views": ".attention-view *"},
                     wait_for={"drawn": 6, "views": 10}, evaluate=CHECKS, timeout_s=240, first_screen=ARTIFACTS / "run_first_screen.png")
    assert page.console_errors == [] and page.failed_requests == []
    values = page.values
    assert values["figures"] >= 8 and values["uncaptioned"] == 0
    assert values["key_head_marks"] == len(results["key_heads"]) == 4
    assert values["prompt_lines"] == 4  # three solved examples and the query, one per line
    assert len(values["view_titles"]) == 6  # four key heads on a few-shot prompt, the top one on two formats
    assert all(" head), key head #" in h for h in values["view_titles"]), values["view_titles"]
    assert values["views_folded"]  # behind one toggle, so the circuit sections are not pages down
    assert values["view_prompt_lines"] >= 1
