"""``lore bench locomo``, ``coding`` and ``search``: memory quality and speed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table

from lore_gateway.cli.main import bench_app

_err = Console(stderr=True)


def _progress_bar() -> tuple[Progress, Callable[[str, int, int], None]]:
    bar = Progress(TextColumn("{task.description}"), BarColumn(),
                   TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(),
                   console=_err, transient=True)
    tasks: dict[str, TaskID] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total)
        bar.update(tasks[stage], completed=done, total=total)

    return bar, update


@bench_app.command("locomo")
def locomo(
    data: Annotated[Path | None, typer.Option(
        "--data", help="LoCoMo JSON file [default: ../shared/data/locomo/locomo10_dev.json].",
    )] = None,
    embeddings: bool = typer.Option(True, "--embeddings/--no-embeddings",
                                    help="Use the offline embedding model (hybrid search)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Retrieval quality of memory search on LoCoMo: recall@5/10 and MRR per category."""
    from lore_gateway.bench import locomo as bench

    try:
        path = bench.resolve_data_path(data)
    except FileNotFoundError as exc:
        _err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    bar, update = _progress_bar()
    with bar:
        report = bench.run(path, embeddings=embeddings, progress=update)
    figures = report.as_dict()
    table = Table(title=f"LoCoMo retrieval ({path.name}, "
                        f"{'hybrid' if report.embeddings else 'BM25 only'})")
    for column in ("category", "n", "recall@5", "recall@10", "MRR"):
        table.add_column(column, justify="right" if column != "category" else "left")
    rows: list[tuple[str, dict[str, Any]]] = [
        (f"{c} {bench.CATEGORY_NAMES.get(int(c), '')}", f)
        for c, f in figures["categories"].items()]
    rows += [("1–4", figures["cats_1_4"]), ("1–4 tuning", figures["tuning_1_4"]),
             ("1–4 held out", figures["held_out_1_4"]), ("all", figures["all"])]
    for label, f in rows:
        table.add_row(label, str(f["n"]), f"{f['recall@5']:.3f}", f"{f['recall@10']:.3f}",
                      f"{f['mrr']:.3f}")
    Console().print(table)
    typer.echo(f"median query {figures['median_query_ms']} ms, p99 {figures['p99_query_ms']} ms; "
               f"{figures['messages']} messages ingested in {figures['ingest_s']} s")
    if as_json:
        typer.echo(json.dumps(figures))


@bench_app.command("coding")
def coding(
    data: Annotated[Path | None, typer.Option(
        "--data", help="Coding-session set [default: "
                       "../shared/data/coding-sessions/coding_eval.json].",
    )] = None,
    embeddings: bool = typer.Option(True, "--embeddings/--no-embeddings",
                                    help="Use the offline embedding model (hybrid search)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Retrieval quality on real coding-agent sessions: hit@k (exact and ±2 messages)
    and MRR, against the naive FTS5 baseline computed in the same run."""
    from lore_gateway.bench import coding as bench

    try:
        path = bench.resolve_data_path(data)
    except FileNotFoundError as exc:
        _err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    bar, update = _progress_bar()
    with bar:
        report = bench.run(path, embeddings=embeddings, progress=update)
    figures = report.as_dict()
    table = Table(title=f"coding-session retrieval ({path.name}, "
                        f"{'hybrid' if report.embeddings else 'BM25 only'}; baseline: naive FTS5)")
    for column in ("subset", "n", "gold", "hit@1", "hit@5", "hit@10", "MRR",
                   "baseline hit@10", "baseline MRR"):
        table.add_column(column, justify="left" if column in ("subset", "gold") else "right")
    keys = [*bench.SUBSETS, *sorted(k for k in figures["lore"] if k.startswith("kind:"))]
    for key in keys:
        for gold in ("tol2", "exact"):
            ours, base = figures["lore"][key][gold], figures["baseline"][key][gold]
            table.add_row(key.removeprefix("kind:"), str(ours["n"]),
                          "±2" if gold == "tol2" else "exact",
                          f"{ours['hit@1']:.3f}", f"{ours['hit@5']:.3f}",
                          f"{ours['hit@10']:.3f}", f"{ours['mrr']:.3f}",
                          f"{base['hit@10']:.3f}", f"{base['mrr']:.3f}")
    Console().print(table)
    typer.echo(f"median query {figures['median_query_ms']} ms; {figures['messages']} messages "
               f"ingested in {figures['ingest_s']} s")
    if as_json:
        typer.echo(json.dumps(figures))


@bench_app.command("search")
def search(
    messages: int = typer.Option(100_000, "--messages", min=1000,
                                 help="Synthetic messages to store."),
    queries: int = typer.Option(200, "--queries", min=10, help="Queries per configuration."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Insert throughput, BM25 and hybrid search latency, and database size."""
    from lore_gateway.bench import search as bench

    bar, update = _progress_bar()
    with bar:
        report = bench.run(messages, queries=queries, progress=update)
    figures = report.as_dict()
    typer.echo(f"{figures['messages']} messages inserted in {figures['insert_s']} s "
               f"({figures['insert_msgs_per_s']} msg/s); synthetic vectors in "
               f"{figures['vectors_s']} s; database {figures['db_mb']} MB")
    table = Table(title="search latency (limit 10)")
    for column in ("search", "p50 ms", "p99 ms", "n"):
        table.add_column(column)
    for name, value in figures.items():
        if isinstance(value, dict):
            table.add_row(name, str(value["p50_ms"]), str(value["p99_ms"]), str(value["n"]))
    Console().print(table)
    if as_json:
        typer.echo(json.dumps(figures))
