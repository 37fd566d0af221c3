"""Command line for the class board: `python -m lab publish` (lab/engine/trackio_board.py does the work).

    python -m lab publish RUN_ID [RUN_ID ...] --project NAME [--space USER/SPACE] [--group-by KEYS] [--json]
    python -m lab publish --all --project NAME [...]          # every completed or stopped run in the store

Runs go to a local Trackio project (`trackio show --project NAME` opens it), or to a Hugging Face Space
with --space or $LAB_TRACKIO_SPACE. A skipped run is reported with its reason (on stderr, or in the
JSON); the status is 0 when every run asked for is on the board (published now, or already there under
its name: publishing again sends nothing twice to a local project), 1 when some run was skipped, 2 for a
bad flag (one line naming it) or when Trackio is not installed. With --json, stdout carries exactly one
JSON object (`project, space_id, published, already, skipped[{run_id, reason}], names`); what Trackio
prints goes to stderr.

lab/cli/main.py registers it (`add_publish_command` on its subparsers, `commands` in its dispatch); `main`
runs it alone, with a store opener given by the caller (this module imports no engine code).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, NoReturn, Optional, Sequence

from lab.config import ConfigError
from lab.engine.trackio_board import SPACE_ENV, TrackioMissing, check_group_by, check_project, finished_run_ids, publish_runs

FLAGS = {"project": "--project", "group_by": "--group-by", "space": "--space"}  # publish_runs' fields -> flags


def add_publish_command(sub: Any) -> None:
    """The `publish` subcommand, on lab/cli/main.py's subparsers."""
    p = sub.add_parser("publish", help="publish stored runs to a Trackio project (a class board)")
    p.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="the runs to publish (a selection, a whole grid)")
    p.add_argument("--all", action="store_true", help="publish every completed or stopped run in the store")
    p.add_argument("--project", default=None, metavar="NAME",
                   help="the Trackio project (letters, digits, '-', '_'), e.g. class-2026")
    p.add_argument("--space", default=None, metavar="USER/SPACE",
                   help=f"a Hugging Face Space to publish to (default: ${SPACE_ENV}; else a local project)")
    p.add_argument("--group-by", default=None, metavar="KEYS",
                   help="config columns to group the runs by, comma-separated (model.pos,model.norm); "
                   "default: a grid's axes other than the seed")
    p.add_argument("--runs-dir", help="run store folder (default: $LAB_RUNS_DIR or runs/)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def commands(open_store: Callable[[Any], Any]) -> dict[str, Callable[[argparse.Namespace], int]]:
    """name -> command for lab/cli/main.py's `main`; `open_store` is its store opener (checks --runs-dir)."""
    return {"publish": lambda args: cmd_publish(args, open_store(args.runs_dir))}


def _flag_error(exc: ConfigError) -> ConfigError:
    """publish_runs names its arguments ('project: ...'); here they are flags ('--project: ...')."""
    flag = FLAGS.get(exc.field)
    return ConfigError(flag, str(exc).split(": ", 1)[-1]) if flag else exc


def _group_by(text: Optional[str]) -> Optional[list[str]]:
    if text is None:
        return None
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if not keys:
        raise ConfigError("--group-by", f"{text!r} names no config column (e.g. model.pos,model.norm)")
    return keys


def cmd_publish(args: argparse.Namespace, store: Any) -> int:
    """Check the flags, publish, report; see the module docstring for the output and the status."""
    if args.project is None:
        raise ConfigError("--project", "is required: the Trackio project to publish to (e.g. --project class-2026)")
    if args.all and args.run_ids:
        raise ConfigError("--all", "give run ids or --all, not both")
    if not args.all and not args.run_ids:
        raise ConfigError("RUN_ID", "name at least one run id, or --all for every completed or stopped run")
    if args.space is not None and (not args.space.strip() or " " in args.space.strip()):
        raise ConfigError("--space", f"{args.space!r} is not a Space id (user/name)")
    try:
        check_project(args.project)
        group_by = check_group_by(_group_by(args.group_by))
    except ConfigError as exc:
        raise _flag_error(exc) from None
    run_ids = finished_run_ids(store) if args.all else list(args.run_ids)
    try:
        report = publish_runs(store, run_ids, args.project, space_id=args.space, group_by=group_by)
    except TrackioMissing as exc:
        sys.stderr.write(f"lab: error: {exc}\n")
        return 2
    for line in report.messages:
        sys.stderr.write(f"trackio: {line}\n")
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        for run_id in report.published:
            print(f"published {run_id} as {report.names[run_id]!r}")
        for run_id in report.already:
            print(f"already there: {run_id} as {report.names[run_id]!r}")
        where = (f"Space {report.space_id}" if report.space_id
                 else f"a local project (see it: trackio show --project {args.project})")
        print(f"{len(report.published)} run(s) published to {args.project!r} in {where}"
              + (f"; {len(report.already)} already there" if report.already else "")
              + (f"; {len(report.skipped)} skipped" if report.skipped else ""))
    for run_id, reason in report.skipped:
        sys.stderr.write(f"lab: skipped {run_id}: {reason}\n")
    return 1 if report.skipped else 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, status 2, no usage dump (as lab/cli/main.py)
        sys.stderr.write(f"lab: error: {message}\n")
        raise SystemExit(2)


def main(argv: Optional[Sequence[str]], open_store: Callable[[Any], Any]) -> int:
    """`publish` alone (before or without lab/cli/main.py's registration): argv without the command name."""
    parser = _Parser(prog="python -m lab")
    add_publish_command(parser.add_subparsers(dest="cmd", required=True, parser_class=_Parser))
    args = parser.parse_args(["publish", *(argv or [])])
    try:
        return commands(open_store)["publish"](args)
    except ValueError as exc:  # ConfigError included: the message names the flag
        sys.stderr.write(f"lab: error: {' '.join(str(exc).split())}\n")
        return 2
