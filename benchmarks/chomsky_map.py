"""The length-generalization map as measured here (Delétang et al. 2023, "Neural Networks and the Chomsky
Hierarchy"; the `chomsky` preset): `python benchmarks/chomsky_map.py [--full]` runs
`python -m lab preset chomsky [--full] --json` on a fresh run store and writes what it measured into
docs/SCIENCE.md between this script's markers (the quick map and the full map have a block each): the wall
time, the number of runs, the machine and the commit, and the map's table as the preset's explanation draws
it (each cell: accuracy at the longer lengths, mean [min-max] over seeds, beside the paper's number).

    python benchmarks/chomsky_map.py                      # the quick map (24 runs)
    python benchmarks/chomsky_map.py --full               # every row and task, 3 seeds (297 runs)
    python benchmarks/chomsky_map.py --full --max-concurrent 2 --note "nothing else running"
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import write_block  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCIENCE = REPO / "docs" / "SCIENCE.md"


def markers(full: bool) -> tuple[str, str]:
    which = "full" if full else "quick"
    return f"<!-- chomsky_map.py {which} -->", f"<!-- /chomsky_map.py {which} -->"


def map_table(explanation: str) -> str:
    """The preset's explanation as the page shows it: its sentences (quoted), then the map's table (the header row,
    the rule, the rows) and the table's legend; the pointer to the app's panel is left out."""
    lines = explanation.splitlines()
    said = "> " + lines[0].strip() + "\n\n"
    first = next(i for i, line in enumerate(lines) if line.startswith("| Architecture"))
    rows = [line for line in lines[first:] if line.startswith("|")]
    end = first + len(rows)
    legend = next((line for line in lines[end:] if line.strip().startswith("Each cell")), "")
    return said + "\n".join(rows + ([""] + [legend.strip()] if legend else []))


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "lab"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() + (" (lab/ changed since)" if dirty.stdout.strip() else "")


def device() -> str:
    import torch

    return f"on the GPU ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "no GPU"


def block(out: dict, wall_s: float, full: bool, concurrent: int, note: str, at: str) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    command = "python benchmarks/chomsky_map.py" + (" --full" if full else "") + f" --max-concurrent {concurrent}"
    states = {r["state"] for r in out["runs"]}
    head = (f"Measured by `{command}` ({when}, lab at "
            f"{at}, {os.cpu_count()} CPU cores, {platform.machine()}, {device()}): **{len(out['runs'])} runs "
            f"in {wall_s:,.0f} s** ({wall_s / 60:.1f} min), {concurrent} at a time, one thread each; runs "
            f"{', '.join(sorted(states))}. {note}").strip()
    return head + "\n\n" + map_table(out["explanation"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="the whole map (every architecture and task, 3 seeds)")
    ap.add_argument("--max-concurrent", type=int, default=2, help="runs training at once (default 2)")
    ap.add_argument("--note", default="", help="a sentence on the conditions (load), written after the figures")
    ap.add_argument("--out", type=Path, default=SCIENCE, help="the file whose block is written (docs/SCIENCE.md)")
    args = ap.parse_args()
    at = commit()  # the code that runs, read before it runs
    with tempfile.TemporaryDirectory() as runs:
        cmd = [sys.executable, "-m", "lab", "preset", "chomsky", "--json", "--runs-dir", runs,
               "--max-concurrent", str(args.max_concurrent)] + (["--full"] if args.full else [])
        start = time.monotonic()
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"the preset failed ({done.returncode}):\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    write_block(*markers(args.full), block(out, wall, args.full, args.max_concurrent, args.note, at), args.out)
    sys.stderr.write(f"{len(out['runs'])} runs in {wall:.0f} s: written to {args.out}\n")


if __name__ == "__main__":
    main()
