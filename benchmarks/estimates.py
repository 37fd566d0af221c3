"""Time estimates against click-to-done: every preset and a 2x2 grid, through the real app.

    python benchmarks/estimates.py                          # every preset, then the grid (~10 min here)
    python benchmarks/estimates.py --only hello_sort,grid   # a subset while developing
    python benchmarks/estimates.py --write                  # and replace its block of RESULTS.md

It starts `python app.py` (a temporary LAB_RUNS_DIR, a free port) and waits until its training processes
are warm, as on a server that has been up a while. Then, one item after another: it reads the estimate
the app shows (a preset's card through `/preset_cards`, what opening the Presets tab calls; the grid's
preview through `/grid_preview`), clicks (`/preset_<key>` or `/grid_launch`, what the buttons call), and
measures click-to-done: from just before the click to the last of its runs' `finished_at` in the store.
Each item starts when the previous one is done, so an estimate sees the speed measured on the runs
before it, as a teacher's second click would. Acceptance: every estimate within +-35% of its measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from results import RESULTS, free_port, write_block  # noqa: E402  (benchmarks/results.py)

START, END = "<!-- estimates:start -->", "<!-- estimates:end -->"
GRID = {"axis1": "PE", "values1": "rope, alibi", "axis2": "norm", "values2": "pre, post", "axis3": "", "values3": ""}
GRID_STEPS = 300
TOLERANCE = 0.35
DONE = ("completed", "stopped", "failed", "interrupted")


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def workers(app_pid: int) -> list[int]:
    """Pids of the app's training processes (`python -m lab.engine.worker`)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == app_pid and b"lab.engine.worker" in cmd:
            out.append(int(entry))
    return out


def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total


class App:
    """`python app.py` (or `python ARGV...`) with its own store; `wait()` returns once it answers and its spare
    training processes are idle."""

    def __init__(self, folder: Path, argv: tuple[str, ...] = ("app.py",)) -> None:
        self.port, self.runs = free_port(), folder / "runs"
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, LAB_RUNS_DIR=str(self.runs), GRADIO_SERVER_PORT=str(self.port),
                   GRADIO_SERVER_NAME="127.0.0.1", GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
        self.log = folder / "server.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=log,
                                         stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while not answers(self.url + "/"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"app.py did not start:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.5)
        last = -1
        while True:  # both slots' processes started and done importing torch (their CPU time stops growing)
            pids = workers(self.proc.pid)
            ticks = cpu_ticks(pids)
            if len(pids) >= 2 and ticks == last:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the app's training processes did not start")
            last = ticks
            time.sleep(2.0)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def folders(self) -> set[str]:
        if not self.runs.is_dir():
            return set()
        return {p.name for p in self.runs.iterdir() if p.is_dir() and not p.name.startswith(".")}  # not .locks

    def status(self, run_id: str) -> dict[str, Any]:
        try:
            return json.loads((self.runs / run_id / "status.json").read_text())
        except (OSError, ValueError):
            return {}


def seconds(text: str) -> float:
    """'About 25 s until ...' / 'About 1.5 min ...' -> seconds."""
    m = re.search(r"About ([\d.]+) (s|min|h)\b", text)
    if not m:
        raise ValueError(f"no estimate in {text!r}")
    return float(m.group(1)) * {"s": 1, "min": 60, "h": 3600}[m.group(2)]


def basis(text: str) -> str:
    if "first guess" in text:
        return "first guess"
    m = re.search(r"speed measured on this server (now|over its last \d+ runs?)", text)
    return ("training now" if m.group(1) == "now" else m.group(1).replace("over its ", "")) if m else "?"


def grid_knobs(steps: int) -> dict[str, Any]:
    from ui.knobs import KNOBS

    return {**{k.url_key: k.default() for k in KNOBS}, "steps": steps}


def measure(app: App, client: Any, item: str, timeout: float = 1800.0) -> dict[str, Any]:
    """Read the estimate the app shows for `item`, click it, wait for its runs; the row of the table."""
    from lab.teach.presets.catalog import PRESETS

    if item == "grid":
        knobs = grid_knobs(GRID_STEPS)
        text = client.predict(**knobs, **GRID, api_name="/grid_preview")
    else:
        cards = client.predict("", api_name="/preset_cards")
        text = cards[list(PRESETS).index(item)]
    estimate = seconds(text)
    before = app.folders()
    t_click = time.time()
    if item == "grid":
        client.predict(**knobs, **GRID, my_runs=[], owner="", api_name="/grid_launch")
    else:
        client.predict([], "", api_name=f"/preset_{item}")
    ids = sorted(app.folders() - before)
    deadline = time.monotonic() + timeout
    while True:
        states = [app.status(r) for r in ids]
        if ids and all(s.get("state") in DONE for s in states):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{item}: runs not done after {timeout:.0f} s")
        time.sleep(0.2)
    done = max(datetime.fromisoformat(s["finished_at"]).timestamp() for s in states)
    measured = done - t_click
    failed = [s.get("error") for s in states if s.get("state") != "completed"]
    load = os.getloadavg()[0]
    row = {"item": item, "runs": len(ids), "estimate_s": estimate, "measured_s": measured,
           "ratio": estimate / measured, "basis": basis(text), "text": text.split("⏱ ")[-1], "load": load,
           "failed": failed}
    row["ok"] = abs(row["ratio"] - 1) <= TOLERANCE and not failed
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| item | runs | estimate shown | measured click-to-done | estimate / measured | within ±35% | "
             "speed from | load (1 min) after |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['item']} | {r['runs']} | {r['estimate_s']:.0f} s | {r['measured_s']:.1f} s | "
                     f"{r['ratio']:.2f} | {'yes' if r['ok'] else '**no**'} | {r['basis']} | {r['load']:.1f} |")
    return "\n".join(lines)


