"""What every ``lore`` command prints: tables, key/value views, JSON, errors, progress.

One module so that every command behaves the same way for a person and for a script:

- On a terminal, tables fit the terminal's width (``COLUMNS`` is honoured). Cells wrap
  at spaces only, so a word, a path or a URL is never split; when even the longest
  words do not fit side by side, each row is printed as a block of ``name: value``
  lines instead of a squeezed table.
- When stdout is not a terminal, tables are plain tab-separated lines (a header line,
  then one line per row, nothing wrapped or cut, no colour) and ``--json`` gives one
  JSON document.
- A user error is one line on stderr, ``lore: error: ...``, and exit code 2.
- Progress bars are drawn on stderr only when it is a terminal; piped, they are silent.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TextIO

import typer

if TYPE_CHECKING:
    # Imported where drawn: `lore serve` prints nothing through rich, and the
    # gateway's process need not hold it (3.3 MiB of RSS, docs/benchmarks.md "Memory").
    from rich.console import Console
    from rich.progress import Progress, TaskID

# Space between table columns on a terminal.
GAP = 2
# Width assumed when the terminal's is unknown.
DEFAULT_WIDTH = 80

CellStyle = Callable[[int, int, str], str | None]


# The click that typer runs on (typer >= 0.20 vendors its own copy).
_ClickException: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class UserError(_ClickException):  # type: ignore[misc,valid-type]
    """Something the user can fix: printed as one line, exit code 2, no traceback.

    A ``ClickException``, so click prints it (via ``show``) and exits, in ``main``
    and in tests that invoke the app directly alike.
    """

    exit_code = 2

    def show(self, file: Any = None) -> None:
        error(str(self.message))


def is_terminal(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stdout
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def width() -> int:
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 turn``, ``2 turns``, ``0 turns`` (``many`` for irregular plurals)."""
    return f"{count} {word if count == 1 else (many or word + 's')}"


def error(message: str) -> None:
    """One line on stderr. ``message`` names what is wrong and what to do."""
    sys.stderr.write(f"lore: error: {message}\n")
    sys.stderr.flush()


def print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def _stdout_console() -> Console:
    from rich.console import Console

    return Console(width=width(), highlight=False, soft_wrap=True)


def line(text: str = "", style: str | None = None) -> None:
    """A line of prose: on a terminal styled and wrapped at spaces, plain otherwise."""
    if not is_terminal():
        sys.stdout.write(text + "\n")
        return
    from rich.text import Text

    console = _stdout_console()
    for part in _wrap(text, console.width) if len(text) > console.width else [text]:
        console.print(Text(part, style=style or ""), no_wrap=True, crop=False)


def prose(text: str) -> None:
    """Text as it is when piped; on a terminal each long line is wrapped at spaces
    (its indentation kept), so the terminal never breaks a word at its edge."""
    if not is_terminal():
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    size = width()
    out = []
    for raw in text.splitlines():
        if len(raw) <= size:
            out.append(raw)
            continue
        indent = raw[:len(raw) - len(raw.lstrip())]
        if raw.lstrip().startswith(("- ", "* ")):
            indent += "  "  # hang a list item's continuation under its text
        out.extend(textwrap.wrap(raw, size, subsequent_indent=indent,
                                 break_long_words=False, break_on_hyphens=False) or [""])
    sys.stdout.write("\n".join(out) + "\n")


# --- tables --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    align: Literal["left", "right"] = "left"
    # False keeps the cell on one line (ids, counts): only other columns wrap.
    wrap: bool = True
    # On a terminal, printed as "header: text" under its row instead of as a column
    # (a fix under a problem); piped, it is a column like the others.
    note: bool = False


def _words(text: str) -> list[str]:
    return text.split() or [""]


