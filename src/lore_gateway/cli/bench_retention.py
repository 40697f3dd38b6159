"""``lore bench retention``: the key facts a compaction keeps, against same-size baselines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from lore_gateway.cli import output
from lore_gateway.cli.bench_coding import CodingData, NaturalQuestions
from lore_gateway.cli.bench_memory import HYBRID_OPTION, _data_path
from lore_gateway.cli.main import bench_app

MEASURE_LABELS = {
    "first_level": "first-level logs", "distillations": "active distillations",
    "consolidated": "consolidated logs alone",
    "compaction_claude": "compaction: Claude Code",
    "compaction_codex": "compaction: Codex", "after_recall": "compaction + one recall"}
PARTS = ("all", "tuning", "held_out", "position:early", "position:middle", "position:late")


def _segments(value: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(
            "give token counts separated by commas, e.g. 16384,2048") from None
    if not sizes or min(sizes) < 256:
        raise typer.BadParameter("each segment size must be at least 256 tokens")
    return sizes


@bench_app.command("retention")
def retention(
    data: CodingData = None,
    natural: NaturalQuestions = None,
    locomo: Annotated[Path | None, typer.Option(
        "--locomo", help="LoCoMo conversations, each replayed as one long session "
                         "[default: ../shared/data/locomo/locomo10_dev.json; left out "
                         "when absent].",
    )] = None,
    store: Annotated[Path | None, typer.Option(
        "--store", help="Keep the ingested sessions in this directory and reuse them on "
                        "the next run with the same data; distillations are made in a "
                        "copy on every run.",
    )] = None,
    segments: Annotated[str, typer.Option(
        "--segments", help="Distillation segment sizes in tokens, one regime each: the "
                           "worker's token trigger, and small idle-triggered segments "
                           "(many logs, so consolidation runs).",
    )] = "16384,2048",
    embeddings: bool = HYBRID_OPTION,
    detail: bool = typer.Option(False, "--detail", help="Also print the early, middle and "
                                "late natural questions."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Key-fact retention of what a compaction leaves the model, on real coding-agent
    sessions: the first-level and consolidated observation logs, the compaction answer
    to Claude Code and to Codex, and the answer plus one recall; each against the
    same-size baselines (last characters, first and last, user messages plus closing
    assistant texts) of the same run, with compression, tuning and held-out parts."""
    from lore_gateway.bench import retention as bench

    path = _data_path(bench.resolve_data_path, data)
    if natural is not None and not natural.is_file():
        raise output.UserError(f"natural questions not found at {natural}")
    if locomo is not None and not locomo.is_file():
        raise output.UserError(f"LoCoMo data not found at {locomo}")
    with output.stages() as update:
        try:
            report = bench.run(path, natural=natural, locomo_data=locomo, store=store,
                               segments=_segments(segments), embeddings=embeddings,
                               progress=update)
        except ValueError as exc:
            raise output.UserError(str(exc)) from None
    figures = report.as_dict()
    _table(figures, PARTS if detail else PARTS[:3])
    merged = ", ".join(f"{r.removeprefix('segments_')}-token segments: {n} of "
                       f"{figures['sessions']}"
                       for r, n in figures["consolidated_sessions"].items())
    stored = ("store reused" if figures["store_reused"]
              else f"ingested in {figures['ingest_s']:.0f} s")
    typer.echo(f"sessions with a consolidated log: {merged}; {figures['messages']} "
               f"messages in {figures['sessions']} sessions, {stored}")
    if as_json:
        typer.echo(json.dumps(figures))


def _cell(t: dict[str, Any], key: str) -> str:
    value = t.get(key)
    return "-" if value is None else f"{value:.3f}"


def _table(figures: dict[str, Any], parts: tuple[str, ...]) -> None:
    rows = []
    for regime, measures in figures["regimes"].items():
        for measure, sets in measures.items():
            for name in ("coding", "natural", "rule", "locomo"):
                for part in parts:
                    systems = sets.get(name, {}).get(part)
                    if not systems:
                        continue
                    ours = systems["lore"]
                    best = max((systems[b]["kept"] or 0.0) for b in
                               ("last", "first_last", "closing"))
                    rows.append((regime.removeprefix("segments_"), MEASURE_LABELS[measure],
                                 name, part.removeprefix("position:"), ours["n"],
                                 _cell(ours, "kept"), _cell(ours, "complete"),
                                 f"{ours['compression'] or 0:.1f}×",
                                 *(_cell(systems[b], "kept") for b in
                                   ("last", "first_last", "closing")),
                                 f"{(ours['kept'] or 0.0) - best:+.3f}"))
    output.print_table(
        [output.Column("segment", "right", False), output.Column("text"),
         output.Column("set"), output.Column("part", wrap=False),
         output.Column("n", "right", False),
         *(output.Column(c, "right", False) for c in
           ("facts kept", "all facts", "compression", "last", "first+last", "closing",
            "vs best"))],
        rows, title="key-fact retention: lore, and same-size baselines (facts kept)")
