"""A classroom on one server: N simulated students (gradio_client) start small runs and poll them.

    python benchmarks/classroom_load.py                      # 30 users, up to 5 minutes
    python benchmarks/classroom_load.py --users 10 --minutes 2 --json
    python benchmarks/classroom_load.py --write-results      # also update benchmarks/RESULTS.md
    python benchmarks/classroom_load.py --light              # polls over plain HTTP, as a browser
    python benchmarks/classroom_load.py --preset induction --before   # a class clicks one preset (classroom_preset.py)

It starts `python app.py` with LAB_PUBLIC=1 (lab/engine/limits.py) and a temporary LAB_RUNS_DIR. Users
arrive over --ramp-s seconds; each clicks Start (every third three times: the same knobs, so the run already started, not a new one;
every tenth also asks for steps far above the limit), then polls each run at the interval the page's
timer gets (at least --poll-s) until it ends, waiting up to DRAIN_S after the class time. Reported: errors (anything but a refusal naming its
limit, and any traceback in the server log; "Queue is full" counted apart), runs finished, refused,
unfinished; poll latency; the app process's CPU share (its own threads, not its workers); training
ms/step (each completed run's wall_s / steps); peak memory; the server's "Running on" line.
"""
from __future__ import annotations

import argparse
import json
import os
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from light_client import LightClient, queued_endpoints  # noqa: E402
from procstats import cpu_seconds, server_tracebacks, tree_rss  # noqa: E402
from results import RESULTS, free_port, write_block  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
START, END = "<!-- classroom_load:start -->", "<!-- classroom_load:end -->"
PRESET_START, PRESET_END = "<!-- classroom_preset:start -->", "<!-- classroom_preset:end -->"
SMALL = {"task": "copy", "max_len": 4, "d_model": 32, "n_heads": 2, "n_layers": 2, "steps": 100}
TIMEOUT_S = 60.0
DRAIN_S = 120.0  # after the class time, users keep polling their unfinished runs this long
LIMIT_FIELDS = ("Runs per user", "Queue", "Steps", "Model size")  # a clear refusal names one (its UI label)
QUEUE_FULL = "Queue is full"  # Gradio's refusal when its queue holds max_size waiting events
SHARED = "🔁"  # Start's note when the same knobs again watch the run already there (lab/engine/sharing.py)