def _fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], total: int) -> list[int] | None:
    """Column widths that fit ``total`` without splitting a word, or None."""
    natural = [max([len(c.header), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    minimum = [
        natural[i] if not c.wrap else
        max([*(len(w) for w in _words(c.header)), *(len(w) for r in rows for w in _words(r[i]))])
        for i, c in enumerate(columns)
    ]
    budget = total - GAP * (len(columns) - 1)
    if sum(natural) <= budget:
        return natural
    if sum(minimum) > budget:
        return None
    widths = list(minimum)
    spare = budget - sum(minimum)
    want = [n - m for n, m in zip(natural, minimum, strict=True)]
    # Hand out the spare width in proportion to what each column still wants.
    wanted = sum(want)
    for i, extra in enumerate(want):
        widths[i] += spare * extra // wanted
    return widths


def _wrap(text: str, size: int) -> list[str]:
    return textwrap.wrap(text, size, break_long_words=False, break_on_hyphens=False) or [""]


def table_lines(columns: Sequence[Column], rows: Sequence[Sequence[str]],
                total: int) -> list[tuple[int, list[str]]]:
    """The terminal layout: (row index, padded cells) per printed line; row -1 is the
    header. Notes and the fallback blocks of ``header: value`` are one-string lines."""
    main = [i for i, c in enumerate(columns) if not c.note]
    notes = [i for i, c in enumerate(columns) if c.note]
    widths = _fit([columns[i] for i in main], [[r[i] for i in main] for r in rows], total)
    out: list[tuple[int, list[str]]] = []
    if widths is None:
        label = max(len(c.header) for c in columns) + 2
        for index, row in enumerate(rows):
            if index:
                out.append((index, [""]))
            for column, cell in zip(columns, row, strict=True):
                if not cell:
                    continue
                if max(len(w) for w in _words(cell)) <= total - label:
                    wrapped = _wrap(cell, total - label)
                    out.append((index, [f"{column.header + ':':<{label}}{wrapped[0]}"]))
                    out.extend((index, [" " * label + more]) for more in wrapped[1:])
                else:  # a long path: on the lines below its label, where it fits
                    out.append((index, [column.header + ":"]))
                    out.extend((index, ["  " + more]) for more in _wrap(cell, total - 2))
        return out
    indent = sum(widths[:-1]) + GAP * (len(widths) - 1)
    indent = indent if indent <= total // 2 else 4
    for index, row in enumerate([[c.header for c in columns], *rows]):
        cells = [_wrap(row[i], w) if columns[i].wrap else [row[i]]
                 for i, w in zip(main, widths, strict=True)]
        for n in range(max(len(c) for c in cells)):
            out.append((index - 1, [
                (cell[n] if n < len(cell) else "").rjust(w) if columns[i].align == "right"
                else (cell[n] if n < len(cell) else "").ljust(w)
                for i, cell, w in zip(main, cells, widths, strict=True)]))
        for i in notes if index else []:
            if row[i]:
                out.extend((index - 1, [" " * indent + text]) for text in
                           _wrap(f"{columns[i].header}: {row[i]}", max(20, total - indent)))
    return out


def _clean(cell: object) -> str:
    return " ".join(str(cell).split()) if cell is not None else ""


def print_table(columns: Sequence[Column], rows: Sequence[Sequence[object]], *,
                title: str | None = None, style: CellStyle | None = None) -> None:
    """A table: fitted to the terminal, or tab-separated lines when piped.

    ``style(row, column, text)`` may return a rich style for a cell (terminal only).
    """
    cells = [[_clean(c) for c in row] for row in rows]
    if not is_terminal():
        sys.stdout.write("\t".join(c.header for c in columns) + "\n")
        for row in cells:
            sys.stdout.write("\t".join(row) + "\n")
        sys.stdout.flush()
        return
    from rich.text import Text

    console = _stdout_console()
    if title:
        console.print(Text(title, style="bold"))
    for index, parts in table_lines(columns, cells, console.width):
        text = Text()
        for i, part in enumerate(parts):
            if i:
                text.append(" " * GAP)
            cell_style = "bold" if index < 0 else (
                style(index, i, cells[index][i]) if style and len(parts) > 1 else None)
            text.append(part, style=cell_style)
        text.rstrip()
        console.print(text, no_wrap=True, crop=False)


def print_fields(pairs: Sequence[tuple[str, object]], *, title: str | None = None) -> None:
    """``name  value`` lines (a status view); values wrap at spaces under themselves."""
    label = max((len(name) for name, _ in pairs), default=0) + GAP
    if not is_terminal():
        for name, value in pairs:
            sys.stdout.write(f"{name}\t{_clean(value)}\n")
        sys.stdout.flush()
        return
    from rich.text import Text

    console = _stdout_console()
    if title:
        console.print(Text(title, style="bold"))
    for name, value in pairs:
        wrapped = _wrap(_clean(value), max(20, console.width - label))
        text = Text(f"{name:<{label}}", style="bold")
        text.append(wrapped[0])
        console.print(text, no_wrap=True, crop=False)
        for more in wrapped[1:]:
            console.print(" " * label + more, no_wrap=True, crop=False, markup=False)


# --- progress ------------------------------------------------------------------------


def _bar() -> Progress:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        Task,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class _RateColumn(ProgressColumn):
        """Items per second, e.g. ``412/s``."""

        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text("" if speed is None else f"{speed:,.0f}/s", style="cyan")

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    _RateColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                    console=Console(stderr=True), transient=True)


@contextmanager
def stages() -> Iterator[Callable[[str, int, int], None]]:
    """``update(stage, done, total)``: one bar per stage on a terminal, silent otherwise."""
    if not is_terminal(sys.stderr):
        yield lambda stage, done, total: None
        return
    bar = _bar()
    tasks: dict[str, TaskID] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total)
        bar.update(tasks[stage], completed=done, total=total)

    with bar:
        yield update


@contextmanager
def progress(description: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
    """``advance(n)`` for one bar on a terminal; silent when stderr is not a terminal."""
    with stages() as update:
        done = 0

        def advance(count: int = 1) -> None:
            nonlocal done
            done += count
            update(description, done, total if total is not None else done)

        update(description, 0, total or 0)
        yield advance
