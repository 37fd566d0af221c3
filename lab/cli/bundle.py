"""Command line for lesson bundles: `python -m lab bundle (--all | KEY ...) --out FILE [--runs-dir DIR]`.

    python -m lab bundle --all --out lesson.zip          # every preset, trained once, into one file
    python -m lab bundle induction grokking --out two.zip

Trains every run of the chosen presets through the job manager, as their buttons in the app do (on the GPU
when there is one), attaching to runs the store already holds for the same configuration and code (a
second bundle of the same presets trains nothing), then writes those runs into one file
(lab/engine/bundle.py) that an app loads with `LAB_BUNDLE=FILE`. Before it starts, stderr says how long the
runs should take here; at the end stdout says what was written and its size. Ctrl-C stops every run and
writes no bundle. The status is 0 when the bundle was written, 1 when a run did not complete (nothing is
written then), 2 for a bad flag.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from lab.cli.sweep import run_all
from lab.config import ConfigError
from lab.teach.presets.catalog import PRESETS


def add_bundle_command(sub: Any) -> None:
    """The `bundle` subcommand on lab/cli/main.py's subparsers."""
    p = sub.add_parser("bundle", help="train presets once and write their runs into one lesson file (LAB_BUNDLE)")
    p.add_argument("keys", nargs="*", metavar="KEY", help=f"presets to include: {', '.join(sorted(PRESETS))}")
    p.add_argument("--all", action="store_true", help="every preset")
    p.add_argument("--out", required=True, help="the bundle file to write (.zip)")
    p.add_argument("--max-concurrent", type=int, default=None, metavar="N",
                   help="runs training at once (default: one per CPU here, at most 4; 4 on a GPU)")
    p.add_argument("--runs-dir", help="run store folder (default: $LAB_RUNS_DIR or runs/)")


def commands(open_store: Callable[[Optional[str]], Any]) -> dict[str, Callable[..., int]]:
    return {"bundle": lambda args: cmd_bundle(args, open_store)}


def chosen(keys: list[str], every: bool) -> list[str]:
    """The presets asked for, checked (ConfigError naming KEY for an unknown one)."""
    if every == bool(keys):
        raise ConfigError("KEY", "name the presets to bundle, or give --all (not both)")
    for key in keys:
        if key not in PRESETS:
            raise ConfigError("KEY", f"{key!r} is not a preset (allowed: {', '.join(sorted(PRESETS))})")
    return sorted(PRESETS) if every else list(dict.fromkeys(keys))


def cmd_bundle(args: argparse.Namespace, open_store: Callable[[Optional[str]], Any]) -> int:
    from lab.engine.bundle import write_bundle
    from lab.engine.jobs import JobManager

    keys = chosen(args.keys, args.all)
    out = Path(args.out)
    if out.suffix != ".zip" or not out.parent.is_dir():
        raise ConfigError("--out", f"{args.out!r} is not a .zip file in an existing folder")
    if args.max_concurrent is not None and not 1 <= args.max_concurrent <= 64:
        raise ConfigError("--max-concurrent", f"{args.max_concurrent} is out of range (allowed: 1 to 64)")
    cfgs = [cfg for key in keys for cfg in PRESETS[key].runs]
    store = open_store(args.runs_dir)
    jobs = JobManager(store, max_concurrent=args.max_concurrent, mode="process")
    sys.stderr.write(f"bundle: {len(keys)} preset(s), {len(cfgs)} runs, {jobs.max_concurrent} at a time. "
                     f"{jobs.estimate(cfgs).text()}\n")
    ids = run_all(jobs, store, cfgs, reuse=True)
    failed = [r for r in dict.fromkeys(ids) if store.status(r).get("state") != "completed"]
    if failed:
        sys.stderr.write(f"bundle: {len(failed)} run(s) did not complete ({', '.join(failed[:5])}); "
                         "no bundle written\n")
        store.close()
        return 1
    size = write_bundle(store, ids, out, keys)
    store.close()
    print(f"{out}: {len(set(ids))} runs of {len(keys)} preset(s), {size / 2**20:.1f} MiB. "
          f"Start the app with LAB_BUNDLE={out} to show them with no training.")
    return 0
