"""``lore bench coding``: the coding-session sets, against the naive baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from lore_gateway.cli import output
from lore_gateway.cli.bench_memory import HYBRID_OPTION, RERANK_OPTION, _data_path
from lore_gateway.cli.main import bench_app

# The figures of the main table: (column, key in a subset's figures).
MAIN_FIGURES = (("hit@10 ±2", "hit@10"), ("exact@10", "exact@10"), ("MRR", "mrr"),
                ("all facts", "kf_all@10"), ("facts", "kf_frac@10"))
SCOPE_LABELS = {"session": "session", "all": "all",
                "multi_project": "all, from its project"}
PARTS = ("all", "tuning", "held_out")
# The coding-session set and its natural questions (every bench that reads them).
CodingData = Annotated[Path | None, typer.Option(
    "--data", help="Coding-session set [default: "
                   "../shared/data/coding-sessions/coding_eval.json].")]
NaturalQuestions = Annotated[Path | None, typer.Option(
    "--natural", help="Natural questions [default: natural_questions.json beside --data; "
                      "left out when absent].")]


@bench_app.command("coding")
def coding(
    data: CodingData = None,
    natural: NaturalQuestions = None,
    store: Annotated[Path | None, typer.Option(
        "--store", help="Keep the ingested memory in this directory and reuse it on "
                        "the next run with the same data (a ranking change is then "
                        "measured in a minute or two; a change to what is stored or "
                        "indexed needs a new directory).",
    )] = None,
    embeddings: bool = HYBRID_OPTION,
    rerank: bool = RERANK_OPTION,
    noise: bool = typer.Option(True, "--noise/--no-noise", help="Store the noise rows "
                               "(recall traffic, title calls) beside the sessions; "
                               "--no-noise stores the sessions alone, as before issue 33."),
    detail: bool = typer.Option(False, "--detail", help="Also print the figures by "
                                "question kind and position."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Retrieval quality on real coding-agent sessions, for the rule-made and the natural
    questions: hit@10 (±2 of any gold message), exact@10, MRR and key facts in the top
    10, in the question's session, in all sessions and from the question's project,
    with tuning and held-out parts; against the naive FTS5 baseline of the same run;
    and the noise (duplicates, side channels, recall traffic) in every top 10."""
    from lore_gateway.bench import coding as bench

    path = _data_path(bench.resolve_data_path, data)
    if natural is not None and not natural.is_file():
        raise output.UserError(f"natural questions not found at {natural}")
    with output.stages() as update:
        try:
            report = bench.run(path, natural=natural, embeddings=embeddings, rerank=rerank,
                               store=store, noise=noise, progress=update)
        except ValueError as exc:
            raise output.UserError(str(exc)) from None
    figures = report.as_dict()
    mode = f"{'hybrid' if report.embeddings else 'BM25 only'}" + (
        ", reranked" if report.rerank else "")
    _main_table(figures, mode, PARTS)
    if detail:
        _main_table(figures, mode, None)
    _noise_table(figures)
    _legacy_table(figures, mode)
    timing = ", ".join(f"{SCOPE_LABELS[m]} {ms} ms"
                       for m, ms in figures["median_query_ms_by_mode"].items())
    stored = ("store reused" if figures["store_reused"]
              else f"ingested in {figures['ingest_s']} s")
    typer.echo(f"median query: {timing}; {figures['messages']} messages "
               f"({figures['stored_rows']} rows with the noise), {stored}")
    if as_json:
        typer.echo(json.dumps(figures))


def _cell(ours: dict[str, Any], theirs: dict[str, Any], diff: dict[str, Any], key: str) -> str:
    return f"{ours[key]:.3f} / {theirs[key]:.3f} ({diff[key]:+.3f})"


def _main_table(figures: dict[str, Any], mode: str, parts: tuple[str, ...] | None) -> None:
    """One row per set, scope and part (``parts`` None: by kind and position)."""
    rows = []
    for name, per_mode in figures["sets"].items():
        for scope, figs in per_mode.items():
            keys = parts or tuple(k for k in figs["lore"] if k not in PARTS)
            for key in keys:
                ours, theirs, diff = figs["lore"][key], figs["naive"][key], figs["diff"][key]
                rows.append((name, SCOPE_LABELS[scope], key.replace("_", "-"), ours["n"],
                             *(_cell(ours, theirs, diff, k) for _, k in MAIN_FIGURES)))
    output.print_table(
        [output.Column("set"), output.Column("scope"), output.Column("part", wrap=False),
         output.Column("n", "right", False),
         *(output.Column(c, "right", False) for c, _ in MAIN_FIGURES)],
        rows, title=f"coding-session retrieval ({mode}): lore / naive FTS5 (difference)")


def _noise_table(figures: dict[str, Any]) -> None:
    rows = [(system, SCOPE_LABELS[scope], n["top10s"], n["duplicates"], n["side_channels"],
             n["recall_traffic"], n["top10s_with_noise"])
            for system, per_scope in figures["noise"].items()
            for scope, n in per_scope.items()]
    output.print_table(
        [output.Column("system"), output.Column("scope"),
         *(output.Column(c, "right", False) for c in
           ("top 10s", "duplicates", "side channels", "recall traffic", "top 10s with noise"))],
        rows, title="noise in the top 10s (both sets)")


def _legacy_table(figures: dict[str, Any], mode: str) -> None:
    """The rule set's figures as cited before issue 33: scope session, the exact
    ``message_index`` and ±2 of it, against the stopword-keeping baseline."""
    rows = [(key, ours[gold]["n"], "±2" if gold == "tol2" else "exact",
             *(f"{ours[gold][k]:.3f}" for k in ("hit@1", "hit@5", "hit@10", "mrr")),
             f"{base[gold]['hit@10']:.3f}", f"{base[gold]['mrr']:.3f}")
            for key in PARTS for gold in ("tol2", "exact")
            for ours, base in ((figures["lore"][key], figures["baseline"][key]),)]
    output.print_table(
        [output.Column("subset"), output.Column("n", "right", False),
         output.Column("gold", wrap=False),
         *(output.Column(c, "right", False) for c in
           ("hit@1", "hit@5", "hit@10", "MRR", "baseline hit@10", "baseline MRR"))],
        rows, title=f"rule-made set as cited before issue 33 ({mode}; scope session, "
                    "message_index gold; baseline: naive FTS5, stopwords kept)")
