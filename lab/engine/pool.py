"""Worker processes for the job manager: one per training slot, kept warm job after job.

Why processes: a training step is tens to hundreds of small torch ops, each entered from Python, and the
web server shares the interpreter with any training thread; a process per slot keeps the page responsive,
isolates a crash or an out-of-memory kill, and lets two runs use two cores (benchmarks/RESULTS.md, "Runs
at once").

A worker is `python -m lab.engine.worker CTRL_FD EVENTS_FD` (lab/engine/worker.py), a fresh interpreter:
no fork of the threaded app, no re-import of the app's __main__. It imports torch once, then trains job
after job; a worker whose job ended cleanly waits as a spare for the slot's next job, so runs start at
once instead of after importing torch. A worker that exits without reporting every run
(killed, out of memory, segfault) leaves those runs failed, with the exit code or signal in the message,
and is replaced once its job is over (importing torch beside running jobs slows them: benchmarks/README.md,
"Concurrency").
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable, Optional

from lab.engine.messages import Finished, Progress, RunJob, StopRun
from lab.engine.recorder import Outcome, TrainFn, fail_runs
from lab.engine.store import RunStore
from lab.records import Record

log = logging.getLogger(__name__)
_POLL_S = 0.1  # how often the parent checks the stop flags while waiting for messages


class Worker:
    """A started worker process and our ends of its two pipes."""

    def __init__(self) -> None:
        c_ctrl, p_ctrl = os.pipe()  # parent writes, child reads
        p_ev, c_ev = os.pipe()  # child writes, parent reads
        root = str(Path(__file__).resolve().parents[2])  # the folder holding the lab package
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        # one OpenMP thread from the start: a pool sized to every core while torch loads keeps a second
        # thread spinning at barriers, and two such children then fight over two cores (the job still sets
        # its own count: torch.set_num_threads overrides this)
        env.setdefault("OMP_NUM_THREADS", "1")
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "lab.engine.worker", str(c_ctrl), str(c_ev)],
                                         pass_fds=(c_ctrl, c_ev), stdin=subprocess.DEVNULL, env=env)
        except BaseException:
            for fd in (p_ctrl, p_ev):
                os.close(fd)
            raise
        finally:
            os.close(c_ctrl)
            os.close(c_ev)  # the child holds the only writer: its death is our end-of-file
        self.ctrl, self.events = Connection(p_ctrl, readable=False), Connection(p_ev, writable=False)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Close our pipe ends (an idle worker reads end-of-file and exits)."""
        self.ctrl.close()
        self.events.close()


class WorkerPool:
    """The worker processes of one job manager: busy ones and warm spares, `wanted` in all."""

    def __init__(self, wanted: int = 1) -> None:
        self._lock = threading.Lock()
        self._spares: list[Worker] = []  # started, torch imported, waiting for a job; most recently used first
        self._busy = 0  # workers running a job now
        self._wanted = wanted  # processes to keep, busy or spare: one per job slot
        self._closed = False

    def warm_up(self, n: Optional[int] = None) -> None:
        """Keep `n` (default: as many as wanted) processes started, busy or spare, so that as many runs
        submitted at once each start at once."""
        with self._lock:
            if n is not None:
                self._wanted = max(self._wanted, n)
            self._spares[:] = [w for w in self._spares if w.alive()]
            try:
                while not self._closed and len(self._spares) + self._busy < self._wanted:
                    self._spares.append(Worker())
            except OSError:
                log.warning("could not start a spare training process", exc_info=True)

    def close(self) -> None:
        """Let every spare exit; busy workers exit when their job ends."""
        with self._lock:
            self._closed, spares, self._spares = True, self._spares, []
        for w in spares:
            w.close()

    def _take(self) -> Worker:
        """A warm spare if one is alive (the one that finished a job last), else a new worker."""
        worker = None
        with self._lock:
            self._busy += 1
            while self._spares and worker is None:
                worker = self._spares.pop(0)
                if not worker.alive():
                    worker.close()
                    worker = None
        if worker is None:
            try:
                worker = Worker()
            except BaseException:
                with self._lock:
                    self._busy -= 1  # no worker to release: the job fails to start
                raise
        return worker

    def _release(self, worker: Worker, reusable: bool) -> None:
        """A job has ended: a worker that finished it cleanly becomes a spare (beyond `wanted` the extras
        exit); one that died or was torn down is replaced, now that its job is over."""
        with self._lock:
            self._busy -= 1
            if reusable and not self._closed:
                self._spares.insert(0, worker)
            elif reusable:
                worker.close()
            keep = max(0, self._wanted - self._busy)
            extra, self._spares[keep:] = self._spares[keep:], []
        for w in extra:
            w.close()
        if not reusable:
            worker.close()
            if worker.alive():  # we are being torn down mid-job: take the worker with us
                worker.proc.kill()
            try:
                worker.proc.wait(5)
            except subprocess.TimeoutExpired:
                log.warning("training process %s did not exit", worker.proc.pid)
            threading.Thread(target=self.warm_up, name="lab-spare-worker", daemon=True).start()

    def run(self, store: RunStore, run_ids: list[str], stops: dict[str, threading.Event], threads: int,
            on_record: Callable[[str, Record], None], train_fn: Optional[TrainFn] = None) -> dict[str, Outcome]:
        """Train queued runs (one, or a batched group) in a worker process; block until it ends. Setting
        stops[run_id] stops that run at its next step. Returns each run's outcome."""
        worker = self._take()
        outcome: dict[str, Outcome] = {}
        sent: set[str] = set()
        reusable = False
        try:
            try:
                worker.ctrl.send(RunJob(str(store.root), tuple(run_ids), threads, train_fn))
            except OSError:
                pass  # died while idle: reported below from its exit code
            while len(outcome) < len(run_ids):
                for rid, ev in stops.items():
                    if ev.is_set() and rid not in sent:
                        sent.add(rid)
                        try:
                            worker.ctrl.send(StopRun(rid))
                        except OSError:
                            pass  # the worker is gone; handled below
                try:
                    if not worker.events.poll(_POLL_S):
                        continue
                    msg = worker.events.recv()
                except (EOFError, OSError):
                    break  # the worker died
                if isinstance(msg, Progress):
                    on_record(msg.run_id, msg.record)
                elif isinstance(msg, Finished):
                    outcome[msg.run_id] = Outcome(msg.state, msg.error)
            reusable = len(outcome) == len(run_ids) and worker.alive()
        finally:
            self._release(worker, reusable)
        missing = [rid for rid in run_ids if rid not in outcome]
        if missing:
            outcome.update(fail_runs(store, missing, exit_message(worker.proc.returncode)))
        return outcome


def exit_message(code: Optional[int]) -> str:
    """Why a worker process ended, in words for a run's error."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = " (killed: out of memory, or stopped from outside)" if name == "SIGKILL" else ""
        return f"the training process was killed by {name}{why}"
    return f"the training process exited unexpectedly (exit code {code})"
