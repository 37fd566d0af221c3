"""What the load test reads about the server's process: its memory and CPU time from /proc, and the
tracebacks in its log."""
from __future__ import annotations

import os


def _stats() -> dict[int, tuple[int, int]]:
    """Every live process: pid -> (parent pid, RSS in bytes), from /proc."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/statm", "rb") as fh:
                pages = int(fh.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        found[int(entry)] = (int(fields[1]), pages * os.sysconf("SC_PAGE_SIZE"))
    return found


def family(root_pid: int, stats: dict[int, tuple[int, int]] | None = None) -> set[int]:
    """root_pid and all its live descendants."""
    stats = _stats() if stats is None else stats
    found, grew = {root_pid}, True
    while grew:
        more = {p for p, (pp, _) in stats.items() if pp in found} - found
        found |= more
        grew = bool(more)
    return found


def tree_rss(root_pid: int) -> tuple[int, int]:
    """(RSS of root_pid, RSS of it and all its descendants) in bytes, from /proc."""
    stats = _stats()
    rss = {p: r for p, (_, r) in stats.items()}
    return rss.get(root_pid, 0), sum(rss.get(p, 0) for p in family(root_pid, stats))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used (its own threads, not its children)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def server_tracebacks(log: str) -> tuple[list[str], list[str]]:
    """The exception lines of the server log's tracebacks: (those Python only reports as ignored, the rest).
    On a Space, Gradio's start-up drops event loops it made (gradio.utils.safe_get_lock) whose __del__
    then fails: "Exception ignored in: <function BaseEventLoop.__del__ ...>", no request affected."""
    parts = log.split("Traceback (most recent call last):")
    ignored, errors = [], []
    for before, block in zip(parts, parts[1:]):
        line = next((x for x in block.splitlines() if x.strip() and not x.startswith(" ")), "?")
        (ignored if "Exception ignored in" in before[-300:] else errors).append(line)
    return ignored, errors
