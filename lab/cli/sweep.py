"""Command line for sweeps: `python -m lab sweep --grid SPEC [train's flags] [--ray ADDRESS] [--json]`.

    python -m lab sweep --grid "pos=rope,alibi norm=pre,post seed=0..4" --task reverse --steps 800
    python -m lab sweep --grid "pos=rope,alibi seed=0,1" --ray auto --max-concurrent 8 --json

The grid means what the app's ablation grid means (lab/engine/grid.py owns both): axes by their short
names (pos, norm, heads, layers, d_model, seed), values separated by commas, integer ranges as FIRST..LAST,
every combination applied to the config the other flags make (the same flags as `train`), each run named
by its values. Every config is checked before any run folder is written. The runs go through the job
manager, as the app's do: locally in worker processes, or each as a task on a Ray cluster with `--ray`
(auto: the cluster started on this machine, local: one started in this process, or host:port; default
$LAB_RAY_ADDRESS). A line per run as it ends goes to stderr; at the end a table of the groups (the runs
that differ only in seed) with the mean and [min, max] of their final metrics, as Compare shows them.
With --json, stdout carries exactly one JSON object `{runs: [...], groups: [...], wall_s, where}`.
Ctrl-C stops every run (each keeps what it learned, as a Stop click); the status is 0 when every run
completed or was stopped, 1 when one failed, 2 for a bad flag (one line naming it).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any, Callable, Optional

import pandas as pd

from lab.config import ConfigError, RunConfig, flatten
from lab.engine.grid import AXES, SWEEP_MAX_RUNS, build_grid, parse_spec
from lab.views.seed_groups import group_runs, spread
from lab.records import EXACT_MATCH, LOSS

METRICS = {f"final.eval.{LOSS}": "eval loss", f"final.eval.{EXACT_MATCH}": "exact-match",
           f"final.ood.{LOSS}": "ood loss", f"final.ood.{EXACT_MATCH}": "ood exact-match"}
POLL_S = 0.5


def add_sweep_command(sub: Any, add_config_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    """The `sweep` subcommand on lab/cli/main.py's subparsers, with train's config flags."""
    p = sub.add_parser("sweep", help="train every combination of a grid of config values (locally or on Ray)")
    p.add_argument("--grid", required=True, metavar="SPEC",
                   help="axes and values, e.g. \"pos=rope,alibi norm=pre,post seed=0..4\" (axes: "
                   f"{', '.join(a.short for a in AXES.values())}; at most {SWEEP_MAX_RUNS} runs)")
    add_config_flags(p)
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="train on a Ray cluster: auto (started on this machine), local (start one here) or "
                   "host:port (default: $LAB_RAY_ADDRESS; else worker processes on this machine)")
    p.add_argument("--max-concurrent", type=int, default=None, metavar="N",
                   help="runs training at once (default: one per CPU here, at most 4; on Ray the cluster's CPUs)")
    p.add_argument("--runs-dir", help="run store folder (default: $LAB_RUNS_DIR or runs/)")
    p.add_argument("--json", action="store_true", help="print one JSON object with every run and group on stdout")


def commands(open_store: Callable[[Optional[str]], Any],
             config_from_args: Callable[[argparse.Namespace], RunConfig]) -> dict[str, Callable[..., int]]:
    return {"sweep": lambda args: cmd_sweep(args, open_store, config_from_args)}


def sweep_configs(base: RunConfig, spec: str) -> list[RunConfig]:
    """The grid's configs (GridError naming the axis, before anything is written)."""
    return build_grid(base, parse_spec(spec), max_runs=SWEEP_MAX_RUNS, max_axes=len(AXES))


def cmd_sweep(args: argparse.Namespace, open_store: Callable[[Optional[str]], Any],
              config_from_args: Callable[[argparse.Namespace], RunConfig]) -> int:
    from lab.engine.environment import ray_address
    from lab.engine.jobs import JobManager

    cfgs = sweep_configs(config_from_args(args), args.grid)  # checks every run before the store is touched
    if args.max_concurrent is not None and not 1 <= args.max_concurrent <= 10_000:
        raise ConfigError("--max-concurrent", f"{args.max_concurrent} is out of range (allowed: 1 to 10000)")
    address = args.ray or ray_address()
    store = open_store(args.runs_dir)
    jobs = JobManager(store, max_concurrent=args.max_concurrent, ray_address=address,
                      mode=None if address else "process")
    where = jobs.pool.describe() if address else f"this machine, {jobs.max_concurrent} worker process(es)"
    sys.stderr.write(f"sweep: {len(cfgs)} runs on {where}\n")
    start = time.monotonic()
    ids = run_all(jobs, store, cfgs)
    runs, groups = summarise(store, ids)
    out = {"runs": runs, "groups": groups.to_dict(orient="records"), "wall_s": time.monotonic() - start,
           "where": where}
    if args.json:
        print(json.dumps(out, default=str))
    else:
        print(groups.to_string(index=False) if len(groups) else "no runs")
        print(f"{len(ids)} runs in {out['wall_s']:.1f} s on {where}")
    store.close()
    return 1 if any(r["state"] == "failed" for r in runs) else 0


