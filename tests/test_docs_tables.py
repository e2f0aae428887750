"""The README's tables stay tables: no cell over 60 words (issue 38: the figure table keeps one
short line per row: the figure, the baseline, the command, a link; the history lives in docs/)."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_WORDS = 60


def table_cells(line: str) -> list[str]:
    """The cells of one Markdown table row: split on ``|`` outside code spans, ``\\|`` kept."""
    cells, cur, code, i = [], [], False, 0
    while i < len(line):
        c = line[i]
        if c == "\\" and i + 1 < len(line):
            cur.append(line[i:i + 2])
            i += 2
            continue
        if c == "`":
            code = not code
        if c == "|" and not code:
            cells.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    cells.append("".join(cur))
    return [c.strip() for c in cells[1:-1]]


def long_cells(text: str, limit: int = MAX_WORDS) -> list[tuple[int, int, str]]:
    """``(line, words, start of the cell)`` of every table cell over ``limit`` words."""
    return [(n, len(cell.split()), cell[:60]) for n, line in enumerate(text.splitlines(), 1)
            if line.lstrip().startswith("|") for cell in table_cells(line.strip())
            if len(cell.split()) > limit]


def test_no_readme_table_cell_is_over_60_words():
    assert long_cells((ROOT / "README.md").read_text()) == []


@pytest.mark.parametrize("row, cells", [
    ("| a | `x | y` | b \\| c |", ["a", "`x | y`", "b \\| c"]),
    ("| figure | " + "word " * 61 + "|", ["figure", ("word " * 61).strip()]),
])
def test_cells_split_on_bars_outside_code_spans(row, cells):
    assert table_cells(row) == cells


def test_a_long_cell_is_found_with_its_line():
    text = "intro\n\n| a | b |\n|---|---|\n| short | " + "word " * 61 + "|\n"
    assert long_cells(text) == [(5, 61, ("word " * 61)[:60])]
