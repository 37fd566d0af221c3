"""What the benchmarks read about processes from /proc: a server's memory and CPU time, the CPU a process
tree spent by kind of process (`CpuLedger`), and the tracebacks in a server's log."""
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


class CpuLedger:
    """The CPU time a process tree spends, by process: `sample()` (every second or so) records each live
    descendant's command line and CPU seconds so far, and `by_kind` sums them by the kind `classify` names.
    A process is counted up to its last sample, so a process that lives less than a sampling interval, or the
    last interval of one that exits, is missed: the sums are a little low."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self.seen: dict[int, tuple[str, float]] = {}  # pid -> (command line, CPU seconds at its last sample)

    def sample(self) -> None:
        for pid in family(self.root_pid):
            cmd, before = self.seen.get(pid) or (_command_line(pid), 0.0)
            self.seen[pid] = (cmd, max(cpu_seconds(pid), before))

    def by_kind(self, classify) -> dict[str, tuple[int, float]]:  # type: ignore[no-untyped-def]
        """kind -> (processes, CPU seconds), for `classify(command line) -> kind`."""
        out: dict[str, tuple[int, float]] = {}
        for cmd, spent in self.seen.values():
            kind = classify(cmd)
            n, total = out.get(kind, (0, 0.0))
            out[kind] = (n + 1, total + spent)
        return out


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def busy_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine since boot, from /proc/stat (idle and iowait are not busy)."""
    with open("/proc/stat") as fh:
        ticks = [int(v) for v in fh.readline().split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


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
