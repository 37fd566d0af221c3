"""How long the README's whole test command takes, by tier: `python benchmarks/test_suite.py` runs
`bash scripts/test.sh` with a JUnit report and writes the wall time, the test count and each tier's summed
test time (setup and teardown included: an app server or a training is set up in its module's first test)
into RESULTS.md, with how busy the machine's cores were and where the CPU went by kind of process (Chromium,
the app servers the tests start, trainings...: every process the command started, sampled from /proc each
second). `--junit FILE --wall SECONDS` records a run made already (a clean clone, say), without the CPU.

The sums add up every pytest-xdist worker, so they exceed the wall time; CI's limit is on the wall. With
every core busy nearly all the time, the wall time is the CPU the tests spend over the cores: a test's waits
cost nothing while another worker computes, and only less CPU makes the suite shorter.
"""
from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procstats import CpuLedger, busy_ticks  # noqa: E402
from results import write_block  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
START, END = "<!-- test_suite.py -->", "<!-- /test_suite.py -->"
TIERS = ("science", "browser", "app", "unit")


def read_report(path: Path) -> tuple[dict[str, float], dict[str, int], dict[str, float], int]:
    """(seconds by tier, tests by tier, seconds by module, failures) from a JUnit report whose test cases
    carry their tier as a property (tests/conftest.py)."""
    seconds, counts, modules, failed = collections.Counter(), collections.Counter(), collections.Counter(), 0
    for case in ET.parse(path).getroot().iter("testcase"):
        tier = next((p.get("value") for p in case.iter("property") if p.get("name") == "tier"), "unit")
        spent = float(case.get("time") or 0)
        seconds[tier] += spent
        counts[tier] += 1
        # classname "tests.test_x", "tests.test_x.TestClass", or with a science test's group suffix
        # "tests.test_x.test_name@tests/test_x.py": the module is the part after "tests."
        parts = case.get("classname", "?").split("@", 1)[0].split(".")
        modules[parts[1] if len(parts) > 1 and parts[0] == "tests" else parts[-1]] += spent
        failed += any(child.tag in ("failure", "error") for child in case)
    return dict(seconds), dict(counts), dict(modules), failed


def workers() -> str:
    """The number of workers scripts/test.sh asks pytest-xdist for (`-n N`)."""
    found = re.search(r"pytest -n (\d+)", (REPO / "scripts" / "test.sh").read_text())
    return found.group(1) if found else "?"


# the kinds of process a test run starts, by a word of their command line (first match)
PYTEST = "pytest and its workers (in-process tests)"
KINDS = (("lab.engine.worker", "the apps' training workers"), ("app.py", "the app servers tests start"),
         ("chrom", "Chromium"), ("playwright", "Chromium"),
         ("multiprocessing", "spawned Python processes (mostly the science tests' training pools)"),
         ("-m lab", "the command line (`python -m lab`)"), ("pip", "pip installs"), ("ray", "Ray"),
         ("ipykernel", "notebooks"), ("jupyter", "notebooks"), ("pytest", PYTEST), ("exec(eval(", PYTEST))


def kind_of(cmd: str) -> str:
    return next((kind for word, kind in KINDS if word in cmd), "other")


def run_sampled(cmd: list[str]) -> tuple[float, CpuLedger, float]:
    """Run `cmd` in the repository, sampling its processes' CPU each second: (wall s, the ledger, the share
    of the machine's cores busy over the run, from /proc/stat: other work on the machine counts too)."""
    busy0, total0 = busy_ticks()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO)
    ledger, done = CpuLedger(proc.pid), threading.Event()

    def watch() -> None:
        while not done.wait(1.0):
            ledger.sample()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    proc.wait()
    done.set()
    watcher.join()
    busy1, total1 = busy_ticks()
    return time.monotonic() - t0, ledger, (busy1 - busy0) / max(1, total1 - total0)


def cpu_table(ledger: CpuLedger, busy: float, wall_s: float) -> str:
    kinds = ledger.by_kind(kind_of)
    spent = sum(s for _, s in kinds.values())
    lines = ["", "", f"The cores were {100 * busy:.0f}% busy over the run. Where the CPU went "
             f"({spent:.0f} s in all, {spent / wall_s:.2f} cores on average; sampled each second, so a little low):", "",
             "| processes | count | CPU s | share |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {n} | {s:.0f} | {100 * s / max(spent, 1e-9):.0f}% |"
              for k, (n, s) in sorted(kinds.items(), key=lambda kv: -kv[1][1])]
    return "\n".join(lines)


def table(wall_s: float, report: Path, note: str) -> str:
    seconds, counts, modules, failed = read_report(report)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## The whole test suite (`python benchmarks/test_suite.py`, {when})", "",
             f"`bash scripts/test.sh`: **{wall_s / 60:.1f} min** wall for {sum(counts.values())} tests "
             f"({failed} failed), on {workers()} pytest-xdist workers. {note}", "",
             "| tier | tests | summed test time (s) |", "|---|---:|---:|"]
    lines += [f"| {t} | {counts.get(t, 0)} | {seconds.get(t, 0.0):.0f} |" for t in TIERS]
    lines += ["", "The ten modules with the most summed time:", "", "| module | s |", "|---|---:|"]
    lines += [f"| {m} | {s:.0f} |" for m, s in sorted(modules.items(), key=lambda kv: -kv[1])[:10]]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--junit", type=Path, help="the JUnit report of a run made already (with --wall)")
    ap.add_argument("--wall", type=float, help="that run's wall time in seconds")
    ap.add_argument("--note", default="", help="the machine and its load, as a sentence")
    args = ap.parse_args()
    cpu = ""
    if args.junit is None:
        report = Path(tempfile.mkdtemp()) / "junit.xml"
        wall, ledger, busy = run_sampled(["bash", "scripts/test.sh", "-q", f"--junitxml={report}"])
        cpu = cpu_table(ledger, busy, wall)
    else:
        report, wall = args.junit, args.wall
        if wall is None:
            ap.error("--junit needs --wall")
    text = table(wall, report, args.note) + cpu
    write_block(START, END, text)
    print(text)


if __name__ == "__main__":
    main()
