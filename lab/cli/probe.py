"""Command line for looking inside a trained run: `python -m lab ablate` and `python -m lab sample`.

    python -m lab ablate RUN_ID --heads 1.0,1.2 [--mode zero|mean] [--skip-ff 0] [--skip-attn 0]
                         [--skip-block 1] [--no-pos | --shuffle-pos] [--json]
    python -m lab ablate RUN_ID --importance [--mode zero|mean] [--kind dec_self|enc_self|cross] [--json]
    python -m lab sample RUN_ID --prompt "3 1 2" [--tokens N] [--temperature T] [--seed S] [--json]

`ablate` prints the held-out metrics of the intact and the intervened model (lab/views/probing.py's
`ablation_report`: at the training lengths and at longer ones); with --importance, the layers x heads map
of held-out loss and exact-match with each head knocked out alone. The tables show what means something for
the run's task (lab/views/probing.py `quoted`): a text run's loss alone, induction's loss and accuracy on the
predictable positions; the JSON keeps every metric. `sample` prints what a decoder run
writes after a typed prompt. With --json, stdout carries exactly one JSON object. A bad value exits with
status 2 and one line naming the flag (lab/cli/main.py's `main` prints it), never a traceback.
"""
from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, Callable, Optional

from lab.config import ConfigError, RunConfig
from lab.records import ATTENTION_KINDS, DEC_SELF, EXACT_MATCH, LOSS, PREDICTABLE_ACC, TOKEN_ACC

if TYPE_CHECKING:  # torch and the model load inside the commands: a bad flag is refused without them
    from lab.interventions import Interventions
    from lab.model import Transformer

# The labels lab/interventions.py and lab/views/probing.py name their fields by (the app's), and the flags here.
FLAG_OF = {"Heads": "--heads", "Knockout": "--mode", "Skip attention": "--skip-attn",
           "Skip feed-forward": "--skip-ff", "Skip block": "--skip-block",
           "Positional encoding": "--no-pos/--shuffle-pos", "Tokens to generate": "--tokens",
           "Temperature": "--temperature", "probe": "--prompt"}
_ONE_INTERVENTION = "--heads, --skip-attn, --skip-ff, --skip-block, --no-pos or --shuffle-pos"


def add_parsers(sub: Any) -> None:
    """The `ablate` and `sample` subcommands, on lab/cli/main.py's subparsers."""
    a = sub.add_parser("ablate", help="held-out metrics of a stored run with heads, sublayers or the PE knocked out")
    a.add_argument("run_id")
    a.add_argument("--heads", default="", metavar="L.H,...",
                   help="heads to knock out, layer.head (1.0,1.2; enc.0.1 and cross.0.1 in an encoder-decoder)")
    a.add_argument("--mode", default="zero",
                   help="zero: the head's output becomes 0; mean: its mean over the held-out set")
    a.add_argument("--skip-attn", default="", metavar="LAYERS", help="layers whose attention is skipped (0,1)")
    a.add_argument("--skip-ff", default="", metavar="LAYERS", help="layers whose feed-forward is skipped")
    a.add_argument("--skip-block", default="", metavar="LAYERS", help="whole blocks skipped")
    pos = a.add_mutually_exclusive_group()
    pos.add_argument("--no-pos", dest="positional", action="store_const", const="none", default="intact",
                     help="remove the positional encoding")
    pos.add_argument("--shuffle-pos", dest="positional", action="store_const", const="shuffle",
                     help="give the positions a fixed random order")
    a.add_argument("--importance", action="store_true",
                   help="instead: the layers x heads map of each head knocked out alone")
    a.add_argument("--kind", default=DEC_SELF,
                   help=f"which attention the map covers: {DEC_SELF} (default), or in an encoder-decoder "
                        f"{' or '.join(k for k in ATTENTION_KINDS if k != DEC_SELF)}")
    a.add_argument("--step", type=int, default=None, metavar="S",
                   help="use the weights kept with the attention snapshot at step S (default: the final weights)")
    a.add_argument("--runs-dir", help="run store folder (default: $LAB_RUNS_DIR or runs/)")
    a.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    s = sub.add_parser("sample", help="what a stored decoder run writes after a typed prompt")
    s.add_argument("run_id")
    s.add_argument("--prompt", required=True, help="symbols of the run's task (\"3 1 2\", \"312\"); for a "
                   "sequence-to-sequence task the separator is added unless typed")
    s.add_argument("--tokens", type=int, default=20, metavar="N", help="tokens to generate (1 to 1000)")
    s.add_argument("--temperature", type=float, default=1.0, metavar="T", help="0 is greedy (0 to 5)")
    s.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    s.add_argument("--runs-dir", help="run store folder (default: $LAB_RUNS_DIR or runs/)")
    s.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def commands(open_store: Callable[[Any], Any]) -> dict[str, Callable[[argparse.Namespace], int]]:
    """name -> command for lab/cli/main.py's `main`; `open_store` is its store opener (checks --runs-dir)."""
    return {"ablate": lambda args: cmd_ablate(args, open_store(args.runs_dir)),
            "sample": lambda args: cmd_sample(args, open_store(args.runs_dir))}