def run_all(jobs: Any, store: Any, cfgs: list[RunConfig], reuse: bool = False) -> list[str]:
    """Submit every config, follow them to their ends (a line each on stderr) and shut the jobs down; Ctrl-C
    stops them all, each keeping what it learned. The runs' ids, in the configs' order. With `reuse`, a config
    the store has completed with this code is that run, not a new one (lab/engine/sharing.py)."""
    stop_all = _on_interrupt(jobs)
    try:
        ids = ([c.run_id for c in jobs.claim_many(cfgs, owner="cli")] if reuse
               else jobs.submit_many(cfgs, owner="cli"))
        stop_all.ids = ids
        _follow(jobs, store, ids, cfgs)
    finally:
        stop_all.restore()
        jobs.shutdown(wait=True)
    return ids


class _on_interrupt:
    """Ctrl-C (or SIGTERM) stops every run of the sweep, as Stop clicks; the sweep then waits for them."""

    def __init__(self, jobs: Any) -> None:
        self.jobs, self.ids = jobs, []
        self.previous = {s: signal.signal(s, self._stop) for s in (signal.SIGINT, signal.SIGTERM)}

    def _stop(self, *_: Any) -> None:
        sys.stderr.write("sweep: stopping every run (each keeps what it learned)\n")
        for rid in self.ids:
            self.jobs.stop(rid)

    def restore(self) -> None:
        for s, h in self.previous.items():
            signal.signal(s, h)


def _follow(jobs: Any, store: Any, ids: list[str], cfgs: list[RunConfig]) -> None:
    """A line on stderr per run as it ends, in the order they end; returns when all have."""
    names = {rid: cfg.name for rid, cfg in zip(ids, cfgs)}
    left, done = dict.fromkeys(ids), 0
    while left:
        for rid in list(left):
            st = jobs.status(rid)
            if st.state in ("queued", "running"):
                continue
            del left[rid]
            done += 1
            summary = store.summary(rid) or {}
            ev = summary.get("eval") or {}
            node = store.status(rid).get("ray_node")
            said = (f"eval loss {ev[LOSS]:.3f}, exact-match {ev[EXACT_MATCH]:.3f}" if ev else (st.error or ""))
            sys.stderr.write(f"[{done}/{len(ids)}] {names[rid]}: {st.state} after {st.step} steps; {said}"
                             f"{f' (Ray node {node[:8]})' if node else ''}  {rid}\n")
        if left:
            time.sleep(POLL_S)


def summarise(store: Any, ids: list[str]) -> tuple[list[dict[str, Any]], pd.DataFrame]:
    """Each run (id, name, state, error, final eval and ood metrics, Ray node) and the groups' table:
    runs that differ only in seed, with 'mean [min, max]' of each final metric (lab/engine/grid.py)."""
    runs, flat = [], {}
    for rid in ids:
        status, summary = store.status(rid), store.summary(rid) or {}
        cfg = store.config(rid)
        flat[rid] = flatten(cfg)
        runs.append({"run_id": rid, "name": cfg.name, "state": status.get("state"), "error": status.get("error"),
                     "steps": summary.get("steps"), "eval": summary.get("eval"), "ood": summary.get("ood"),
                     "wall_s": summary.get("wall_s"), "ray_node": status.get("ray_node")})
    finals = {r["run_id"]: {f"final.{k}.{m}": v for k in ("eval", "ood") for m, v in (r[k] or {}).items()}
              for r in runs}
    varied = [a for a in AXES.values() if a.short != "seed" and len({flat[r][a.field] for r in ids}) > 1]
    rows = []
    for members in group_runs(flat).values():
        first = flat[members[0]]
        rows.append({"group": " ".join(f"{a.short}={first[a.field]}" for a in varied) or "all runs",
                     "runs": len(members), "seeds": ", ".join(str(flat[m]["train.seed"]) for m in members),
                     "completed": sum(r["state"] == "completed" for r in runs if r["run_id"] in members),
                     **{label: spread(finals[m].get(key) for m in members) for key, label in METRICS.items()}})
    return runs, pd.DataFrame(rows)
