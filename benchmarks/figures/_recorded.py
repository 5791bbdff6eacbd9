"""Recorded benchmark tables, read from the Markdown page that publishes them (docs/research-notes.md), so a figure
shows the numbers of the page and never a second copy of them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDED_MD = ROOT / "docs" / "research-notes.md"


def table_after(caption: str, path: Path = RECORDED_MD) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the first Markdown table after the line containing ``caption``; cells stripped of
    backticks. A missing caption or table is a ValueError naming both (the page changed: update the figure)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if caption in line), None)
    if start is None:
        raise ValueError(f"caption {caption!r} not found in {path}: the recorded table moved or was renamed")
    table = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    if len(table) < 3:
        raise ValueError(f"no table after {caption!r} in {path}")
    cells = [[c.strip().strip("`") for c in row.strip().strip("|").split("|")] for row in table]
    return cells[0], cells[2:]


def percent(cell: str) -> float:
    """``"12.6%"`` (or ``"12.6% / 1.00 / 1.44x"``: its first field) as a fraction."""
    return float(re.match(r"\s*([\d.]+)%", cell).group(1)) / 100.0


def save_figure(plt, fig, out: Path, name: str, dpi: int = 90) -> Path:
    """Lay out ``fig``, write it to ``out / name`` (the folder made if needed), close it; the path."""
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def figure_args(argv: list[str] | None, doc: str):
    """The figure scripts' command line (``--out``, default docs/img) and a headless pyplot: (args, plt)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return args, plt


def finish_panels(plt, fig, axes, ms, out: Path, name: str, *, xlabel: str, ylabel: str, title: str,
                  legend_size: int) -> Path:
    """Log-log small multiples over the sample sizes ``ms``: ticks, legend, labels, saved as ``out / name``."""
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.tick_params(axis="x", which="minor", labelbottom=False)
    axes[0].legend(fontsize=legend_size)
    fig.supxlabel(xlabel)
    fig.supylabel(ylabel)
    fig.suptitle(title)
    return save_figure(plt, fig, out, name)
