"""Command line: `python -m lab train|resume|list|show`, `ablate|sample` (lab/cli/probe.py), `publish`
(lab/cli/publish.py), `sweep` (lab/cli/sweep.py), `preset` (lab/cli/preset.py), `bundle` (lab/cli/bundle.py)
and `heads` (lab/cli/circuits.py).

`train ... --stop-at K` stops the run at step K of its schedule as a Stop click would (status stopped, its
checkpoint written); `resume RUN_ID [--steps N]` continues a stored run from its checkpoint in its own
folder, to its config's steps or to N in all (lab/engine/continuation.py).

Progress goes to stderr; with --json, stdout carries exactly one JSON object. A bad flag value
exits with status 2 and one line naming the field, before any run folder is created. A run's final
numbers are read by what means something for its task (lab.tasks.shapes.headline_metrics, in the sentences
of lab/teach/loss_reading.py): exact-match for the sequence tasks, the loss against the unigram baseline
and chance for text, loss and the accuracy on the predictable positions for induction.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
from typing import Any, Mapping, NoReturn, Optional, Sequence, TextIO

from lab.cli import bundle as cli_bundle, circuits as cli_circuits, preset as cli_preset, probe as cli_probe
from lab.cli import publish as cli_publish
from lab.cli import sweep as cli_sweep
from lab.config import TASK_NAMES, ConfigError, RunConfig, declared_fields
from lab.derived import LENGTHS, N_CTX, default_lengths, resolve, stated_in
from lab.fields import FieldInfo
from lab.records import EXACT_MATCH, Record, StepRecord
from lab.textdata import short_form

# Every declared config field has a flag (lab/fields.py: "--d-model" for model.d_model, "--task" for
# task.name); the section's dataclass validates, the flag only carries the value.
FIELDS = {f.flag: f for f in declared_fields() if f.flag}
FIELD_TO_FLAG = {f.key: flag for flag, f in FIELDS.items()}
MAX_CONFIG_BYTES = 1024 * 1024
_CONFIG_FILE = "a run config JSON file"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, status 2, no usage dump
        self.exit(2, f"lab: error: {message}\n")


def _typed(info: FieldInfo):
    def parse(text: str) -> Any:
        try:
            return info.kind(text)
        except ValueError:
            what = "an integer" if info.kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{info.key}: {text!r} is not {what}") from None
    parse.__name__ = info.kind.__name__
    return parse


def build_parser() -> argparse.ArgumentParser:
    # the console command (pyproject.toml) names itself in the usage line; `python -m lab` otherwise
    prog = "ablation-lab" if os.path.basename(sys.argv[0]) in ("ablation-lab", "ablation-lab.exe") else "python -m lab"
    p = _Parser(prog=prog, description="Transformer Ablation Lab: train and inspect toy runs.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    t = sub.add_parser("train", help="train one run and store it")
    add_config_flags(t)
    t.add_argument("--name", default=None, help="a label for the run")
    t.add_argument("--runs-dir", help="run store folder (default: $LAB_RUNS_DIR or runs/)")
    t.add_argument("--json", action="store_true", help="print one JSON object with the result on stdout")
    t.add_argument("--stop-at", type=int, default=None, metavar="K",
                   help="stop at step K of the schedule, as a Stop click would (the run can be resumed)")
    r = sub.add_parser("resume", help="continue a stored run from its checkpoint, in its own folder")
    r.add_argument("run_id")
    r.add_argument("--steps", type=int, default=None, metavar="N",
                   help="train to N steps in all (default: the run's own Steps); the learning-rate schedule and "
                   "the attention snapshots of the remaining steps follow the new total")
    r.add_argument("--stop-at", type=int, default=None, metavar="K", help="stop at step K, as in train")
    r.add_argument("--runs-dir", help="run store folder (default: $LAB_RUNS_DIR or runs/)")
    r.add_argument("--json", action="store_true", help="print one JSON object with the result on stdout")
    ls = sub.add_parser("list", help="list stored runs")
    ls.add_argument("--runs-dir")
    ls.add_argument("--json", action="store_true")
    sh = sub.add_parser("show", help="show one stored run")
    sh.add_argument("run_id")
    sh.add_argument("--runs-dir")
    sh.add_argument("--json", action="store_true")
    cli_probe.add_parsers(sub)
    cli_publish.add_publish_command(sub)
    cli_sweep.add_sweep_command(sub, add_config_flags)
    cli_preset.add_preset_command(sub)
    cli_bundle.add_bundle_command(sub)
    cli_circuits.add_parsers(sub)
    return p


def add_config_flags(p: argparse.ArgumentParser) -> None:
    """A flag for every declared config field, and --config (train's and sweep's)."""
    for flag, info in FIELDS.items():
        p.add_argument(flag, dest=info.key, type=_typed(info) if info.kind is not str else str, default=None,
                       metavar=info.name.upper(), help=f"{info.label_help} (allowed: {info.allowed()}; "
                       f"default {_default(info)})".replace("%", "%%"))
    p.add_argument("--config", help="a run config JSON file; flags override its values")


def _default(info: FieldInfo) -> str:
    """A flag's default in its help: derived ones say so (lab/derived.py)."""
    if info.key == N_CTX:
        return "derived from the task and --arch"
    if info.key in LENGTHS:
        own = [f"{t} {default_lengths(t)[LENGTHS.index(info.key)]}" for t in TASK_NAMES
               if default_lengths(t) != default_lengths("")]
        return f"{info.default!r}; {', '.join(own)}"
    return repr(info.default)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The config `train` and `sweep` run: the defaults, or a --config file, with the flags given on top.
    Values nobody stated are derived as the app derives them (lab/derived.py): the training lengths from the
    task (induction and text have their own), n_ctx from the task and the architecture. --n-ctx, --min-len
    and --max-len, and a file's value other than the rule's, are kept as given (and validated)."""
    base = RunConfig()
    if args.config:
        try:
            with open(args.config, "rb") as fh:
                raw = fh.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError("--config", f"cannot read {args.config!r} ({exc.strerror})") from None
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError("--config", f"{args.config!r} is larger than {MAX_CONFIG_BYTES:,} bytes "
                              "(allowed: a run config JSON file)")
        try:
            base = RunConfig.from_json(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ConfigError("--config", f"{args.config!r} is not UTF-8 text (allowed: {_CONFIG_FILE})") from None
        except RecursionError:
            raise ConfigError("--config", f"{args.config!r} is nested too deeply (allowed: {_CONFIG_FILE})") from None
    # stated: the flags given and what a --config file chose; the rest follows the one rule (lab/derived.py):
    # lengths from the task, n_ctx from the task and the architecture
    stated = set(stated_in(base)) if args.config else set()
    data = base.to_dict()
    for info in FIELDS.values():
        value = getattr(args, info.key)
        if value is not None:
            data[info.section][info.name] = value
            stated.add(info.key)
    if getattr(args, "name", None) is not None:
        data["name"] = args.name
    return resolve(data, stated)


class Progress:
    """A progress bar with steps/s and time left on stderr (a line per ~10% when not a terminal)."""

    def __init__(self, total: int, out: TextIO = sys.stderr, start: int = 0) -> None:
        self.total, self.out, self.t0, self.start = total, out, time.perf_counter(), start
        self.tty = out.isatty()
        self.next_line = 0.0

    def __call__(self, rec: Record) -> None:
        if not isinstance(rec, StepRecord):
            return
        frac = rec.step / self.total
        if not self.tty and frac < self.next_line and rec.step != self.total:
            return
        self.next_line = math.floor(frac * 10 + 1) / 10
        rate = (rec.step - self.start) / max(time.perf_counter() - self.t0, 1e-9)
        eta = (self.total - rec.step) / max(rate, 1e-9)
        bar = "#" * int(frac * 30)
        line = (f"[{bar:<30}] {rec.step}/{self.total}  loss {rec.loss:.4f}  {rate:.0f} steps/s  "
                f"{rec.tokens_per_s:,.0f} tok/s  {eta:.0f}s left")
        self.out.write(("\r" + line) if self.tty else line + "\n")
        if self.tty and rec.step == self.total:
            self.out.write("\n")
        self.out.flush()


def check_device(name: str) -> None:
    """A device this machine lacks is a bad flag value too: refuse it before a run folder exists."""
    from lab.trainer import resolve_device

    try:
        resolve_device(name)
    except ValueError as exc:
        raise ConfigError("train.device", str(exc).split(": ", 1)[-1]) from None


def open_store(runs_dir: Optional[str]):
    """The run store named by --runs-dir (or $LAB_RUNS_DIR); refuses a path that is not a folder."""
    from lab.engine.store import RunStore

    if runs_dir is not None and (not runs_dir.strip() or "\0" in runs_dir):
        raise ConfigError("--runs-dir", f"{runs_dir!r} is not a folder path")
    store = RunStore(runs_dir)
    if store.root.exists() and not store.root.is_dir():
        raise ConfigError("--runs-dir", f"{str(store.root)!r} exists and is not a folder")
    if store.root.is_dir() and not os.access(store.root, os.R_OK | os.X_OK):
        raise ConfigError("--runs-dir", f"{str(store.root)!r} cannot be read")
    return store


def check_stop_at(stop_at: Optional[int], reached: int = 0) -> None:
    if stop_at is not None and stop_at <= reached:
        raise ConfigError("--stop-at", f"{stop_at} is not after step {reached} (allowed: more than {reached})")


def cmd_train(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)  # validates before anything touches the store
    check_device(cfg.train.device)
    check_stop_at(args.stop_at)
    store = open_store(args.runs_dir)
    run_id = store.create(cfg, owner="cli")
    return _train_and_report(store, run_id, cfg.train.steps, args)


def cmd_resume(args: argparse.Namespace) -> int:
    from lab.engine import continuation

    store = open_store(args.runs_dir)
    plan = continuation.plan(store, args.run_id, args.steps)  # checks; writes nothing
    check_device(plan.cfg.train.device)
    check_stop_at(args.stop_at, plan.from_step)
    continuation.queue(store, plan)
    return _train_and_report(store, args.run_id, plan.cfg.train.steps, args, plan.from_step)


def _train_and_report(store: Any, run_id: str, total: int, args: argparse.Namespace, start: int = 0) -> int:
    """Train the queued run (new, or a continuation) in this process; Ctrl-C stops it as a Stop click."""
    from lab.engine.recorder import record_run, summary_of

    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        result = record_run(store, run_id, should_stop=stop.is_set, on_record=Progress(total, start=start),
                            stop_at=args.stop_at)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    summary = summary_of(result)
    out = {"run_id": run_id, "run_dir": str(store.path(run_id)), "status": store.status(run_id)["state"],
           **{k: summary[k] for k in ("params", "steps", "train_loss", "eval", "ood", "train_set", "wall_s",
                                      "tokens_per_s", "device")}}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{run_id}: {out['status']} after {out['steps']} steps in {out['wall_s']:.1f}s; "
              f"stored in {out['run_dir']}")
        for sentence in reading(store.config(run_id), summary, _evals(store, run_id)):
            print(sentence)
    return 0


def reading(cfg: RunConfig, summary: Optional[dict], evals: Sequence[dict] = ()) -> list[str]:
    """Sentences on a run's final numbers that mean something for its task: the held-out set's, the training
    set's, and for text the overfitting warning where it applies (`evals`: the run's evaluation records)."""
    from lab.teach.loss_reading import headline_sentence, overfitting_sentence

    if not summary:
        return []
    out = [headline_sentence(cfg.task, summary.get("eval") or {}, "held-out"),
           headline_sentence(cfg.task, summary.get("train_set") or {}, "training-set"),
           overfitting_sentence(cfg.task, evals)]
    return [s for s in out if s]


def _evals(store: Any, run_id: str) -> list[dict]:
    m = store.metrics(run_id)  # the evaluation records, oldest first: what the overfitting sentence reads
    return m[m["kind"] == "eval"].to_dict("records")


def held_out_cell(store: Any, row: Mapping[str, Any]) -> str:
    """`list`'s final held-out numbers of one run: exact-match for the sequence tasks, as the column always
    was; a language-model task's headline metrics (text: the loss beside its unigram baseline)."""
    from lab.tasks.shapes import SHAPES, headline_metrics, loss_baselines

    def num(key: str) -> Optional[float]:
        v = row.get(f"final.eval.{key}")
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None

    task = row.get("task.name")
    keys = headline_metrics(task) if task in SHAPES and SHAPES[task].lm else (EXACT_MATCH,)
    cell = ", ".join(f"{k.replace('_', ' ')} {v:.3f}" for k in keys if (v := num(k)) is not None)
    if cell and task == "text":
        try:
            cell += f" (unigram {loss_baselines(store.config(row['run_id']).task).unigram:.3f})"
        except ValueError:  # a damaged config (DamagedRunError): the loss alone
            pass
    return cell.replace("exact match", "exact-match")