class Server:
    """`python app.py` in public mode with a temporary store; samples its memory while it runs. `env`
    adds to (or, with None values, removes from) the environment; `python` and `repo` say which
    interpreter runs which checkout (the Space rehearsal: a venv, an older commit)."""

    def __init__(self, folder: Path, env: dict[str, str | None] | None = None, python: str = sys.executable,
                 repo: Path = REPO) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / "server.log"
        self.runs = folder / "runs"
        full = dict(os.environ, LAB_PUBLIC="1", LAB_RUNS_DIR=str(self.runs), GRADIO_SERVER_PORT=str(self.port),
                    GRADIO_SERVER_NAME="127.0.0.1", GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
        for key, value in (env or {}).items():
            full.pop(key, None) if value is None else full.__setitem__(key, value)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([python, "app.py"], cwd=repo, env=full, stdout=log, stderr=subprocess.STDOUT)
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

    def ms_per_step(self) -> list[float]:
        """Each completed run's training time per step (its summary's wall_s / steps), in ms."""
        out = []
        for path in self.runs.glob("*/summary.json"):
            try:
                summary = json.loads(path.read_text())
                out.append(1000 * float(summary["wall_s"]) / int(summary["steps"]))
            except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
                continue
        return out

    def stop(self) -> None:
        self._done.set()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def refusal(message: str) -> str | None:
    """The limit a refusal names ("Runs per user", "Steps", ...), or None for anything else. Start's note
    reads '⚠️ **Label**: what is wrong'; an older server raised 'label: ...'."""
    text = " ".join(str(message).replace("⚠️", "").split()).lstrip("* ")
    return next((f for f in LIMIT_FIELDS if text.lower().startswith(f.lower())), None)


class User(threading.Thread):
    """One student: start (once, or three times if impatient), then poll every run until it ends, at the
    interval the page's timer is given (at least `poll_s`)."""

    def __init__(self, index: int, url: str, deadline: float, poll_s: float, arrive_s: float,
                 light: dict[str, bool] | None = None) -> None:
        super().__init__(name=f"user-{index}", daemon=True)
        self.index, self.url, self.deadline, self.poll_s, self.arrive_s = index, url, deadline, poll_s, arrive_s
        self.light = light  # the endpoints' queue flags: poll over plain HTTP (LightClient)
        self.stage = "connect"
        self.owner = uuid.uuid4().hex
        self.polls: list[float] = []
        self.starts: list[float] = []
        self.errors: list[str] = []
        self.refused: list[str] = []
        self.outcome: dict[str, str] = {}  # run id -> final state (or "unfinished")
        self.bytes = 0

    def start_run(self, client: Any, **knobs: Any) -> str | None:
        from gradio_client.exceptions import AppError

        t0 = time.perf_counter()
        try:
            pick, *_, note = client.predict(**{**SMALL, "seed": self.index, **knobs}, my_runs=[], owner=self.owner,
                                            api_name="/start")
        except AppError as exc:
            pick, note = None, " ".join(str(exc).split())
            if not refusal(note):
                self.errors.append(note)
                return None
        finally:
            self.starts.append(time.perf_counter() - t0)
        if note and not str(note).startswith(SHARED):
            (self.refused if refusal(note) else self.errors).append(" ".join(str(note).split()))
            return None
        return pick["value"] if isinstance(pick, dict) else pick

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
            light = LightClient(self.url, self.light, TIMEOUT_S) if self.light is not None else None
            for run_id in [r for r in ids if r]:
                # after the class time a student still waits for a run already started (up to DRAIN_S):
                # what counts is that every run finishes, not that a loaded machine finishes it in time
                while time.monotonic() < self.deadline + DRAIN_S:
                    t0 = time.perf_counter()
                    out = light.call("poll", run_id) if light else client.predict(run_id, api_name="/poll")
                    self.polls.append(time.perf_counter() - t0)
                    timer = next((o for o in reversed(out) if isinstance(o, dict) and "active" in o), {})
                    text = out[0]
                    if not timer.get("active", True):
                        self.outcome[run_id] = text.split("**")[1].lower() if "**" in text else text
                        break
                    time.sleep(max(self.poll_s, float(timer.get("value") or 0)))
            self.bytes = light.bytes_received if light else 0
        except Exception as exc:  # noqa: BLE001 - every failure is a finding
            self.errors.append(f"{self.stage}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def simulate(users: int, minutes: float, poll_s: float, ramp_s: float, light: bool = False,
             env: dict[str, str | None] | None = None, python: str = sys.executable,
             repo: Path = REPO) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lab-classroom-") as tmp:
        server = Server(Path(tmp), env, python, repo)
        try:
            server.wait_ready()
            flags = queued_endpoints(server.url) if light else None
            t0, cpu0 = time.monotonic(), cpu_seconds(server.proc.pid)
            crowd = [User(i, server.url, t0 + minutes * 60, poll_s, ramp_s * i / users, flags) for i in range(users)]
            for user in crowd:
                user.start()
            for user in crowd:
                user.join(minutes * 60 + DRAIN_S + 120)
            wall, cpu = time.monotonic() - t0, cpu_seconds(server.proc.pid) - cpu0
            log = server.log.read_text(errors="replace")
            steps_ms = server.ms_per_step()
        finally:
            server.stop()
    polls = [p for u in crowd for p in u.polls]
    states = [s for u in crowd for s in u.outcome.values()]
    ignored, tracebacks = server_tracebacks(log)
    errors = [e for u in crowd for e in u.errors] + [f"a traceback in the server log: {t}" for t in tracebacks]
    refused = [r for u in crowd for r in u.refused]
    reasons: dict[str, int] = {}
    for message in refused:
        key = refusal(message) or "?"
        reasons[key] = reasons.get(key, 0) + 1
    running_on = next((line.split("Running on ", 1)[1] for line in log.splitlines()
                       if line.startswith("Running on ") and "http" not in line), "")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {
        "users": users, "minutes": minutes, "ramp_s": ramp_s, "client": "light" if light else "gradio_client",
        "wall_s": round(wall, 1), "errors": len(errors), "queue_full": sum(QUEUE_FULL in e for e in errors),
        "error_samples": sorted(set(errors))[:5], "runs_started": len(states),
        "runs_finished": states.count("completed"), "runs_unfinished": states.count("unfinished"),
        "runs_other": len(states) - states.count("completed") - states.count("unfinished"),
        "refused_clear": len(refused), "refused_by": reasons,
        "refusal_sample": refused[0] if refused else "",
        "polls": len(polls), "poll_p50_s": round(statistics.median(polls), 3) if polls else None,
        "poll_p95_s": round(percentile(polls, 0.95), 3), "poll_max_s": round(max(polls), 3) if polls else None,
        "poll_kib": round(sum(u.bytes for u in crowd) / max(len(polls), 1) / 1024, 2) if light else None,
        "start_p50_s": round(statistics.median([s for u in crowd for s in u.starts]), 3),
        "app_cpu_share": round(cpu / (wall * cpus), 3), "ms_per_step_p50": round(statistics.median(steps_ms), 1)
        if steps_ms else None, "environment": running_on,
        "peak_rss_mib": round(server.peak_main / 2**20, 1), "peak_rss_tree_mib": round(server.peak_tree / 2**20, 1),
        "cpus": cpus, "load_avg_1min_at_end": round(os.getloadavg()[0], 1),
        "log_ignored_exceptions": len(ignored), "log_ignored_sample": ignored[0] if ignored else "",
    }


def table(r: dict[str, Any]) -> str:
    rows = [
        ("users (arriving over), poll client", f"{r['users']} ({r['ramp_s']:.0f} s), {r['client']}"),
        ("wall time", f"{r['wall_s']} s (limit {r['minutes']} min)"),
        ("errors (of them \"Queue is full\")", f"{r['errors']} ({r['queue_full']})"),
        ("runs started / finished", f"{r['runs_started']} / {r['runs_finished']}"),
        ("runs unfinished at the time limit / ended otherwise", f"{r['runs_unfinished']} / {r['runs_other']}"),
        ("requests refused with a clear message", f"{r['refused_clear']} {r['refused_by']}"),
        ("polls", r["polls"]), ("poll latency p50 / p95 / max", f"{r['poll_p50_s']} / {r['poll_p95_s']} / "
                                                                  f"{r['poll_max_s']} s"),
        ("bytes received per poll", f"{r['poll_kib']} KiB" if r["poll_kib"] is not None else "not counted"),
        ("start latency p50", f"{r['start_p50_s']} s"),
        ("app process CPU (share of the machine)", f"{100 * r['app_cpu_share']:.0f}%"),
        ("training ms/step (median over runs)", r["ms_per_step_p50"]),
        ("server peak RSS (process / with children)", f"{r['peak_rss_mib']} / {r['peak_rss_tree_mib']} MiB"),
        ("host load average (1 min) at the end", f"{r['load_avg_1min_at_end']} on {r['cpus']} cores"),
    ] + ([("server's environment line", r["environment"])] if r["environment"] else []) + (
        [("server log: exceptions Python ignored", f"{r['log_ignored_exceptions']} {r['log_ignored_sample']}")]
        if r["log_ignored_exceptions"] else [])
    lines = ["| measure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    if r["refusal_sample"]:
        lines.append(f"\nA refusal reads: *{r['refusal_sample']}*")
    if r["error_samples"]:
        lines.append("\nErrors: " + "; ".join(r["error_samples"]))
    return "\n".join(lines)


def write_results(r: dict[str, Any], path: Path = RESULTS) -> None:
    """Replace this benchmark's marked section of RESULTS.md (other sections are left alone)."""
    section = ("## Classroom load (`python benchmarks/classroom_load.py`)\n\n"
               f"{time.strftime('%Y-%m-%d', time.gmtime())}, {r['cpus']} CPU cores shared with other jobs (timings "
               f"are noisy), LAB_PUBLIC=1 defaults, {SMALL['steps']}-step copy runs, polls by {r['client']}.\n\n{table(r)}")
    write_block(START, END, section, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=30, help="simulated students (default 30)")
    p.add_argument("--minutes", type=float, default=5.0, help="how long users poll at most (default 5)")
    p.add_argument("--poll-s", type=float, default=1.0, help="seconds between polls (the page's timer: 1)")
    p.add_argument("--ramp-s", type=float, default=20.0, help="users arrive spread over this many seconds")
    p.add_argument("--light", action="store_true", help="poll over plain HTTP (benchmarks/light_client.py)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--write-results", action="store_true", help=f"update the classroom section of {RESULTS.name}")
    p.add_argument("--preset", metavar="KEY", help="the class clicks this preset instead (benchmarks/classroom_preset.py)")
    p.add_argument("--before", action="store_true", help="with --preset: also the class with run sharing off")
    args = p.parse_args(argv)
    if args.users < 1 or args.minutes <= 0 or args.poll_s <= 0:
        p.error("--users, --minutes and --poll-s must be positive")
    if args.preset:
        return preset_main(args)
    result = simulate(args.users, args.minutes, args.poll_s, args.ramp_s, args.light)
    print(json.dumps(result) if args.json else table(result))
    if args.write_results:
        write_results(result)
    ok = result["errors"] == 0 and result["runs_unfinished"] == 0 and result["runs_other"] == 0
    return 0 if ok else 1


def preset_main(args: argparse.Namespace) -> int:
    """--preset: N students click one preset (one student alone, the class with sharing on, and off)."""
    from classroom_preset import preset_class, preset_table

    result = preset_class(args.users, args.preset, args.ramp_s, args.before, args.minutes * 60 + DRAIN_S)
    print(json.dumps(result) if args.json else preset_table(result))
    if args.write_results:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        write_block(PRESET_START, PRESET_END, (
            f"## A class clicks one preset (`python benchmarks/classroom_load.py --preset {args.preset} --before`)\n\n"
            f"{time.strftime('%Y-%m-%d', time.gmtime())}, {cpus} CPU cores, LAB_PUBLIC=1 defaults. {args.users} "
            f"students open the page over {args.ramp_s:.0f} s and click the {args.preset} preset, then poll as the "
            "page does (its line and its cards every 2 s) until the line shows the explanation; one student alone "
            "on an idle server, in the same benchmark run, is the yardstick.\n\n" + preset_table(result)))
    after = result["after"]
    return 0 if after["refused"] == 0 and after["errors"] == 0 and after["unanswered"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
