"""Command line for circuits forming over training: `python -m lab heads RUN_ID [--json]`.

`heads` measures every attention head's role scores (previous-token, induction, duplicate-token,
first-token, self: lab/circuits/head_roles.py) on the weights kept at each snapshot step and at the end,
and prints a table per score (a row per head, a column per step) and where the top induction score first
passes 0.4. With --json, stdout carries exactly one JSON object:
`{run_id, half, steps, scores: {score: {"layer L head H": [one value per step]}}, induction_forms_at}`.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from lab.config import RECURRENT, ConfigError


def add_parsers(sub: Any) -> None:
    """The `heads` subcommand, on lab/cli/main.py's subparsers."""
    h = sub.add_parser("heads", help="every head's role scores (previous-token, induction, ...) at each snapshot step")
    h.add_argument("run_id")
    h.add_argument("--runs-dir", help="run store folder (default: $LAB_RUNS_DIR or runs/)")
    h.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def commands(open_store: Callable[[Any], Any]) -> dict[str, Callable[[argparse.Namespace], int]]:
    """name -> command for lab/cli/main.py's `main`; `open_store` is its store opener (checks --runs-dir)."""
    return {"heads": lambda args: cmd_heads(args, open_store(args.runs_dir))}


def cmd_heads(args: argparse.Namespace, store: Any) -> int:
    from lab.circuits.head_roles import INDUCTION_FORMS, SCORES, crossing_step, scores_over_training
    from lab.interventions import head_name

    cfg = store.config(args.run_id)  # names the run id when it is not a stored run
    if cfg.model.arch in RECURRENT or cfg.model.arch != "decoder":
        why = "has no attention heads" if cfg.model.arch in RECURRENT else "is not decoder-only"
        raise ConfigError("run_id", f"{args.run_id!r} is a {cfg.model.arch} run, which {why}: head roles are "
                          "measured on decoder-only Transformers")
    series = scores_over_training(store, args.run_id)
    if not series:
        state = store.status(args.run_id).get("state", "unknown")
        raise ConfigError("run_id", f"{args.run_id!r} has no saved weights yet (state {state}; they are kept at "
                          "each attention snapshot and when a run ends)")
    steps = [s.step for s in series]
    n_layers, n_heads = series[0].scores[SCORES[0]].shape
    heads = [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    table = {name: {head_name(layer, head): [round(float(s.scores[name][layer, head]), 4) for s in series]
                    for layer, head in heads} for name in SCORES}
    formed = crossing_step(series)
    if args.json:
        print(json.dumps({"run_id": args.run_id, "half": series[0].half, "steps": steps, "scores": table,
                          "induction_forms_at": formed}))
        return 0
    out = sys.stdout
    out.write(f"{args.run_id}: role scores of {len(heads)} heads on {series[0].half}+{series[0].half} repeated "
              f"random tokens, at {len(steps)} steps (snapshots and the end)\n")
    width = max(len(h) for h in table[SCORES[0]])
    for name in SCORES:
        out.write(f"\n{name}\n{'':{width}}  " + " ".join(f"{s:>7}" for s in steps) + "\n")
        for head, values in table[name].items():
            out.write(f"{head:{width}}  " + " ".join(f"{v:7.3f}" for v in values) + "\n")
    layer, head, top = series[-1].top("induction")
    out.write(f"\ntop induction score at the end: {head_name(layer, head)}, {top:.3f}; "
              + (f"some head first above {INDUCTION_FORMS} at step {formed}\n" if formed is not None else
                 f"no head above {INDUCTION_FORMS} at any step measured\n"))
    return 0
