"""``lore bench locomo`` and ``lore bench search``: memory quality and speed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from lore_gateway.cli import output
from lore_gateway.cli.main import bench_app


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
        raise output.UserError(f"{exc}; pass --data <file>") from None
    with output.stages() as update:
        report = bench.run(path, embeddings=embeddings, progress=update)
    figures = report.as_dict()
    rows: list[tuple[str, dict[str, Any]]] = [
        (f"{c} {bench.CATEGORY_NAMES.get(int(c), '')}", f)
        for c, f in figures["categories"].items()]
    rows += [("1–4", figures["cats_1_4"]), ("all", figures["all"])]
    output.print_table(
        [output.Column("category"), *(output.Column(c, "right", False)
                                      for c in ("n", "recall@5", "recall@10", "MRR"))],
        [(label, f["n"], f"{f['recall@5']:.3f}", f"{f['recall@10']:.3f}", f"{f['mrr']:.3f}")
         for label, f in rows],
        title=f"LoCoMo retrieval ({path.name}, "
              f"{'hybrid' if report.embeddings else 'BM25 only'})")
    typer.echo(f"median query {figures['median_query_ms']} ms, p99 {figures['p99_query_ms']} ms; "
               f"{figures['messages']} messages ingested in {figures['ingest_s']} s")
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

    with output.stages() as update:
        report = bench.run(messages, queries=queries, progress=update)
    figures = report.as_dict()
    typer.echo(f"{figures['messages']} messages inserted in {figures['insert_s']} s "
               f"({figures['insert_msgs_per_s']} msg/s); synthetic vectors in "
               f"{figures['vectors_s']} s; database {figures['db_mb']} MB")
    output.print_table(
        [output.Column("search"), *(output.Column(c, "right", False)
                                    for c in ("p50 ms", "p99 ms", "n"))],
        [(name, value["p50_ms"], value["p99_ms"], value["n"])
         for name, value in figures.items() if isinstance(value, dict)],
        title="search latency (limit 10)")
    if as_json:
        typer.echo(json.dumps(figures))
