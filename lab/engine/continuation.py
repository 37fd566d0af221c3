"""Continuing a stored run: its checkpoint file, the checks before a continuation is queued, and cutting the
run's records back to its checkpoint when the continuation starts.

A run folder keeps its latest checkpoint as `checkpoint.safetensors` (format: lab/checkpoint.py), replaced
atomically (a temp file named after its writer, then os.replace; `RunStore.sweep` removes a dead writer's
temp file) at every evaluation point and when the run stops or ends. A run can be continued when it is
completed, stopped or interrupted (a killed server: its checkpoint is the last evaluation point's), to a
larger total of steps; the continuation is the same run, in the same folder:
  1. `plan` checks the request and writes nothing: the run exists, is not queued or running, has a
     checkpoint, the new total is above the checkpoint's step and within the config's bounds and the
     server's limits. Refusals are ConfigErrors naming the field ("train.steps", shown as "Steps"; "run").
  2. `queue` marks the run queued with the request in its status (`continue_steps`, `continue_from`,
     `continued_from_state`: what to restore if the queued continuation is stopped before it starts).
  3. `begin`, when the queued run starts training (lab/engine/recorder.py), rewrites config.json with the
     new total, cuts metrics.jsonl back to the checkpoint's step (records an interrupted process wrote
     after it, and the evaluation a stop added at it) and deletes the attention snapshots after it (and
     the one a stop added at it), then returns the checkpoint to train on from. The curve then continues
     without a duplicate step, and a run stopped and continued records what it would have uninterrupted.
Weights, summary and status are rewritten by the recorder when the continuation ends, as for any run.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Optional

from safetensors import SafetensorError

import lab.checkpoint as ckpt
from lab.checkpoint import Checkpoint
from lab.config import ConfigError, RunConfig
from lab.engine.limits import Limits, check_config
from lab.engine.store import LIVE_STATES, RunStore
from lab.engine.storefs import DamagedRunError, _atomic_write, safetensors_problem, temp_tag

CHECKPOINT = "checkpoint.safetensors"


@dataclass(frozen=True)
class Plan:
    """An accepted continuation: the run, its config with the new total, the checkpoint's step."""

    run_id: str
    cfg: RunConfig
    from_step: int
    previous_state: str  # the run's state before (completed, stopped, interrupted, failed)


# ---- the checkpoint file ------------------------------------------------------------------------------
def save_checkpoint(store: RunStore, run_id: str, ck: Checkpoint) -> None:
    """Replace the run's checkpoint with `ck`, atomically (the only one kept is the latest)."""
    path = store.path(run_id) / CHECKPOINT
    _atomic_write(path, ckpt.to_bytes(ck), temp_tag(store.root))


def checkpoint_step(store: RunStore, run_id: str) -> Optional[int]:
    """The step of the run's checkpoint (its header only is read); None if it has none. DamagedRunError
    for a file that is not a whole checkpoint."""
    path = store.path(run_id) / CHECKPOINT
    if not path.is_file():
        return None
    problem = safetensors_problem(path)
    if problem is None:
        try:
            return int(ckpt.read_header(path)["step"])
        except (ValueError, KeyError, TypeError, OSError, SafetensorError) as exc:
            problem = " ".join(str(exc).split())[:200]
    raise DamagedRunError(problem)


def load_checkpoint(store: RunStore, run_id: str) -> Checkpoint:
    """The run's checkpoint (tensors on the CPU); DamagedRunError if it is missing or unreadable."""
    if checkpoint_step(store, run_id) is None:
        raise DamagedRunError(f"{CHECKPOINT}: missing")
    try:
        return ckpt.load(store.path(run_id) / CHECKPOINT)
    except (ValueError, KeyError, TypeError, OSError, SafetensorError) as exc:
        raise DamagedRunError(f"{CHECKPOINT}: unreadable ({' '.join(str(exc).split())[:200]})") from None


