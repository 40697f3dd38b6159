"""CPU time and resident memory of a benchmarked server and its child processes,
read from ``/proc`` (Linux), so the figures cover everything a server costs: the
gateway's embedding and search processes count as the gateway's."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class TreeSample:
    """One reading of a process tree: CPU seconds used so far per pid, each pid's
    command name, and the peak and current resident set of the root and of the
    whole tree."""

    root: int
    cpu: dict[int, float]
    names: dict[int, str]
    root_peak: int
    root_rss: int
    tree_peak: int
    tree_rss: int


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of one process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after it.
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def _name(pid: int) -> str:
    """The process's command name (``comm``: the gateway's children set theirs,
    e.g. ``lore-store``), empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _memory(pid: int) -> tuple[int, int]:
    """(VmHWM, VmRSS) in bytes; zeros once the process is gone."""
    values = {"VmHWM": 0, "VmRSS": 0}
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0, 0
    for line in lines:
        name, _, value = line.partition(":")
        if name in values:
            values[name] = int(value.split()[0]) * 1024
    return values["VmHWM"], values["VmRSS"]


def descendants(root: int) -> list[int]:
    """``root`` and every process below it."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                parents.setdefault(stat[0], []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(parents.get(pid, ()))
    return tree


def sample(root: int) -> TreeSample:
    cpu: dict[int, float] = {}
    names: dict[int, str] = {}
    tree_peak = tree_rss = root_peak = root_rss = 0
    for pid in descendants(root):
        stat = _stat(pid)
        if stat is None:
            continue
        cpu[pid] = stat[1]
        names[pid] = _name(pid)
        peak, rss = _memory(pid)
        tree_peak += peak
        tree_rss += rss
        if pid == root:
            root_peak, root_rss = peak, rss
    return TreeSample(root, cpu, names, root_peak, root_rss, tree_peak, tree_rss)


def cpu_between(before: TreeSample, after: TreeSample) -> tuple[float, float]:
    """(CPU seconds of the root, of the whole tree) used between two samples; a
    child started in between counts from zero."""
    root = after.cpu.get(after.root, 0.0) - before.cpu.get(after.root, 0.0)
    total = sum(seconds - before.cpu.get(pid, 0.0) for pid, seconds in after.cpu.items())
    return root, total


def cpu_by_process(before: TreeSample, after: TreeSample) -> dict[str, float]:
    """CPU seconds used between two samples per process of the tree, the root as
    ``main`` and each child by its command name (children of one name summed)."""
    out: dict[str, float] = {}
    for pid, seconds in after.cpu.items():
        name = "main" if pid == after.root else after.names.get(pid) or str(pid)
        out[name] = out.get(name, 0.0) + seconds - before.cpu.get(pid, 0.0)
    return out