def as_flag(exc: ConfigError) -> ConfigError:
    """The same error named by the flag that carried the value ("Heads: ..." -> "--heads: ...")."""
    flag = FLAG_OF.get(exc.field)
    if flag is None:
        return exc
    return ConfigError(flag, str(exc).split(": ", 1)[-1])


def load_run(store: Any, run_id: str, step: Optional[int] = None) -> tuple[RunConfig, "Transformer", int]:
    """The run's config, a fresh CPU model with its final weights (or those of the snapshot at `step`), and
    the step the weights are from."""
    from lab.engine.storefs import RunNotFoundError
    from lab.views.analysis import load_model

    cfg = store.config(run_id)  # RunIdError / RunNotFoundError name the run id
    try:
        weights, at = store.weights_at(run_id, step)
    except RunNotFoundError as exc:
        if step is not None:
            steps = ", ".join(map(str, store.snapshot_steps(run_id))) or "none"
            raise ConfigError("--step", f"{str(exc).split(': ', 1)[-1]} (snapshot steps: {steps})") from None
        state = store.status(run_id).get("state", "unknown")
        raise ConfigError("run_id", f"{run_id!r} has no saved weights yet (state {state}; weights are saved when "
                          "a run completes or is stopped)") from None
    return cfg, load_model(cfg, weights), at


# ---- ablate ---------------------------------------------------------------------------------------
def spec_from_args(args: argparse.Namespace) -> "Interventions":
    from lab.interventions import MODES, Interventions, parse_heads, parse_layers

    if args.mode not in MODES:
        raise ConfigError("--mode", f"{args.mode!r} is not a knockout mode (allowed: {', '.join(MODES)})")
    try:
        return Interventions(heads=parse_heads(args.heads), mode=args.mode,
                             skip_attn=parse_layers(args.skip_attn, "Skip attention"),
                             skip_ff=parse_layers(args.skip_ff, "Skip feed-forward"),
                             skip_block=parse_layers(args.skip_block, "Skip block"), positional=args.positional)
    except ConfigError as exc:
        raise as_flag(exc) from None


def cmd_ablate(args: argparse.Namespace, store: Any) -> int:
    spec = spec_from_args(args)  # checks the flags' syntax before anything is loaded
    if args.importance and not spec.empty:
        raise ConfigError("--importance", f"knocks out each head alone; leave out {_ONE_INTERVENTION}")
    if not args.importance and spec.empty:
        raise ConfigError("--heads", f"nothing to ablate (give at least one of {_ONE_INTERVENTION}, "
                          "or --importance)")
    cfg, model, at = load_run(store, args.run_id, args.step)
    if args.importance:
        return _importance(args, cfg, model, at)
    from lab.views.probing import ablation_report

    try:
        report = ablation_report(model, cfg, spec)
    except ConfigError as exc:
        raise as_flag(exc) from None
    if args.json:
        print(json.dumps({"run_id": args.run_id, "step": at, **report}))
        return 0
    from lab.views.probing import measured_on

    print(_run_line(args.run_id, cfg))
    print("interventions: " + "; ".join(report["interventions"]))
    print(f"held-out metrics on {measured_on(report['n'], at)}")
    columns = [(key, title, width) for key, title, width in _COLUMNS if key in report["quoted"]]
    print(f"{'':24}" + "".join(f"{title:>{width}}" for _, title, width in columns))
    for split, name in (("eval", "training lengths"), ("ood", "longer lengths")):
        for which in ("intact", "ablated"):
            m = report[which][split]
            if m is not None:
                print(f"{name if which == 'intact' else '':17}{which:<7}"
                      + "".join(format(m[key], f"{width}.3f") for key, _, width in columns))
    return 0


