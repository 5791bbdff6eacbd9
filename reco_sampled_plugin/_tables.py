"""The one table writer of the package: Markdown tables (the reproduction report) and fixed-width text tables (the
terminal: ``reco-sampled estimate``, the reproduction summary, ``reco-sampled recbole``).

Why not ``tabulate`` or ``DataFrame.to_markdown``: both pad every cell to its column's width (``| metric   |``) and
rule the header with dashes of that width (``|----------|``); the report's tables are unpadded
(``| metric | recommender |`` over ``| --- | --- |``, which tests and readers search for), and the terminal tables
have fixed widths that the README and the docs show. Neither output is reproduced by a library, so both live here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["format_table"]


def _markdown_cell(cell: object) -> str:
    """A Markdown cell: ``|`` escaped (it would end the cell), a line break as a space (it would end the row)."""
    return " ".join(str(cell).splitlines()).replace("|", r"\|")


def format_table(header: Sequence[object] | None, rows: Iterable[Sequence[object]],
                 formats: Sequence[str] | None = None) -> list[str]:
    """The lines of a table (no trailing newline).

    Args:
        header: the column names, or None for a table without a header line (text tables only).
        rows: one sequence of cells per row (each cell is written as ``str(cell)``: format numbers before).
        formats: None for a Markdown table: ``| a | b |``, then ``| --- | --- |``, then one ``| x | y |`` line per
            row, cells unpadded (``|`` in a cell escaped as ``\\|``). Otherwise a fixed-width text table: one
            format spec per column (``"<12"`` left-aligned in 12 characters, ``">11"`` right-aligned, ``""``
            unpadded), the padded cells of a line joined without a gap (a width includes the space before the next
            column; a longer cell is not cut).

    Raises:
        ValueError naming ``rows`` (or ``header``) when a row's number of cells differs from the columns', or
        ``header`` when a Markdown table has none.
    """
    rows = [list(row) for row in rows]
    columns = len(formats) if formats is not None else (len(header) if header is not None else 0)
    if formats is None and header is None:
        raise ValueError("header: a Markdown table needs its column names")
    if header is not None and len(header) != columns:
        raise ValueError(f"header: {len(header)} names for {columns} columns")
    for k, row in enumerate(rows):
        if len(row) != columns:
            raise ValueError(f"rows: row {k} has {len(row)} cells, the table {columns} columns")
    if formats is None:
        def line(cells: Sequence[object]) -> str:
            return "| " + " | ".join(_markdown_cell(c) for c in cells) + " |"

        assert header is not None  # refused above
        return [line(header), line(["---"] * columns)] + [line(row) for row in rows]

    def text(cells: Sequence[object]) -> str:
        return "".join(format(str(c), spec) for c, spec in zip(cells, formats))

    return ([text(header)] if header is not None else []) + [text(row) for row in rows]
