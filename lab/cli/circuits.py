"""Command line for circuits forming over training: `python -m lab heads RUN_ID [--json]` and
`python -m lab fourier RUN_ID [--top K] [--json]` and
`python -m lab patch RUN_ID --clean TEXT --corrupt TEXT [--step S] [--json]`.

`heads` measures every attention head's role scores (previous-token, induction, duplicate-token,
first-token, self: lab/circuits/head_roles.py) on the weights kept at each snapshot step and at the end,
and prints a table per score (a row per head, a column per step) and where the top induction score first
passes 0.4. With --json, stdout carries exactly one JSON object:
`{run_id, half, steps, scores: {score: {"layer L head H": [one value per step]}}, induction_forms_at}`.

`fourier` (modular-addition runs) prints, at each snapshot step and at the end, the share of the token
embedding's non-constant power held by its K strongest frequencies of Z_p and which they are
(lab/circuits/fourier.py; Nanda et al. 2023). With --json: `{run_id, modulus, top, spectra: [{step,
fraction, frequencies, power}]}`.

`patch` runs a decoder on the clean and the corrupted input and prints how much of the clean answer each
single patch restores (lab/circuits/patching.py): the residual stream at (layer, position) and each head's
output. With --json: `{run_id, step, clean_answer, corrupt_answer, residual: [[...]], heads: [[...]]}`.
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
    f = sub.add_parser("fourier", help="a modular-addition run's embedding power per frequency, at each snapshot step")
    f.add_argument("run_id")
    f.add_argument("--top", type=int, default=8, metavar="K", help="how many strongest frequencies to sum (1 to 64)")
    f.add_argument("--runs-dir", help="run store folder (default: $LAB_RUNS_DIR or runs/)")
    f.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p = sub.add_parser("patch", help="activation patching: how much of the clean answer each patch restores")
    p.add_argument("run_id")
    p.add_argument("--clean", required=True, help="the clean input, symbols of the run's task (\"3 1 4 1 5\")")
    p.add_argument("--corrupt", required=True, help="the corrupted input, as long as the clean one")
    p.add_argument("--step", type=int, default=None, metavar="S",
                   help="use the weights kept with the snapshot at step S (default: the final weights)")
    p.add_argument("--runs-dir", help="run store folder (default: $LAB_RUNS_DIR or runs/)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def commands(open_store: Callable[[Any], Any]) -> dict[str, Callable[[argparse.Namespace], int]]:
    """name -> command for lab/cli/main.py's `main`; `open_store` is its store opener (checks --runs-dir)."""
    return {"heads": lambda args: cmd_heads(args, open_store(args.runs_dir)),
            "fourier": lambda args: cmd_fourier(args, open_store(args.runs_dir)),
            "patch": lambda args: cmd_patch(args, open_store(args.runs_dir))}


def cmd_heads(args: argparse.Namespace, store: Any) -> int:
    from lab.circuits.head_roles import INDUCTION_FORMS, SCORES, crossing_step, scores_over_training
    from lab.interventions import head_name

    cfg = store.config(args.run_id)  # names the run id when it is not a stored run
    if cfg.model.arch in RECURRENT or cfg.model.arch != "decoder":
        why = "has no attention heads" if cfg.model.arch in RECURRENT else "is not decoder-only"
        raise ConfigError("run_id", f"{args.run_id!r}: its architecture is {cfg.model.arch}, which {why}; head "
                          "roles are measured on decoder-only Transformers")
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


def cmd_fourier(args: argparse.Namespace, store: Any) -> int:
    from lab.circuits.fourier import spectra_over_training

    if not 1 <= args.top <= 64:
        raise ConfigError("--top", f"{args.top} is out of range (allowed: 1 to 64)")
    cfg = store.config(args.run_id)
    if cfg.task.name != "modular_addition":
        raise ConfigError("run_id", f"{args.run_id!r}: its task is {cfg.task.name}, but the Fourier picture is of "
                          "modular addition (the numbers 0..p-1 of Z_p); pick a modular_addition run, e.g. the grokking "
                          "preset's")
    spectra = spectra_over_training(store, args.run_id, args.top)
    if not spectra:
        state = store.status(args.run_id).get("state", "unknown")
        raise ConfigError("run_id", f"{args.run_id!r} has no saved weights yet (state {state})")
    if args.json:
        print(json.dumps({"run_id": args.run_id, "modulus": cfg.task.modulus, "top": args.top, "spectra": [
            {"step": s.step, "fraction": round(s.fraction, 4), "frequencies": list(s.top),
             "power": [round(float(v), 5) for v in s.power]} for s in spectra]}))
        return 0
    out = sys.stdout
    out.write(f"{args.run_id}: share of the token embedding's non-constant power in its {args.top} strongest "
              f"frequencies of Z_{cfg.task.modulus} (uniform: {args.top / (cfg.task.modulus // 2):.2f})\n")
    for s in spectra:
        out.write(f"step {s.step:>7}  {s.fraction:6.3f}  frequencies {', '.join(map(str, s.top))}\n")
    return 0


def _tokens(cfg: Any, text: str, flag: str) -> list[int]:
    """A typed input -> the token ids the model reads (for a sequence task, the prompt and its separator, as
    `sample` reads one); errors named by `flag`."""
    from lab.views.analysis import generation_prompt

    try:
        return generation_prompt(cfg, text)[0].tolist()
    except ConfigError as exc:
        raise ConfigError(flag, str(exc).split(": ", 1)[-1]) from None


def cmd_patch(args: argparse.Namespace, store: Any) -> int:
    import torch

    from lab.circuits.patching import patch
    from lab.cli.probe import load_run
    from lab.interventions import head_name

    cfg = store.config(args.run_id)
    if cfg.model.arch != "decoder":
        raise ConfigError("run_id", f"{args.run_id!r}: its architecture is {cfg.model.arch}; patching is measured "
                          "on decoder-only Transformers")
    clean, corrupt = _tokens(cfg, args.clean, "--clean"), _tokens(cfg, args.corrupt, "--corrupt")
    cfg, model, at = load_run(store, args.run_id, args.step)
    try:
        p = patch(model, torch.tensor([clean]), torch.tensor([corrupt]))
    except ValueError as exc:
        raise ConfigError("--corrupt", str(exc).split(": ", 1)[-1]) from None
    if args.json:
        print(json.dumps({"run_id": args.run_id, "step": at, "clean_answer": p.clean_answer,
                          "corrupt_answer": p.corrupt_answer, "residual": p.residual.round(4).tolist(),
                          "heads": p.heads.round(4).tolist()}))
        return 0
    out = sys.stdout
    out.write(f"{args.run_id} at step {at}: clean answer token {p.clean_answer}, corrupted {p.corrupt_answer}; "
              "1 = the patch restores the clean answer's logit difference, 0 = none of it\n\nresidual stream "
              "(row: input of layer L; last row: the last layer's output), by position\n")
    out.write("         " + " ".join(f"{t:>6}" for t in range(p.residual.shape[1])) + "\n")
    for row, values in enumerate(p.residual):
        name = f"layer {row}" if row < len(p.heads) else "output"
        out.write(f"{name:>8} " + " ".join(f"{v:6.2f}" for v in values) + "\n")
    out.write("\nhead outputs (all positions)\n")
    for layer, values in enumerate(p.heads):
        out.write("  " + "  ".join(f"{head_name(layer, h)}: {v:5.2f}" for h, v in enumerate(values)) + "\n")
    return 0
