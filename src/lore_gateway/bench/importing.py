"""``lore bench import``: how fast ``lore import claude-code`` stores and embeds history.

The coding set (``../shared/data/coding-sessions/coding_eval.json``: 30 real
coding-agent sessions, 3,482 messages) is written out as Claude Code
transcripts, one file per session, then imported file by file into a fresh
memory with embeddings on, exactly as ``lore import`` does it. A file's time
runs until its messages are written *and* embedded.
"""

from __future__ import annotations

import json
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lore_gateway.bench.ingest import find_data
from lore_gateway.config import Settings
from lore_gateway.memory.importers import claude_code, import_files
from lore_gateway.memory.service import Memory

DEFAULT_DATA = Path("../shared/data/coding-sessions/coding_eval.json")
PROJECT = "/work/bench-project"


@dataclass(frozen=True, slots=True)
class SessionTiming:
    session: str
    messages: int
    seconds: float


@dataclass(frozen=True, slots=True)
class ImportReport:
    sessions: list[SessionTiming]
    embeddings: bool
    # CPU seconds of this process and the embedding process together: wall time
    # depends on what else the machine runs (the embedder is at nice 19), this not.
    cpu_s: float

    def as_dict(self) -> dict[str, Any]:
        total = sum(s.seconds for s in self.sessions)
        messages = sum(s.messages for s in self.sessions)
        worst = max(self.sessions, key=lambda s: s.seconds)
        rates = [s.messages / s.seconds for s in self.sessions if s.seconds > 0]
        return {
            "sessions": len(self.sessions), "messages": messages,
            "total_s": round(total, 2),
            "messages_per_s": round(messages / total, 1) if total else None,
            "median_session_messages_per_s": round(statistics.median(rates), 1),
            "cpu_s": round(self.cpu_s, 1),
            "messages_per_cpu_s": round(messages / self.cpu_s, 1) if self.cpu_s else None,
            "slowest_session": {"session": worst.session, "messages": worst.messages,
                                "seconds": round(worst.seconds, 2)},
            "embeddings": self.embeddings,
        }


def resolve_data_path(path: Path | None) -> Path:
    return find_data(path, DEFAULT_DATA, "coding sessions")


def write_transcripts(data: Path, out: Path) -> list[Path]:
    """Each session of the coding set as a Claude Code transcript under ``out``.

    The task and the harness's nudges are user lines, replies assistant lines with
    one text block, shell output a user line holding a ``tool_result``: each
    message of the set becomes one stored message.
    """
    sessions = json.loads(data.read_text(encoding="utf-8"))["sessions"]
    folder = out / PROJECT.replace("/", "-")
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for session in sessions:
        sid = str(session["session_id"])
        path = folder / f"{sid}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for n, message in enumerate(session["messages"]):
                role, text = message["role"], message["content"]
                stamp = f"2026-01-01T00:{n // 60 % 60:02d}:{n % 60:02d}.000Z"
                if role == "assistant":
                    event: dict[str, Any] = {"type": "assistant", "message": {
                        "role": "assistant", "model": "bench",
                        "content": [{"type": "text", "text": text}]}}
                elif role == "tool":
                    event = {"type": "user", "message": {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "bash", "content": text}]}}
                else:
                    event = {"type": "user", "message": {"role": "user", "content": text}}
                event |= {"sessionId": sid, "cwd": PROJECT, "timestamp": stamp,
                          "uuid": f"{sid}-{n}"}
                f.write(json.dumps(event, ensure_ascii=False) + "\n")
        paths.append(path)
    return paths


def run(data: Path, *, embeddings: bool = True,
        progress: Callable[[str, int, int], None] | None = None) -> ImportReport:
    cpu_before = _cpu_seconds()
    with tempfile.TemporaryDirectory(prefix="lore-bench-import-") as tmp:
        files = write_transcripts(data, Path(tmp) / "projects")
        memory = Memory.open(Settings(data_dir=Path(tmp) / "data", embeddings=embeddings),
                             embedder="auto")
        timings = []
        try:
            for i, path in enumerate(files):
                started = time.perf_counter()
                stats = import_files(memory, [path], claude_code.parse, tenant="personal")
                timings.append(SessionTiming(path.stem, stats.messages_read,
                                             time.perf_counter() - started))
                if progress is not None:
                    progress("importing sessions", i + 1, len(files))
            used = memory.embeddings
        finally:
            memory.close()  # joins the embedding process: its CPU time is counted now
    return ImportReport(timings, used, _cpu_seconds() - cpu_before)


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
