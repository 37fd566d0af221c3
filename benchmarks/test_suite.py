"""How long the README's whole test command takes, by tier: `python benchmarks/test_suite.py` runs
`bash scripts/test.sh` with a JUnit report and writes the wall time, the test count and each tier's summed
test time (setup and teardown included: an app server or a training is set up in its module's first test)
into RESULTS.md. `--junit FILE --wall SECONDS` records a run made already (a clean clone, say).

The sums add up both pytest-xdist workers, so they are about twice the wall time; CI's limit is on the wall.
"""
from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
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


def table(wall_s: float, report: Path, note: str) -> str:
    seconds, counts, modules, failed = read_report(report)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## The whole test suite (`python benchmarks/test_suite.py`, {when})", "",
             f"`bash scripts/test.sh`: **{wall_s / 60:.1f} min** wall for {sum(counts.values())} tests "
             f"({failed} failed), on two pytest-xdist workers. {note}", "",
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
    if args.junit is None:
        report = Path(tempfile.mkdtemp()) / "junit.xml"
        t0 = time.monotonic()
        subprocess.run(["bash", "scripts/test.sh", "-q", f"--junitxml={report}"], cwd=REPO, check=False)
        wall = time.monotonic() - t0
    else:
        report, wall = args.junit, args.wall
        if wall is None:
            ap.error("--junit needs --wall")
    text = table(wall, report, args.note)
    write_block(START, END, text)
    print(text)


if __name__ == "__main__":
    main()
