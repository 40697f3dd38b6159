"""``lore bench import``: import throughput of real coding sessions, embeddings included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lore_gateway.cli.main import bench_app

_err = Console(stderr=True)


@bench_app.command("import")
def bench_import(
    data: Annotated[Path | None, typer.Option(
        "--data", help="Coding sessions JSON [default: "
        "../shared/data/coding-sessions/coding_eval.json].")] = None,
    embeddings: bool = typer.Option(True, "--embeddings/--no-embeddings",
                                    help="Embed the messages (as `lore import` does)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Time `lore import claude-code` on the coding sessions, written as transcripts."""
    from lore_gateway.bench import importing

    try:
        path = importing.resolve_data_path(data)
    except FileNotFoundError as exc:
        _err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=_err, transient=True,
                   disable=not _err.is_terminal)
    with bar:
        task = bar.add_task("importing sessions", total=None)
        report = importing.run(path, embeddings=embeddings, progress=lambda _, done, total:
                               bar.update(task, completed=done, total=total))
    figures = report.as_dict()
    table = Table(title=f"lore import claude-code ({path.name}, "
                        f"{'with' if report.embeddings else 'without'} embeddings)")
    for column in ("sessions", "messages", "total s", "messages/s", "median session msg/s",
                   "slowest session", "msg per CPU s"):
        table.add_column(column, justify="right")
    slow = figures["slowest_session"]
    table.add_row(str(figures["sessions"]), str(figures["messages"]), str(figures["total_s"]),
                  str(figures["messages_per_s"]), str(figures["median_session_messages_per_s"]),
                  f"{slow['messages']} msgs in {slow['seconds']} s",
                  str(figures["messages_per_cpu_s"]))
    Console().print(table)
    if as_json:
        typer.echo(json.dumps(figures))
