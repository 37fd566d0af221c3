"""A classroom on one server: N simulated students (gradio_client) start small runs and poll them.

    python benchmarks/classroom_load.py                      # 30 users, up to 5 minutes
    python benchmarks/classroom_load.py --users 10 --minutes 2 --json
    python benchmarks/classroom_load.py --write-results      # also update benchmarks/RESULTS.md

It starts `python app.py` as a subprocess with LAB_PUBLIC=1 (classroom limits, see lab/limits.py)
and its own temporary LAB_RUNS_DIR. Users arrive spread over --ramp-s seconds; each gets an owner
token and its own client, clicks Start once, and then polls its run every second (as the page's
timer does) until the run ends. Every third user is impatient and clicks Start three times in a
row (the third click is over the per-user limit of 2); every tenth also asks for a run far above
the step limit. Reported: errors
(anything but a refusal that names its limit, plus any traceback in the server log), runs finished,
runs refused with a clear message, runs unfinished when time ran out, p50/p95 poll latency, and the
server's peak memory (its process alone, and with any child processes).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "RESULTS.md"
START, END = "<!-- classroom_load:start -->", "<!-- classroom_load:end -->"
SMALL = {"task": "copy", "max_len": 4, "d_model": 32, "n_heads": 2, "n_layers": 2, "steps": 100}
TIMEOUT_S = 60.0
LIMIT_FIELDS = ("runs per user", "queue", "train.steps", "model")  # a clear refusal starts with one


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_rss(root_pid: int) -> tuple[int, int]:
    """(RSS of root_pid, RSS of it and all its descendants) in bytes, from /proc."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
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
        parents[int(entry)] = int(fields[1])
        rss[int(entry)] = pages * os.sysconf("SC_PAGE_SIZE")
    family, grew = {root_pid}, True
    while grew:
        more = {p for p, pp in parents.items() if pp in family} - family
        family |= more
        grew = bool(more)
    return rss.get(root_pid, 0), sum(rss.get(p, 0) for p in family)


