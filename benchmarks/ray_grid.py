"""The same 16-run grid of small runs trained on this machine's 2 cores, locally and through a local Ray
cluster (issue 16's acceptance): the wall time of each, and Ray's overhead per run.

    python benchmarks/ray_grid.py              # 2 rounds (~4 min here)
    python benchmarks/ray_grid.py --write      # and replace its block of benchmarks/RESULTS.md
    python benchmarks/ray_grid.py --rounds 3 --json

What is timed: `python -m lab sweep --grid "pos=rope,alibi,learned,sinusoidal seed=0..3"` (16 runs of the
copy task, 1 layer, d_model 32, 300 steps) as a user types it, from the command to its exit:
    local   --max-concurrent 2: two worker processes on this machine, one torch thread each
    ray     --ray ADDRESS: each run a Ray task, on a two-node cluster started on this machine (one CPU per
            node, as docs/guide.md's command starts it; started once, before the rounds, its start timed apart)
Both train two runs at a time with one thread each, so the difference is Ray's: connecting, shipping the
`lab` package, scheduling a task per run, a worker process per task, streaming every record back to the
driver. Rounds alternate local and Ray so both share the moment's load; the table gives each round and the
medians. Ray's overhead per run = (Ray wall - local wall) x 2 slots / 16 runs. The runs' own training time
(the sum of their summaries' wall_s) is given beside, and the two sweeps' final losses are checked equal.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.results import write_block  # noqa: E402
from tests.ray_cluster import start_cluster  # noqa: E402

GRID = "pos=rope,alibi,learned,sinusoidal seed=0..3"
FLAGS = ["--task", "copy", "--max-len", "4", "--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--steps", "300"]
START, END = "<!-- ray_grid:start -->", "<!-- ray_grid:end -->"


def sweep(runs_dir: Path, *extra: str) -> tuple[float, dict]:
    """(seconds from the command to its exit, its JSON)."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "lab", "sweep", "--grid", GRID, *FLAGS, "--runs-dir", str(runs_dir),
                          "--json", *extra], cwd=REPO, capture_output=True, text=True, timeout=1800,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"sweep failed: {out.stderr[-2000:]}")
    return wall, json.loads(out.stdout)


def losses(result: dict) -> dict[str, float]:
    return {r["name"]: r["eval"]["loss"] for r in result["runs"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--write", action="store_true", help="replace this benchmark's block of RESULTS.md")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    cluster = start_cluster()
    cluster_s = time.perf_counter() - t0
    rows = []
    try:
        with TemporaryDirectory() as tmp:
            for i in range(args.rounds):
                local_s, local = sweep(Path(tmp) / f"local{i}", "--max-concurrent", "2")
                ray_s, ray = sweep(Path(tmp) / f"ray{i}", "--ray", cluster.address)
                if losses(local) != losses(ray):
                    raise SystemExit("the Ray sweep's final losses differ from the local sweep's")
                train = [sum(r["wall_s"] for r in res["runs"]) for res in (local, ray)]
                rows.append({"round": i + 1, "local_s": local_s, "ray_s": ray_s, "local_train_s": train[0],
                             "ray_train_s": train[1], "overhead_per_run_s": (ray_s - local_s) * 2 / 16})
                print(f"round {i + 1}: local {local_s:.1f} s, Ray {ray_s:.1f} s", file=sys.stderr)
    finally:
        cluster.stop()
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "round"}
    report = {"rows": rows, "median": med, "cluster_start_s": cluster_s, "load_at_start": load}
    lines = [f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average at "
             f"start {load:.1f} (shared: ratios are paired within this run)",
             f"- grid: `{GRID}` = 16 runs, {' '.join(FLAGS)}; two at a time, one thread each, both ways",
             f"- Ray cluster: two nodes of one CPU on this machine, started in {cluster_s:.1f} s (not in the times)",
             "", "| round | local s | Ray s | Ray / local | Ray overhead per run s | runs' own training s (local / Ray) |",
             "|---|---|---|---|---|---|"]
    for r in rows + [dict(med, round="median")]:
        lines.append(f"| {r['round']} | {r['local_s']:.1f} | {r['ray_s']:.1f} | {r['ray_s'] / r['local_s']:.2f}x | "
                     f"{r['overhead_per_run_s']:.2f} | {r['local_train_s']:.1f} / {r['ray_train_s']:.1f} |")
    lines += ["", "Times are from the `sweep` command to its exit (torch imports, the Ray connection and the summary "
              "included). Overhead per run = (Ray - local) x 2 slots / 16 runs. The final losses of the two sweeps "
              "were equal in every round (the Ray runs are bit for bit the local ones: tests/test_ray.py)."]
    body = "## Ray: a 16-run grid, locally and on a local cluster\n\n`python benchmarks/ray_grid.py`\n\n" + "\n".join(lines)
    if args.write:
        write_block(START, END, body)
    print(json.dumps(report) if args.json else body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
