"""Tables that never cut a number or an id, at any width.

Rich shrinks a table that is wider than the console by wrapping, then by cutting cells with `…`. That is fine for
words and wrong for numbers and ids: `1,69…` is a lost figure, and a run id folded over six lines cannot be copied.
So every column here says what it holds: numbers and ids never wrap (`no_wrap`, and the table is laid out only
where they fit whole); text may wrap at spaces. A table is printed in the first layout that fits the console:

1. the whole table;
2. its columns split into two tables, each repeating the key columns (the level, the figure, the run);
3. one block per row: the keys on a line, then `header value` pairs that wrap between pairs, never inside one.

Output that is not a terminal has no width limit (servelab's consoles are made by `make_console`), so a pipe or a
log file always gets the whole table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from servelab.textsafe import InertConsole

PIPE_WIDTH = 10_000  # "no limit" for output that is not a terminal (rich needs a number)
RULE_WIDTH = 80  # section rules in a log file: as wide as a default terminal, not PIPE_WIDTH
Cell = str | Text
Kind = Literal["num", "id", "text"]


class OutputConsole(InertConsole):
    """servelab's console: text it did not write is shown inert (textsafe.py), and its rules stay RULE_WIDTH wide
    when its width is unlimited (a pipe, a file)."""

    def rule(self, title: str | Text = "", *, characters: str = "─", style: str = "rule.line",
             align: Literal["left", "center", "right"] = "center") -> None:
        if self.width <= RULE_WIDTH * 2:
            super().rule(title, characters=characters, style=style, align=align)
            return
        self.print(Rule(title, characters=characters, style=style, align=align), width=RULE_WIDTH)


def make_console(stderr: bool = False) -> Console:
    """servelab's console: the terminal's width on a terminal; no width limit and no wrapping elsewhere."""
    probe = Console(stderr=stderr)
    if probe.is_terminal:
        return OutputConsole(stderr=stderr)
    return OutputConsole(stderr=stderr, width=PIPE_WIDTH, soft_wrap=True)


@dataclass(frozen=True)
class Col:
    header: str
    kind: Kind = "num"  # num and id never wrap; text wraps at spaces
    justify: Literal["left", "right", "center"] = "right"
    style: str | None = None


def key_col(header: str) -> Col:
    """A row's key (a level tag, a figure's name, a run): left-aligned, never wrapped."""
    return Col(header, kind="id", justify="left")


def text_col(header: str) -> Col:
    return Col(header, kind="text", justify="left")


def human_bytes(n: float | None) -> str:
    """98362432 -> "98 MB" (decimal units, as disks and model cards count them)."""
    if n is None:
        return "–"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            break
        value /= 1000
    if unit == "B":
        return f"{value:.0f} B"
    return f"{value:.1f} {unit}" if abs(value) < 10 else f"{value:,.0f} {unit}"


def build_table(title: str | None, cols: Sequence[Col], rows: Sequence[Sequence[Cell]]) -> Table:
    table = Table(title=title, title_justify="left")
    for col in cols:
        wrap = col.kind == "text"
        # A num or id column never wraps; the layouts below print a table only where every one fits whole, so
        # its overflow never applies (fold is the safety net that would lose no digit; rich's "ignore" would
        # also lose the column's justification).
        # A header is as whole as its numbers: rich would crop it to the column's numbers ("leve" for "level"),
        # so its longest line is the column's least width, and a table too wide for that is split instead.
        least = max((len(line) for line in col.header.splitlines()), default=0) if not wrap else None
        table.add_column(col.header, justify=col.justify, no_wrap=not wrap, overflow="fold", style=col.style,
                         min_width=least)
    for row in rows:
        table.add_row(*row)
    return table


def fits(console: Console, renderable: RenderableType, width: int | None = None) -> bool:
    """Whether the renderable's narrowest layout (numbers and ids whole) fits in `width` (the console's)."""
    width = width or console.width
    # Measured against a width it cannot reach: a table clamps its measurement to the width it is offered.
    unbounded = console.options.update(width=PIPE_WIDTH, max_width=PIPE_WIDTH)
    return Measurement.get(console, unbounded, renderable).minimum <= width


def print_table(console: Console, title: str | None, cols: Sequence[Col], rows: Sequence[Sequence[Cell]],
                keys: int = 1, max_parts: int = 2) -> None:
    """Print the table in the first layout that fits (module docstring); `keys` leading columns identify a row."""
    for renderable in layout(console, title, cols, rows, keys, max_parts):
        console.print(renderable)


def layout(console: Console, title: str | None, cols: Sequence[Col], rows: Sequence[Sequence[Cell]], keys: int = 1,
           max_parts: int = 2) -> list[RenderableType]:
    # The title is a line of its own: as a table's title it would wrap at the table's width, maybe inside a URL.
    head: list[RenderableType] = [Text(title)] if title else []
    whole = build_table(None, cols, rows)
    if fits(console, whole):
        return head + [whole]
    parts = _split(console, cols, rows, keys, max_parts)
    if parts is not None:
        return head + parts
    return head + vertical(console, cols, rows, keys)


def _split(console: Console, cols: Sequence[Col], rows: Sequence[Sequence[Cell]], keys: int,
           max_parts: int) -> list[RenderableType] | None:
    """Greedy: as many columns as fit next to the keys, then the next table. None when more than `max_parts`
    tables would be needed or one column does not fit even alone beside the keys."""
    groups: list[list[int]] = []
    current: list[int] = []
    for i in range(keys, len(cols)):
        trial = current + [i]
        if fits(console, _subtable(None, cols, rows, keys, trial)):
            current = trial
            continue
        if not current:
            return None
        groups.append(current)
        current = [i]
        if not fits(console, _subtable(None, cols, rows, keys, current)):
            return None
    if current:
        groups.append(current)
    if len(groups) > max_parts:
        return None
    return [_subtable(None, cols, rows, keys, group) for group in groups]


def _subtable(title: str | None, cols: Sequence[Col], rows: Sequence[Sequence[Cell]], keys: int,
              chosen: list[int]) -> Table:
    picked = list(range(keys)) + chosen
    return build_table(title, [cols[i] for i in picked], [[row[i] for i in picked] for row in rows])


def vertical(console: Console, cols: Sequence[Col], rows: Sequence[Sequence[Cell]], keys: int = 1
             ) -> list[RenderableType]:
    """One block per row: its key cells, then `header value` pairs separated by ` · `, packed into lines of the
    console's width. A line only ever breaks between pairs, so a number stays whole, next to its name."""
    width = console.width
    out: list[RenderableType] = []
    for row in rows:
        head = Text(" ").join(_as_text(c) for c in row[:keys])
        head.stylize("bold")
        head.no_wrap, head.overflow = True, "ignore"
        out.append(head)
        pairs = []
        for col, cell in zip(cols[keys:], row[keys:]):
            value = _as_text(cell)
            if not value.plain.strip():
                continue
            value = _one_line(value)
            pairs.append(Text.assemble((col.header.replace("\n", " ") + " ", "dim"), value))
        line = Text("  ")
        for pair in pairs:
            sep = " · " if len(line) > 2 else ""
            if len(line) > 2 and len(line) + len(sep) + len(pair) > width:
                line.no_wrap, line.overflow = True, "ignore"
                out.append(line)
                line, sep = Text("  "), ""
            line.append(sep)
            line.append_text(pair)
        if len(line) > 2:
            line.no_wrap, line.overflow = True, "ignore"
            out.append(line)
    return out


def _as_text(cell: Cell) -> Text:
    return cell.copy() if isinstance(cell, Text) else Text(str(cell))


def _one_line(text: Text) -> Text:
    """A cell's lines joined with spaces (a stacked cell, laid out flat)."""
    plain = text.plain
    out = Text(plain.replace("\n", " "))
    for span in text.spans:
        out.stylize(span.style, span.start, span.end)
    return out


__all__ = ["Col", "OutputConsole", "PIPE_WIDTH", "RULE_WIDTH", "build_table", "fits", "human_bytes", "key_col",
           "layout", "make_console", "print_table", "text_col", "vertical"]