# ---- asking for a continuation -------------------------------------------------------------------------
def plan(store: RunStore, run_id: str, steps: Optional[int] = None, owner: Optional[str] = None,
         limits: Optional[Limits] = None) -> Plan:
    """Check that `run_id` can be continued to `steps` in all (default: its config's train.steps), writing
    nothing. With `owner` given (a shared server), PermissionError for someone else's run; with `limits`,
    the server's step and size limits apply (LimitError)."""
    status = store.status(run_id)  # RunIdError, RunNotFoundError, DamagedRunError
    if owner is not None and status.get("owner", "") != owner:
        raise PermissionError(f"run_id: {run_id!r} belongs to another user; you can continue only your own runs")
    state = str(status.get("state"))
    if state in LIVE_STATES:
        raise ConfigError("run", f"{run_id!r} is {state}; wait for it to end (or stop it), then continue it")
    cfg = store.config(run_id)
    try:
        reached = checkpoint_step(store, run_id)
    except DamagedRunError as exc:
        raise ConfigError("run", f"{run_id!r} cannot be continued: its checkpoint is damaged ({exc})") from None
    if reached is None:
        raise ConfigError("run", f"{run_id!r} has no checkpoint to continue from (it was trained before runs "
                          "kept checkpoints, or stopped before its first one); train it again instead")
    total = cfg.train.steps if steps is None else steps
    if isinstance(total, bool) or not isinstance(total, int):
        raise ConfigError("train.steps", f"{total!r} is not an integer (allowed: more than {reached})")
    if total <= reached:
        raise ConfigError("train.steps", f"{total} is not more than the {reached} steps this run has already "
                          f"trained (allowed: more than {reached})")
    new = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=total))  # bounds: ConfigError
    if limits is not None:
        check_config(limits, new)
    return Plan(run_id, new, reached, state)


def queue(store: RunStore, p: Plan) -> dict[str, Any]:
    """Mark the planned continuation queued (stamped as this process's, like any queued run)."""
    return store.set_status(p.run_id, "queued", error=None, continue_steps=p.cfg.train.steps,
                            continue_from=p.from_step, continued_from_state=p.previous_state)


def unqueue(store: RunStore, run_id: str) -> dict[str, Any]:
    """A queued continuation stopped before it started: the run goes back to the state it had."""
    status = store.status(run_id)
    before = status.get("continued_from_state") or "stopped"
    return store.set_status(run_id, before, continue_steps=None, continue_from=None)


# ---- starting it -----------------------------------------------------------------------------------------
def begin(store: RunStore, run_id: str) -> Optional[tuple[RunConfig, Checkpoint]]:
    """For a queued run about to train: None if it is a new run; for a continuation, (its config with the
    new total, the checkpoint to go on from), its config rewritten and its records cut back to the
    checkpoint."""
    steps = store.status(run_id).get("continue_steps")
    if not steps:
        return None
    ck = load_checkpoint(store, run_id)
    cfg = store.config(run_id)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=int(steps)))
    if ck.step > cfg.train.steps:
        raise ConfigError("train.steps", f"{steps} is less than the checkpoint's step {ck.step}")
    rewind(store, run_id, ck)
    _atomic_write(store.path(run_id) / "config.json", cfg.to_json().encode(), temp_tag(store.root))
    return cfg, ck


def rewind(store: RunStore, run_id: str, ck: Checkpoint) -> int:
    """Cut the run's records back to the checkpoint: metrics lines after its step (and its stop's eval line)
    and torn lines go, as do attention snapshots after it (and its stop's). Returns the lines dropped."""
    folder = store.path(run_id)
    path = folder / "metrics.jsonl"
    store.release(run_id)  # no cached append handle may outlive the file it points to
    kept, dropped = [], 0
    for line in path.read_bytes().splitlines() if path.exists() else ():
        try:
            row = json.loads(line)
            step = row["step"]
            keep = isinstance(step, int) and (step < ck.step or (step == ck.step and not (
                ck.stop_eval and row.get("kind") == "eval")))
        except (ValueError, UnicodeDecodeError, TypeError, KeyError):
            keep = False
        if keep:
            kept.append(line + b"\n")
        else:
            dropped += 1
    if dropped:
        _atomic_write(path, b"".join(kept), temp_tag(store.root))
    for step in store.snapshot_steps(run_id):
        if step > ck.step or (step == ck.step and ck.stop_snapshot):
            (folder / "attention" / f"step_{step:07d}.safetensors").unlink(missing_ok=True)
    return dropped
