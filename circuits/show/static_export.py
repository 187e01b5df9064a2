"""Static figures for papers: each plotly figure as SVG, PDF or PNG, sized for a two-column paper.

The report keeps figures interactive (plotly JSON drawn by the inlined plotly.js); a paper needs
vector files. :func:`export_figures` writes ``<name>.<format>`` for every figure, next to the
``<name>.json`` the experiments already save. Rendering goes through plotly's static export,
i.e. kaleido (>= 1), which drives a headless Chrome/Chromium: Debian's ``chromium`` package is
found on ``PATH`` (or point ``BROWSER_PATH`` at a browser; ``plotly_get_chrome`` downloads one).

**Size.** A two-column paper (ACL, NeurIPS, ICML templates) has a text width of about 7 in
and a column of about 3.3 in. Figures are laid out :data:`PAPER_WIDTH_PX` wide (the full text
width at 96 px/in) with a 10-pt font, keeping each figure's own height (clamped); in LaTeX use
``\\includegraphics[width=\\textwidth]`` for these, or ``\\columnwidth`` for narrow ones. PNGs are
rendered at ``PNG_SCALE`` x (about 300 dpi at that width).

Each file is written to a temporary name in the same folder and renamed, so an interrupted
export never leaves a half-written figure.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Mapping, Sequence

import plotly.graph_objects as go

from circuits.errors import InputError, ToolkitError

FORMATS = ("svg", "pdf", "png")
PAPER_WIDTH_PX = 672  # 7 in at 96 px/in: the text width of a two-column paper
PAPER_FONT_SIZE = 10
PNG_SCALE = 3
HEIGHT_RANGE = (280, 900)
BROWSER_HINT = ("kaleido renders through a headless Chrome/Chromium: install one (Debian/Ubuntu: apt-get install "
                "chromium), set BROWSER_PATH to it, or run plotly_get_chrome")


class StaticExportError(ToolkitError, RuntimeError):
    """Static figures cannot be written here (kaleido or a Chrome/Chromium is missing)."""


def parse_formats(text: str | Sequence[str]) -> tuple[str, ...]:
    """``"svg,pdf"`` -> ``("svg", "pdf")``; an empty string means no static export; unknown formats are refused."""
    items = [t.strip().lower() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    unknown = [t for t in items if t not in FORMATS]
    if unknown:
        raise InputError(f"Unknown figure format(s) {', '.join(map(repr, unknown))}; use a comma-separated "
                         f"subset of {', '.join(FORMATS)}.")
    return tuple(dict.fromkeys(items))


def require_kaleido() -> None:
    """Raise :class:`StaticExportError` unless kaleido is installed (checked before any long work)."""
    if importlib.util.find_spec("kaleido") is None:
        raise StaticExportError(f"Static figures need kaleido: pip install 'kaleido>=1'; {BROWSER_HINT}.")


def paper_layout(fig: go.Figure) -> go.Figure:
    """A copy of ``fig`` laid out for a paper: text width, 10-pt font, white background, its own height clamped."""
    out = go.Figure(fig)
    height = fig.layout.height or 420
    out.update_layout(width=PAPER_WIDTH_PX, height=min(max(int(height), HEIGHT_RANGE[0]), HEIGHT_RANGE[1]),
                      font=dict(size=PAPER_FONT_SIZE), paper_bgcolor="white", template="plotly_white")
    out.update_annotations(font_size=PAPER_FONT_SIZE + 1)  # subplot titles default to 16 pt
    return out


def export_figures(figures: Mapping[str, go.Figure], folder: str | os.PathLike,
                   formats: Sequence[str] = ("svg",)) -> list[Path]:
    """Write every figure as ``folder/<name>.<format>`` for each format; return the paths written.

    One browser session renders them all (``plotly.io.write_images``).
    """
    formats = parse_formats(formats)
    if not formats or not figures:
        return []
    require_kaleido()
    import plotly.io as pio

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(paper_layout(fig), folder / f"{name}.{fmt}", fmt) for name, fig in figures.items() for fmt in formats]
    temps = [path.with_name(f".{path.name}.tmp.{fmt}") for _, path, fmt in jobs]
    try:
        pio.write_images([fig for fig, _, _ in jobs], temps, format=[fmt for *_, fmt in jobs],
                         scale=[PNG_SCALE if fmt == "png" else 1 for *_, fmt in jobs],
                         width=[fig.layout.width for fig, _, _ in jobs],  # else kaleido's default 700 x 500
                         height=[fig.layout.height for fig, _, _ in jobs])
    except Exception as err:  # kaleido/choreographer raise their own types when no browser starts
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        raise StaticExportError(f"Static figure export failed ({type(err).__name__}: {err}); {BROWSER_HINT}.") from err
    for tmp, (_, path, _) in zip(temps, jobs):
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return [path for _, path, _ in jobs]
