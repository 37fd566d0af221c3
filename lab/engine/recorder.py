"""Training runs into the store: the one place that turns a queued run into a finished, recorded run.

`record_runs` trains one run alone or a batched group of seed repeats (lab/batched.py) and records every
run exactly as if it had trained alone: status (queued -> running -> completed / stopped / failed),
metrics appended line by line, attention snapshots, the latest checkpoint (lab/engine/continuation.py),
weights and a summary. A queued continuation of a stored run (continuation.queue) goes on from its
checkpoint in its own folder, the same way. The CLI calls it directly,
the job manager's workers call `outcomes` (the same, but it never raises), in a thread or in a worker
process (lab/engine/worker.py).
"""
from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from lab.engine import continuation
from lab.engine.store import LIVE_STATES, RunStore, now_iso
from lab.records import EXACT_MATCH, LOSS, PREDICTABLE_ACC, TOKEN_ACC, Record, SnapshotRecord

if TYPE_CHECKING:
    from lab.trainer import TrainResult

log = logging.getLogger(__name__)
STATUS_EVERY_S = 2.0  # how often a running job refreshes "step" in status.json
TrainFn = Callable[..., Any]  # lab.trainer.train's signature; a fake must accept (and may ignore) its keywords


@dataclass(frozen=True)
class Outcome:
    """How a run ended: completed, stopped or failed (with the reason, one line)."""

    state: str
    error: Optional[str] = None


class RunLost(RuntimeError):
    """The machine training a run went away (a lost cluster node, a killed worker): the run fails with
    this reason, and the server's log says so in one line, with no traceback of ours."""


def error_line(exc: BaseException, limit: int = 1000) -> str:
    """An exception as one line of text for status.json (its type name if it has no message)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def summary_of(result: TrainResult) -> dict[str, Any]:
    """The summary.json dict for a TrainResult: "train_loss" is the last logged training batch's loss;
    the final evaluation's metrics are under "eval" (held out, training lengths), "ood" (held out, longer
    lengths; None without them) and "train_set" (samples of the training distribution; None in runs
    recorded before it was measured). "predictable_acc" joins "eval" and "train_set" for induction."""
    ev = result.final_eval
    evals = ood = train_set = None
    if ev is not None:
        evals = {LOSS: ev.loss, TOKEN_ACC: ev.token_acc, EXACT_MATCH: ev.exact_match}
        if ev.ood_loss is not None:
            ood = {LOSS: ev.ood_loss, TOKEN_ACC: ev.ood_token_acc, EXACT_MATCH: ev.ood_exact_match}
        if ev.train_loss is not None:
            train_set = {LOSS: ev.train_loss, TOKEN_ACC: ev.train_token_acc, EXACT_MATCH: ev.train_exact_match}
        if ev.predictable_acc is not None:
            evals[PREDICTABLE_ACC] = ev.predictable_acc
            if train_set is not None:
                train_set[PREDICTABLE_ACC] = ev.train_predictable_acc
    return {
        "params": result.params, "steps": result.steps_done, "train_loss": result.final_train_loss,
        "eval": evals, "ood": ood, "train_set": train_set, "wall_s": result.wall_s,
        "tokens_per_s": result.tokens_per_s, "device": result.device, "stopped": result.stopped,
    }


def run_recorder(store: RunStore, run_id: str,
                 extra: Callable[[Record], None] | None = None) -> Callable[[Record], None]:
    """The callback that writes a training's records into its run folder: snapshots as files, the
    rest appended to metrics, the status's step refreshed every STATUS_EVERY_S; then `extra`."""
    last_write = [time.monotonic()]

    def record(rec: Record) -> None:
        if isinstance(rec, SnapshotRecord):
            store.save_snapshot(run_id, rec)
        else:
            store.append(run_id, rec)
            now = time.monotonic()
            if now - last_write[0] >= STATUS_EVERY_S:
                store.set_status(run_id, "running", step=rec.step)
                last_write[0] = now
        if extra is not None:
            extra(rec)
    return record


def fail_runs(store: RunStore, run_ids: Sequence[str], error: str, state: str = "failed") -> dict[str, Outcome]:
    """Mark the runs that are still live (or were marked interrupted by a dying worker) as `state`, with
    the reason; a run the store cannot update (damaged, deleted) keeps its in-memory outcome."""
    for rid in run_ids:
        try:
            if store.status(rid).get("state") in LIVE_STATES + ("interrupted",):
                store.set_status(rid, state, error=error, finished_at=now_iso())
        except Exception:  # the store itself is failing: keep the original error
            log.warning("could not record the end of run %s", rid, exc_info=True)
    return {rid: Outcome(state, error) for rid in run_ids}


