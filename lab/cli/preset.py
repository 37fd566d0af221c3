"""Command line for presets: `python -m lab preset KEY [--full] [--steps N] [--max-concurrent N] [--json]`.

    python -m lab preset why_attention
    python -m lab preset table3 --json
    python -m lab preset chomsky --full     # the whole length-generalization map (on a GPU when there is one)

Runs every run of a preset (lab/teach/presets/catalog.py: the app's Presets tab, its one-click buttons) through the
job manager, as the app does, and prints the preset's explanation, read from the store as the app reads
it (lab/teach/presets/results.py), so the command line and the app say the same thing of the same runs.
Before it starts, stderr says how long the runs should take on this machine (the job manager's estimate).
`--steps N` trains each run for N steps instead of the preset's own (a quick look; the claim is made at the
preset's settings). `--full` runs a preset's larger version where it has one (chomsky: the whole map). With --json, stdout carries one JSON object `{preset, runs: [...], explanation, wall_s}`.
Ctrl-C stops every run (each keeps what it learned); the status is 0 when every run completed or was
stopped, 1 when one failed, 2 for a bad flag.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from typing import Any, Callable, Optional

from lab.cli.sweep import run_all, summarise
from lab.config import ConfigError, RunConfig
from lab.teach.presets.results import explanation
from lab.teach.presets.catalog import PRESETS


def add_preset_command(sub: Any) -> None:
    """The `preset` subcommand on lab/cli/main.py's subparsers."""
    p = sub.add_parser("preset", help="run a preset's runs (as its button in the app does) and explain them")
    p.add_argument("key", choices=sorted(PRESETS), metavar="KEY", help=f"one of: {', '.join(sorted(PRESETS))}")
    p.add_argument("--full", action="store_true",
                   help="the preset's larger version, where it has one (chomsky: every architecture and task)")
    p.add_argument("--steps", type=int, default=None, metavar="N",
                   help="train each run for N steps instead of the preset's own (a quick look)")
    p.add_argument("--max-concurrent", type=int, default=None, metavar="N",
                   help="runs training at once (default: one per CPU here, at most 4)")
    p.add_argument("--runs-dir", help="run store folder (default: $LAB_RUNS_DIR or runs/)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the runs and the explanation")


def commands(open_store: Callable[[Optional[str]], Any]) -> dict[str, Callable[..., int]]:
    return {"preset": lambda args: cmd_preset(args, open_store)}


def preset_configs(key: str, steps: Optional[int] = None, full: bool = False) -> list[RunConfig]:
    """The preset's runs (with `full`, its larger version's), each with `steps` steps (and 20 evaluations) if
    given; checked before any is stored."""
    preset = PRESETS[key]
    if full and not preset.full:
        raise ConfigError("--full", f"preset {key!r} has no larger version (allowed with: "
                          f"{', '.join(k for k, p in PRESETS.items() if p.full)})")
    cfgs = list(preset.full if full else preset.runs)
    if steps is not None:
        if not 1 <= steps <= 1_000_000:
            raise ConfigError("--steps", f"{steps} is out of range (allowed: 1 to 1000000)")
        cfgs = [replace(c, train=replace(c.train, steps=steps, eval_every=max(1, steps // 20))) for c in cfgs]
    for c in cfgs:
        RunConfig.from_json(c.to_json())  # the store's own check, before anything is written
    return cfgs


def cmd_preset(args: argparse.Namespace, open_store: Callable[[Optional[str]], Any]) -> int:
    from lab.engine.jobs import JobManager

    cfgs = preset_configs(args.key, args.steps, args.full)
    if args.max_concurrent is not None and not 1 <= args.max_concurrent <= 64:
        raise ConfigError("--max-concurrent", f"{args.max_concurrent} is out of range (allowed: 1 to 64)")
    store = open_store(args.runs_dir)
    jobs = JobManager(store, max_concurrent=args.max_concurrent, mode="process")
    preset = PRESETS[args.key]
    sys.stderr.write(f"preset {args.key} ({preset.title}): {len(cfgs)} runs, {jobs.max_concurrent} at a time. "
                     f"{jobs.estimate(cfgs).text()}\n")
    start = time.monotonic()
    ids = run_all(jobs, store, cfgs)
    runs, _ = summarise(store, ids)
    text = explanation(store, preset, {cfg.name: rid for cfg, rid in zip(cfgs, ids)})
    wall = time.monotonic() - start
    if args.json:
        print(json.dumps({"preset": args.key, "runs": runs, "explanation": text, "wall_s": wall}, default=str))
    else:
        print(text)
        print(f"{len(ids)} runs in {wall:.1f} s")
    store.close()
    return 1 if any(r["state"] == "failed" for r in runs) else 0
