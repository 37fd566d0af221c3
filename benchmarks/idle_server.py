"""What an idle app costs: the CPU an app server and its spare training workers use while no page is open
and no run trains, with the app's queue polling (ui/app.py, `quiet_when_idle`) against Gradio's own.

    python benchmarks/idle_server.py [--seconds 60] [--write-results]

Starts `python app.py` twice on an empty store, one after the other: as it is, and with Gradio's idle
polling (1 ms for events, 10 ms for progress, gradio/queueing.py on Linux) put back. Each waits until the
spare workers are up and idle (estimates.py's `App`), then counts CPU seconds over `--seconds` with nobody
connected.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from estimates import App
from procstats import cpu_seconds, family
from results import write_block

START, END = "<!-- idle_server:start -->", "<!-- idle_server:end -->"
# the app as it is, and the app with Gradio's idle polling intervals put back before build_demo reads them
AS_IS = "import ui.app as a; a.main()"
GRADIO_DEFAULT = "import ui.app as a; a.IDLE_POLL_S, a.PROGRESS_POLL_S = 0.001, 0.01; a.main()"


def idle_cpu(code: str, seconds: float) -> tuple[float, float, int]:
    """(server CPU s, its workers' CPU s, workers) over `seconds`, once the app answers and its workers are idle."""
    with tempfile.TemporaryDirectory(prefix="lab-idle-") as tmp:
        app = App(Path(tmp), argv=("-c", code))
        try:
            app.wait()
            pids = sorted(family(app.proc.pid))
            before = {p: cpu_seconds(p) for p in pids}
            time.sleep(seconds)
            used = {p: cpu_seconds(p) - before[p] for p in pids}
            workers = [p for p in pids if p != app.proc.pid]
            return used[app.proc.pid], sum(used[p] for p in workers), len(workers)
        finally:
            app.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long each idle app is watched")
    p.add_argument("--write-results", action="store_true", help="update this benchmark's block in RESULTS.md")
    args = p.parse_args(argv)
    rows = []
    for name, code in (("the app (20 ms / 100 ms)", AS_IS), ("Gradio's polling (1 ms / 10 ms)", GRADIO_DEFAULT)):
        server, workers, n = idle_cpu(code, args.seconds)
        rows.append(f"| {name} | {100 * server / args.seconds:.1f}% | {100 * workers / args.seconds:.1f}% ({n}) |")
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = "\n".join([
        f"## An idle app's CPU (`python benchmarks/idle_server.py`, {when})", "",
        f"No page open, no run: CPU used over {args.seconds:.0f} s, as a share of one core, on this "
        f"{os.cpu_count()}-core machine (load average at the end {os.getloadavg()[0]:.1f}).", "",
        "| queue polling while idle | app server | spare training workers (count) |", "|---|---:|---:|", *rows])
    print(body)
    if args.write_results:
        write_block(START, END, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