def record_runs(
    store: RunStore,
    run_ids: Sequence[str],
    should_stop: Optional[Mapping[str, Callable[[], bool]]] = None,
    threads: Optional[int] = None,
    on_record: Optional[Mapping[str, Callable[[Record], None]]] = None,
    train_fn: Optional[TrainFn] = None,
    stop_at: Optional[int] = None,
) -> list[TrainResult]:
    """Train queued runs (one alone, or a batched group) to the end, recording everything in the store;
    return their TrainResults in order. Any exception marks every run of the group failed (message kept;
    "interrupted" for Ctrl-C and the like) and is re-raised. `on_record[run_id]`, if given, also sees each
    record of that run after the store has saved it; `should_stop[run_id]()` stops that run at its next step,
    as reaching step `stop_at` does. A queued continuation (one run) goes on from its checkpoint."""
    for rid in run_ids:
        state = store.status(rid).get("state")
        if state != "queued":
            raise ValueError(f"run_id: {rid!r} is {state}, not queued; only a queued run can start")
    stops, extras = should_stop or {}, on_record or {}
    try:
        cfgs = [store.config(rid) for rid in run_ids]
        resume = continuation.begin(store, run_ids[0]) if len(run_ids) == 1 else None  # groups are new runs
        if resume is not None:
            cfgs[0] = resume[0]
            store.set_status(run_ids[0], "running", continued_at=now_iso(), step=resume[1].step, error=None,
                             continued_from=resume[1].step, continue_steps=None, continue_from=None,
                             continued_from_state=None)
        else:
            for rid in run_ids:
                store.set_status(rid, "running", started_at=now_iso(), step=0, error=None)
        recorders = [run_recorder(store, rid, extras.get(rid)) for rid in run_ids]
        halts = [stops.get(rid, lambda: False) for rid in run_ids]
        saves = [functools.partial(continuation.save_checkpoint, store, rid) for rid in run_ids]
        if len(run_ids) > 1:
            from lab.batched import train_batched  # lazy: torch model code loads on the first run

            results = train_batched(cfgs, recorders, halts, threads, saves, stop_at)
        else:
            if train_fn is None:
                from lab.trainer import train as train_fn
            results = [train_fn(cfgs[0], on_record=recorders[0], should_stop=halts[0], threads=threads,
                                on_checkpoint=saves[0], resume=resume[1] if resume is not None else None,
                                stop_at=stop_at)]
        for rid, result in zip(run_ids, results):
            store.save_weights(rid, result.state_dict)
            store.write_summary(rid, summary_of(result))
            store.set_status(rid, "stopped" if result.stopped else "completed", step=result.steps_done,
                             finished_at=now_iso())
        return results
    except BaseException as exc:
        fail_runs(store, run_ids, error_line(exc), "failed" if isinstance(exc, Exception) else "interrupted")
        raise


def record_run(store: RunStore, run_id: str, should_stop: Callable[[], bool] = lambda: False,
               train_fn: Optional[TrainFn] = None, threads: Optional[int] = None,
               on_record: Optional[Callable[[Record], None]] = None, stop_at: Optional[int] = None) -> TrainResult:
    """`record_runs` for one run (the CLI's and the tests' form)."""
    return record_runs(store, [run_id], {run_id: should_stop}, threads,
                       {run_id: on_record} if on_record else None, train_fn, stop_at)[0]


def outcomes(store: RunStore, run_ids: Sequence[str], should_stop: Mapping[str, Callable[[], bool]],
             threads: Optional[int], on_record: Mapping[str, Callable[[Record], None]],
             train_fn: Optional[TrainFn] = None) -> dict[str, Outcome]:
    """`record_runs` for a job worker: never raises for a training error (the runs fail with the reason,
    the worker goes on to its next job); returns each run's outcome."""
    try:
        results = record_runs(store, run_ids, should_stop, threads, on_record, train_fn)
    except Exception as exc:
        error = error_line(exc)
        log.warning("runs %s failed: %s", ", ".join(run_ids), error, exc_info=not isinstance(exc, RunLost))
        return {rid: Outcome("failed", error) for rid in run_ids}
    return {rid: Outcome("stopped" if r.stopped else "completed") for rid, r in zip(run_ids, results)}