def cmd_list(args: argparse.Namespace) -> int:
    store = open_store(args.runs_dir)
    df = store.list()
    if args.json:
        print(df.to_json(orient="records"))
        return 0
    if len(df):
        df["held-out"] = [held_out_cell(store, row) for row in df.to_dict("records")]
    cols = [c for c in ("run_id", "state", "task.name", "model.arch", "model.pos", "model.norm", "held-out",
                        "damaged") if c in df.columns]
    print(df[cols].to_string(index=False) if len(df) else "no runs stored")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from lab.engine.store import DamagedRunError

    store = open_store(args.runs_dir)
    store.path(args.run_id)  # RunIdError before anything is read
    info: dict[str, Any] = {"run_id": args.run_id}
    damaged = []
    for key, read in (("status", store.status), ("config", lambda r: store.config(r).to_dict()),
                      ("summary", store.summary)):
        try:
            info[key] = read(args.run_id)
        except DamagedRunError as exc:  # show what is readable, and say what is not
            info[key] = None
            damaged.append(str(exc))
    if damaged:
        info["damaged"] = "; ".join(damaged)
    if info.get("config") and info.get("summary"):  # what the final numbers mean for the run's task
        try:
            info["reading"] = reading(RunConfig.from_dict(info["config"]), info["summary"],
                                      _evals(store, args.run_id))
        except (OSError, ValueError, TypeError, KeyError):  # a damaged metrics file: the numbers as stored
            info["reading"] = []
    if not args.json and info.get("config"):  # for reading: the text short (config.json holds it whole)
        info["config"]["task"]["text"] = short_form(info["config"]["task"]["text"])
    print(json.dumps(info, indent=None if args.json else 2, default=str))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        commands = {"train": cmd_train, "resume": cmd_resume, "list": cmd_list, "show": cmd_show,
                    **cli_probe.commands(open_store), **cli_publish.commands(open_store),
                    **cli_sweep.commands(open_store, config_from_args), **cli_preset.commands(open_store), **cli_bundle.commands(open_store),
                    **cli_circuits.commands(open_store)}
        return commands[args.cmd](args)
    except ConfigError as exc:
        flag = FIELD_TO_FLAG.get(exc.field)
        where = f" ({FIELDS[flag].spec.label}, flag {flag})" if flag else ""
        sys.stderr.write(f"lab: error: {exc}{where}\n")
        return 2
    except (ValueError, FileNotFoundError) as exc:
        sys.stderr.write(f"lab: error: {' '.join(str(exc).split())}\n")
        return 2
    except BrokenPipeError:  # `python -m lab list | head`: the reader left, nothing to report
        return 0
    except Exception as exc:  # a training failure is also kept in the run's status
        what = "run failed" if args.cmd in ("train", "resume") else f"{args.cmd} failed"
        sys.stderr.write(f"lab: {what}: {type(exc).__name__}: {' '.join(str(exc).split())}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