class Server:
    """`python app.py` in public mode with a temporary store; samples its memory while it runs."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / "server.log"
        env = dict(os.environ, LAB_PUBLIC="1", LAB_RUNS_DIR=str(folder / "runs"), GRADIO_SERVER_PORT=str(self.port),
                   GRADIO_SERVER_NAME="127.0.0.1", GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "app.py"], cwd=REPO, env=env, stdout=log,
                                         stderr=subprocess.STDOUT)
        self.peak_main = self.peak_tree = 0
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.url + "/", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"app.py did not start:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.5)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._done.is_set():
            main, tree = tree_rss(self.proc.pid)
            self.peak_main, self.peak_tree = max(self.peak_main, main), max(self.peak_tree, tree)
            time.sleep(0.25)

    def stop(self) -> None:
        self._done.set()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


class User(threading.Thread):
    """One student: start (once, or three times if impatient), then poll every run until it ends."""

    def __init__(self, index: int, url: str, deadline: float, poll_s: float, arrive_s: float) -> None:
        super().__init__(name=f"user-{index}", daemon=True)
        self.index, self.url, self.deadline, self.poll_s, self.arrive_s = index, url, deadline, poll_s, arrive_s
        self.stage = "connect"
        self.owner = uuid.uuid4().hex
        self.polls: list[float] = []
        self.starts: list[float] = []
        self.errors: list[str] = []
        self.refused: list[str] = []
        self.outcome: dict[str, str] = {}  # run id -> final state (or "unfinished")

    def start_run(self, client: Any, **knobs: Any) -> str | None:
        from gradio_client.exceptions import AppError

        t0 = time.perf_counter()
        try:
            pick, *_ = client.predict(**{**SMALL, "seed": self.index, **knobs}, my_runs=[], owner=self.owner,
                                      api_name="/start")
        except AppError as exc:
            message = " ".join(str(exc).split())
            (self.refused if message.startswith(LIMIT_FIELDS) else self.errors).append(message)
            return None
        finally:
            self.starts.append(time.perf_counter() - t0)
        return pick["value"]

    def run(self) -> None:
        try:
            from gradio_client import Client

            time.sleep(self.arrive_s)  # students do not all open the page in the same second
            # a browser waits far longer than httpx's 5 s default for a busy server's page
            client = Client(self.url, verbose=False, httpx_kwargs={"timeout": TIMEOUT_S})
            self.stage = "start"
            clicks = 3 if self.index % 3 == 0 else 1
            ids = [self.start_run(client, pos=("learned", "rope", "alibi", "sinusoidal")[self.index % 4])
                   for _ in range(clicks)]
            if self.index % 10 == 0:
                ids.append(self.start_run(client, steps=500_000))  # far above the step limit
            for run_id in ids:
                if run_id:
                    self.outcome[run_id] = "unfinished"
            self.stage = "poll"
            for run_id in [r for r in ids if r]:
                while time.monotonic() < self.deadline:
                    t0 = time.perf_counter()
                    text, _loss, _acc, timer = client.predict(run_id, api_name="/poll")
                    self.polls.append(time.perf_counter() - t0)
                    if not timer["active"]:
                        self.outcome[run_id] = text.split("**")[1].lower() if "**" in text else text
                        break
                    time.sleep(self.poll_s)
        except Exception as exc:  # noqa: BLE001 - every failure is a finding
            self.errors.append(f"{self.stage}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def simulate(users: int, minutes: float, poll_s: float, ramp_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lab-classroom-") as tmp:
        server = Server(Path(tmp))
        try:
            server.wait_ready()
            t0 = time.monotonic()
            crowd = [User(i, server.url, t0 + minutes * 60, poll_s, ramp_s * i / users) for i in range(users)]
            for user in crowd:
                user.start()
            for user in crowd:
                user.join(minutes * 60 + 120)
            wall = time.monotonic() - t0
            log = server.log.read_text(errors="replace")
        finally:
            server.stop()
    polls = [p for u in crowd for p in u.polls]
    states = [s for u in crowd for s in u.outcome.values()]
    errors = [e for u in crowd for e in u.errors] + (["a traceback in the server log"] if "Traceback" in log else [])
    refused = [r for u in crowd for r in u.refused]
    reasons: dict[str, int] = {}
    for message in refused:
        key = next(f for f in LIMIT_FIELDS if message.startswith(f))
        reasons[key] = reasons.get(key, 0) + 1
    return {
        "users": users, "minutes": minutes, "ramp_s": ramp_s, "wall_s": round(wall, 1), "errors": len(errors),
        "error_samples": sorted(set(errors))[:5], "runs_started": len(states),
        "runs_finished": states.count("completed"), "runs_unfinished": states.count("unfinished"),
        "runs_other": len(states) - states.count("completed") - states.count("unfinished"),
        "refused_clear": len(refused), "refused_by": reasons,
        "refusal_sample": refused[0] if refused else "",
        "polls": len(polls), "poll_p50_s": round(statistics.median(polls), 3) if polls else None,
        "poll_p95_s": round(percentile(polls, 0.95), 3), "poll_max_s": round(max(polls), 3) if polls else None,
        "start_p50_s": round(statistics.median([s for u in crowd for s in u.starts]), 3),
        "peak_rss_mib": round(server.peak_main / 2**20, 1), "peak_rss_tree_mib": round(server.peak_tree / 2**20, 1),
        "cpus": os.cpu_count(), "load_avg_1min_at_end": round(os.getloadavg()[0], 1),
    }


def table(r: dict[str, Any]) -> str:
    rows = [
        ("users (arriving over)", f"{r['users']} ({r['ramp_s']:.0f} s)"),
        ("wall time", f"{r['wall_s']} s (limit {r['minutes']} min)"),
        ("errors", r["errors"]), ("runs started", r["runs_started"]), ("runs finished", r["runs_finished"]),
        ("runs unfinished at the time limit", r["runs_unfinished"]), ("runs ended otherwise", r["runs_other"]),
        ("requests refused with a clear message", f"{r['refused_clear']} {r['refused_by']}"),
        ("polls", r["polls"]), ("poll latency p50 / p95 / max", f"{r['poll_p50_s']} / {r['poll_p95_s']} / "
                                                                  f"{r['poll_max_s']} s"),
        ("start latency p50", f"{r['start_p50_s']} s"),
        ("server peak RSS (process / with children)", f"{r['peak_rss_mib']} / {r['peak_rss_tree_mib']} MiB"),
        ("host load average (1 min) at the end", f"{r['load_avg_1min_at_end']} on {r['cpus']} cores"),
    ]
    lines = ["| measure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    if r["refusal_sample"]:
        lines.append(f"\nA refusal reads: *{r['refusal_sample']}*")
    if r["error_samples"]:
        lines.append("\nErrors: " + "; ".join(r["error_samples"]))
    return "\n".join(lines)


def write_results(r: dict[str, Any], path: Path = RESULTS) -> None:
    """Replace this benchmark's marked section of RESULTS.md (other sections are left alone)."""
    section = (f"{START}\n## Classroom load (`python benchmarks/classroom_load.py`)\n\n"
               f"{time.strftime('%Y-%m-%d', time.gmtime())}, {r['cpus']} CPU cores shared with other jobs (timings "
               f"are noisy), LAB_PUBLIC=1 defaults, {SMALL['steps']}-step copy runs.\n\n{table(r)}\n{END}")
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if START in text and END in text:
        text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: section, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=30, help="simulated students (default 30)")
    p.add_argument("--minutes", type=float, default=5.0, help="how long users poll at most (default 5)")
    p.add_argument("--poll-s", type=float, default=1.0, help="seconds between polls (the page's timer: 1)")
    p.add_argument("--ramp-s", type=float, default=20.0, help="users arrive spread over this many seconds")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--write-results", action="store_true", help=f"update the classroom section of {RESULTS.name}")
    args = p.parse_args(argv)
    if args.users < 1 or args.minutes <= 0 or args.poll_s <= 0:
        p.error("--users, --minutes and --poll-s must be positive")
    result = simulate(args.users, args.minutes, args.poll_s, args.ramp_s)
    print(json.dumps(result) if args.json else table(result))
    if args.write_results:
        write_results(result)
    ok = result["errors"] == 0 and result["runs_unfinished"] == 0 and result["runs_other"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
