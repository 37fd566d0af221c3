"""What an idle app costs: the CPU an app server and its spare training workers use while no page is open
and no run trains, with the app's queue polling (ui/app.py, `quiet_when_idle`) against Gradio's own.

    python benchmarks/idle_server.py [--seconds 60] [--write-results]

Starts `python app.py` twice on an empty store, one after the other: as it is, and with Gradio's idle
polling (1 ms for events, 10 ms for progress, gradio/queueing.py on Linux) put back. Each waits until the
spare workers are up, then counts CPU seconds over `--seconds` with nobody connected.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from procstats import cpu_seconds, family
from results import free_port, write_block

REPO = Path(__file__).resolve().parents[1]
START, END = "<!-- idle_server:start -->", "<!-- idle_server:end -->"
# the app as it is, and the app with Gradio's idle polling intervals put back before build_demo reads them
AS_IS = "import ui.app as a; a.main()"
GRADIO_DEFAULT = "import ui.app as a; a.IDLE_POLL_S, a.PROGRESS_POLL_S = 0.001, 0.01; a.main()"


def idle_cpu(code: str, seconds: float, warm_s: float) -> tuple[float, float, int]:
    """(server CPU s, its workers' CPU s, workers) over `seconds` once the app has answered and `warm_s` passed."""
    with tempfile.TemporaryDirectory(prefix="lab-idle-") as tmp:
        port = free_port()
        env = dict(os.environ, LAB_RUNS_DIR=str(Path(tmp) / "runs"), GRADIO_SERVER_PORT=str(port),
                   GRADIO_SERVER_NAME="127.0.0.1", GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1")
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(240):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).close()
                    break
                except OSError:
                    time.sleep(0.5)
            else:
                raise SystemExit("the app did not answer within 2 minutes")
            time.sleep(warm_s)  # the spare training workers start a few seconds after the page is up
            pids = sorted(family(proc.pid))
            before = {p: cpu_seconds(p) for p in pids}
            time.sleep(seconds)
            used = {p: cpu_seconds(p) - before[p] for p in pids}
            workers = [p for p in pids if p != proc.pid]
            return used[proc.pid], sum(used[p] for p in workers), len(workers)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long each idle app is watched")
    p.add_argument("--warm", type=float, default=20.0, help="seconds after the first answer before watching")
    p.add_argument("--write-results", action="store_true", help="update this benchmark's block in RESULTS.md")
    args = p.parse_args(argv)
    rows = []
    for name, code in (("the app (20 ms / 100 ms)", AS_IS), ("Gradio's polling (1 ms / 10 ms)", GRADIO_DEFAULT)):
        server, workers, n = idle_cpu(code, args.seconds, args.warm)
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
