"""Tables that fold to the terminal's width instead of squeezing every cell to "1…".

A wide rich :class:`~rich.table.Table` (a dozen numeric columns) printed on an 80-column
terminal is shrunk by rich until each cell is an ellipsis. :func:`fold` keeps every cell whole:
it splits the columns into groups that fit the width, each group printed as its own table with
the first column (the row's name) repeated, like a wide spreadsheet printed on several pages.
:class:`FoldingConsole` does this for every table it prints, so commands (and the simulator's
report, which prints through the console it is given) need no change.
"""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

#: Border and padding a column adds to its content (rich's default box: "│ x " = 3 characters).
COLUMN_OVERHEAD = 3


def _natural_width(console: Console, table: Table, index: int) -> int:
    """Width column ``index`` needs: its widest cell (header included) when the column may not
    wrap; a wrapping column gets at most a quarter of the console, but never less than its
    longest word (so rich wraps long cells rather than cutting words)."""
    column = table.columns[index]
    cells = [c for c in (column.header, *column.cells) if c is not None and c != ""]
    sizes = [console.measure(c) for c in cells]
    widest = max((m.maximum for m in sizes), default=1)
    if column.no_wrap:
        return widest
    longest_word = max((m.minimum for m in sizes), default=1)
    return min(widest, max(longest_word, console.width // 4))


def fold(console: Console, table: Table, width: int | None = None) -> list[Table]:
    """``table`` as one or more tables no wider than ``width`` (default: the console's), each
    repeating the first column. A table that fits, or has fewer than 3 columns, is returned as is."""
    width = width or console.width
    n = len(table.columns)
    if n < 3 or not table.rows and not any(c.header for c in table.columns):
        return [table]
    widths = [_natural_width(console, table, i) + COLUMN_OVERHEAD for i in range(n)]
    if sum(widths) + 1 <= width:
        return [table]
    key, budget = widths[0], width - 1 - widths[0]
    groups: list[list[int]] = [[]]
    used = 0
    for i in range(1, n):
        if groups[-1] and used + widths[i] > budget:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += widths[i]
    if len(groups) == 1:
        return [table]
    cells = [list(c.cells) for c in table.columns]
    parts = []
    for g, group in enumerate(groups):
        title = table.title if g == 0 else ("(continued)" if table.title else None)
        part = Table(title=title, title_justify=table.title_justify, box=table.box, show_header=table.show_header,
                     header_style=table.header_style, show_lines=table.show_lines)
        for i in (0, *group):
            col = table.columns[i]
            part.add_column(col.header, justify=col.justify, style=col.style, no_wrap=col.no_wrap,
                            header_style=col.header_style)
        for r in range(len(table.rows)):
            part.add_row(*(cells[i][r] for i in (0, *group)))
        parts.append(part)
    return parts


class FoldingConsole(Console):
    """A console whose :meth:`print` folds wide tables (see :func:`fold`)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        if len(objects) == 1 and isinstance(objects[0], Table):
            parts = fold(self, objects[0])
            for part in parts:
                super().print(part, **kwargs)
            return
        super().print(*objects, **kwargs)
