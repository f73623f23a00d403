"""The one table writer: every table epilab prints (``epilab tune``, ``tune status``,
``db list/show/stats``, ``tune --model``'s report, ``explain()``) is rows of plain cells,
shown as a rich table in a terminal and as Markdown everywhere else (a pipe, a file, a log),
where every character and every column is kept."""

from __future__ import annotations

import io
import shutil
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def markdown(headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1) -> str:
    """A Markdown table: the first ``left`` columns left-aligned, the rest right-aligned;
    a cell's ``|`` escaped and its line breaks made spaces."""

    def cells(row: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in row) + " |"

    rule = "|" + "|".join("---" if i < left else "---:" for i in range(len(headers))) + "|"
    return "\n".join([cells(headers), rule, *(cells(r) for r in rows)])


def print_table(
    console: Console,
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    left: int = 1,
    optional: tuple[str, ...] = (),
) -> None:
    """Print a table of plain cells (data: neither markup nor terminal control). In a
    terminal a rich table that fits its width: the ``optional`` columns (the least needed
    first) are left out, and said so, while it does not. Elsewhere ``markdown``."""
    if not console.is_terminal:
        console.file.write(f"{title}\n{markdown(headers, rows, left=left)}\n")
        return
    shown = list(range(len(headers)))

    def width() -> int:  # a column's widest cell, its padding and border
        return 1 + sum(3 + max(len(headers[i]), *(len(r[i]) for r in rows)) for i in shown)

    left_out = []
    for name in (n for n in optional if n in headers):
        if width() <= console.width:
            break
        shown.remove(list(headers).index(name))
        left_out.append(name)
    table = Table(title=title)
    for i in shown:
        table.add_column(headers[i], justify="left" if i < left else "right", overflow="fold")
    for row in rows:
        table.add_row(*(escape(row[i]) for i in shown))
    console.print(table)
    if left_out:
        console.print(
            f"(left out to fit {console.width} columns: {', '.join(left_out)}; "
            "a wider terminal or a pipe shows every column)"
        )


def table_text(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    left: int = 1,
    optional: tuple[str, ...] = (),
    terminal: bool | None = None,
    width: int | None = None,
) -> str:
    """``print_table``'s text, for objects that print as a table (``print(epilab.explain())``):
    the rich table at the terminal's width where standard output is a terminal (``terminal``
    and ``width`` say otherwise), else the Markdown table."""
    terminal = sys.stdout.isatty() if terminal is None else terminal
    if not terminal:
        return f"{title}\n{markdown(headers, rows, left=left)}"
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=width or shutil.get_terminal_size().columns)
    print_table(console, title, headers, rows, left=left, optional=optional)
    return out.getvalue().rstrip("\n")