# the ablate table's columns: metric key, title, width
_COLUMNS = ((LOSS, "loss", 9), (TOKEN_ACC, "token acc", 11), (EXACT_MATCH, "exact-match", 13),
            (PREDICTABLE_ACC, "acc (predictable)", 19))


def _run_line(run_id: str, cfg: RunConfig) -> str:
    m = cfg.model
    return f"run {run_id}: {cfg.task.name}, {m.arch}, {m.n_layers} layers x {m.n_heads} heads, {m.pos} PE, {m.norm}-LN"


def _importance(args: argparse.Namespace, cfg: RunConfig, model: "Transformer", step: Optional[int] = None) -> int:
    from lab.interventions import KIND_PREFIX
    from lab.views.probing import importance_map

    kinds = list(KIND_PREFIX) if cfg.model.arch == "encoder-decoder" else [DEC_SELF]
    if args.kind not in kinds:
        raise ConfigError("--kind", f"{args.kind!r} is not an attention of this run (allowed: {', '.join(kinds)})")
    imp = importance_map(model, cfg, kind=args.kind, mode=args.mode)
    ranked = [{"head": str(h), "loss_rise": rise} for h, rise in imp.ranked()]
    out = {"run_id": args.run_id, "step": step, "n": imp.n, "kind": imp.kind, "mode": imp.mode,
           "intact": {LOSS: imp.intact_loss, EXACT_MATCH: imp.intact_exact},
           LOSS: imp.loss.tolist(), EXACT_MATCH: imp.exact.tolist(), "ranked": ranked,
           "sentence": imp.sentence(step)}
    if imp.predictable is not None:  # induction
        out["intact"][PREDICTABLE_ACC] = imp.intact_predictable
        out[PREDICTABLE_ACC] = imp.predictable.tolist()
    if args.json:
        print(json.dumps(out))
        return 0
    print(_run_line(args.run_id, cfg))
    heads = "".join(f"{f'head {h}':>9}" for h in range(cfg.model.n_heads))
    beside = imp.beside()  # exact-match, induction's accuracy on the predictable positions, or none (text)
    for title, grid, intact, fmt in (("held-out loss", imp.loss, imp.intact_loss, "9.3f"),
                                     *([(beside[0], beside[1], beside[2], "9.3f")] if beside else [])):
        print(f"\n{title} with each head knocked out ({imp.mode}; intact {intact:.3f})")
        print(f"{'':8}{heads}")
        for layer, row in enumerate(grid):
            print(f"{f'layer {layer}':8}" + "".join(format(float(v), fmt) for v in row))
    sentence = imp.sentence(step)
    print("\n" + sentence[0].upper() + sentence[1:] + ".")
    return 0


# ---- sample ---------------------------------------------------------------------------------------
def prompt_tokens(cfg: RunConfig, text: str) -> list[int]:
    """A typed prompt -> token ids (lab.views.analysis.generation_prompt), errors named by --prompt."""
    from lab.views.analysis import generation_prompt

    try:
        return generation_prompt(cfg, text)[0].tolist()
    except ConfigError as exc:
        raise as_flag(exc) from None


def cmd_sample(args: argparse.Namespace, store: Any) -> int:
    cfg = store.config(args.run_id)
    if cfg.model.arch == "encoder-decoder":
        raise ConfigError("run_id", f"{args.run_id!r} is an encoder-decoder run: free generation needs a decoder "
                          "run (an encoder-decoder only answers its input; see Inspect)")
    prompt = prompt_tokens(cfg, args.prompt)  # before the weights are read: a typo is reported at once
    cfg, model, _ = load_run(store, args.run_id)
    import torch

    from lab.views.analysis import tokens_text
    from lab.views.probing import generate

    try:
        new = generate(model, cfg, torch.tensor([prompt]), args.tokens, args.temperature, args.seed)
    except ConfigError as exc:
        raise as_flag(exc) from None
    out = {"run_id": args.run_id, "prompt": _labels(cfg, prompt), "prompt_tokens": prompt, "tokens": new,
           "continuation": _labels(cfg, new), "text": tokens_text(cfg, new), "temperature": args.temperature,
           "seed": args.seed}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{tokens_text(cfg, prompt)}  ->  {out['text']}")
    return 0


def _labels(cfg: RunConfig, tokens: list[int]) -> list[str]:
    from lab.tasks.batches import get_task

    task = get_task(cfg.task.name)
    return [task.label(cfg.task, t) for t in tokens]
