"""A worker process: `python -m lab.engine.worker CTRL_FD EVENTS_FD`, started by lab/engine/pool.py.

It imports torch once, then trains jobs one after another until the app closes the control pipe:
  - A `RunJob` names queued runs of a store (one, or a batched group of seed repeats). The worker trains
    them with `lab.engine.recorder.outcomes` and writes everything into the run folders itself (metrics,
    status, snapshots, weights, summary), exactly as the CLI does in its own process.
  - It sends a `Progress` for each step record (the app's live status) and a `Finished` per run.
  - A `StopRun` stops that run at its next step.
  - End-of-file on the control pipe (the app died) marks the current job's runs interrupted and ends
    the process at once.
One intra-op thread per worker when several run at once (oversubscribing the cores slows steps many
times over: benchmarks/RESULTS.md, "Thread oversubscription").
"""
from __future__ import annotations

import importlib
import os
import queue
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Optional

from lab.engine.messages import Finished, Progress, RunJob, StopRun
from lab.engine.recorder import fail_runs, outcomes
from lab.engine.store import RunStore
from lab.records import Record, StepRecord


class Inbox:
    """The worker's one reader of the control pipe. A `RunJob` registers the job's stop flags here, before
    the next message is read, so a `StopRun` that follows at once is never missed; the job then waits in
    `jobs` for the main thread."""

    def __init__(self, ctrl: Any) -> None:
        self.ctrl = ctrl
        self.jobs: queue.Queue[tuple[RunJob, dict[str, threading.Event]]] = queue.Queue()
        self.lock = threading.Lock()
        self.root: Optional[str] = None  # the current job's store, while it has one
        self.stops: dict[str, threading.Event] = {}
        threading.Thread(target=self._listen, name="lab-parent-watch", daemon=True).start()

    def finished(self, stops: dict[str, threading.Event]) -> None:
        """The main thread is done with the job of `stops` (its runs are recorded as ended): they are no
        longer ours to mark. A next job already registered stays registered."""
        with self.lock:
            if self.stops is stops:
                self.root, self.stops = None, {}

    def app_died(self) -> None:
        """The app is gone (a pipe to it closed): leave the current job's runs readable as interrupted and
        end this process. Whichever notices first, the listener or a record that cannot be sent, calls it:
        a send failing first used to end the training with an exception, recorded as the run's failure."""
        with self.lock:
            root, run_ids = self.root, list(self.stops)
        if root is not None:
            fail_runs(RunStore(Path(root)), run_ids, "the app stopped while this run was training", "interrupted")
        os._exit(3)

    def _listen(self) -> None:
        while True:
            try:
                msg = self.ctrl.recv()
            except (EOFError, OSError):
                self.app_died()
            if isinstance(msg, RunJob):
                stops = {rid: threading.Event() for rid in msg.run_ids}
                with self.lock:
                    self.root, self.stops = msg.root, stops
                self.jobs.put((msg, stops))
            elif isinstance(msg, StopRun):
                with self.lock:
                    if msg.run_id in self.stops:
                        self.stops[msg.run_id].set()


def train_job(job: RunJob, stops: dict[str, threading.Event], events: Any,
              finished: Callable[[dict[str, threading.Event]], None], app_died: Callable[[], None]) -> None:
    """Train the runs of one job, reporting progress and each run's end on `events` (`app_died` when the
    app can no longer be told)."""
    store = RunStore(Path(job.root))
    send_lock = threading.Lock()

    def relay(rid: str) -> Callable[[Record], None]:
        def send(rec: Record) -> None:
            if isinstance(rec, StepRecord):
                with send_lock:
                    try:
                        events.send(Progress(rid, rec))
                    except OSError:  # BrokenPipeError: the app died
                        app_died()
        return send

    ends = outcomes(store, list(job.run_ids), {r: e.is_set for r, e in stops.items()}, job.threads,
                    {r: relay(r) for r in job.run_ids}, job.train_fn)
    finished(stops)  # before Finished: the app may send the next job as soon as it has read it
    try:
        for rid, end in ends.items():
            events.send(Finished(rid, end.state, end.error))
    except OSError:  # the app died as the job ended: its runs are recorded already
        app_died()
    store.close()


def _preload() -> None:
    """The slow first-time work of a fresh interpreter, done while the spare waits for a job:
    importing torch and the trainer, and the optimiser's lazy import of torch._dynamo."""
    importlib.import_module("lab.batched")
    import torch

    torch.optim.AdamW([torch.zeros(1, requires_grad=True)], fused=True)


def main(argv: list[str]) -> int:
    """Import torch, then run jobs as they come, one at a time, until the app closes the pipe (or dies)."""
    ctrl, events = Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False)
    _preload()
    inbox = Inbox(ctrl)
    while True:
        job, stops = inbox.jobs.get()
        train_job(job, stops, events, inbox.finished, inbox.app_died)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