def write_results(rows: list[dict[str, Any]], total_s: float, path: Path = RESULTS) -> None:
    import torch

    ok = sum(r["ok"] for r in rows)
    section = ("## Time estimates against click-to-done (`python benchmarks/estimates.py`)\n\n"
               f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPU cores shared with other "
               f"jobs, torch {torch.__version__}; {total_s:.0f} s in all. Every preset (its card's estimate) and a "
               f"2x2 grid of {GRID_STEPS} steps (the grid preview's), one after another through the real app; "
               f"measured from the click to the last run's end in the store. **{ok} of {len(rows)} within ±35%.**\n\n"
               f"{table(rows)}\n\nWhat the app said, in order:\n\n"
               + "\n".join(f"- {r['item']}: {r['text']}" for r in rows))
    write_block(START, END, section, path)


def main(argv: list[str] | None = None) -> int:
    from lab.teach.presets.catalog import PRESETS

    items = list(PRESETS) + ["grid"]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(items)}")
    p.add_argument("--write", action="store_true", help=f"replace this benchmark's block of {RESULTS.name}")
    p.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = p.parse_args(argv)
    chosen = [i.strip() for i in args.only.split(",") if i.strip()] or items
    unknown = [i for i in chosen if i not in items]
    if unknown:
        p.error(f"--only: {', '.join(unknown)} not one of {', '.join(items)}")
    from gradio_client import Client

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the app too when stopped
    t0 = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        app = App(Path(tmp))
        try:
            app.wait()
            client = Client(app.url, verbose=False)
            for item in chosen:
                row = measure(app, client, item)
                rows.append(row)
                print(f"{item:16s} runs {row['runs']:2d}  estimate {row['estimate_s']:6.0f} s  measured "
                      f"{row['measured_s']:6.1f} s  ratio {row['ratio']:.2f}  {'ok' if row['ok'] else 'OFF'}  "
                      f"({row['basis']}; load {row['load']:.1f})", flush=True)
        finally:
            app.stop()
    total = time.monotonic() - t0
    print("\n" + table(rows))
    if args.json:
        print(json.dumps(rows, indent=1))
    if args.write:
        write_results(rows, total)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
