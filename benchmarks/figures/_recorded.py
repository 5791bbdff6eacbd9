"""Recorded benchmark tables, read from the Markdown page that publishes them (docs/estimators.md), so a figure
shows the numbers of the page and never a second copy of them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ESTIMATORS_MD = ROOT / "docs" / "estimators.md"


def table_after(caption: str, path: Path = ESTIMATORS_MD) -> tuple[list[str], list[list[str]]]:
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
