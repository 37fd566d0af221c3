"""The job manager's machinery: its bookkeeping, and one thread per training slot that takes the next
queued job fairly and has it trained and recorded (lab/engine/recorder.py) in a worker process of its pool
(lab/engine/pool.py) or, for tests, in the thread itself. A job's exception becomes a "failed" status
with its message, and the slot goes on to the next job. Each job's speed is measured for the time
estimates (lab/engine/estimate.py), and each finished run is backed up when a backup folder is set
(lab/engine/backup.py). What callers ask of it (submit, resume, stop, status) is lab/engine/jobs.py.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from lab.config import ConfigError, RunConfig
from lab.engine.backup import backup_run
from lab.engine.cost import cost
from lab.engine.environment import (MODES, batch_seeds_default, default_max_concurrent, default_mode, default_threads,
                                    detect, ray_gpus)
from lab.engine.environment import ray_address as env_ray_address
from lab.engine.estimate import SpeedLog, probe_capacity
from lab.engine.limits import Limits
from lab.engine.pool import WorkerPool
from lab.engine.recorder import Outcome, error_line, fail_runs, outcomes
from lab.engine.sharing import SharedRuns
from lab.engine.store import TERMINAL_STATES, DamagedRunError, RunStore
from lab.records import Record, StepRecord

log = logging.getLogger(__name__)
MAX_FINISHED = 500  # finished jobs remembered in memory (older ones are read from the store)
SPARE_DELAY_S = 10.0  # the app warms up its spare worker processes this long after it starts


@dataclass(frozen=True)
class JobStatus:
    """A snapshot of one run's progress, safe to hand to the UI."""

    run_id: str
    state: str
    owner: str
    step: int
    total_steps: int
    queue_position: int | None  # 1-based place in the queue while queued, else None
    steps_per_s: float | None
    eta_s: float | None
    last_loss: float | None
    error: str | None


@dataclass
class _Job:
    """The manager's mutable bookkeeping for one submitted run (guarded by the lock)."""

    run_id: str
    owner: str
    total_steps: int
    state: str = "queued"
    error: str | None = None
    last_step: StepRecord | None = None
    stop_event: threading.Event = field(default_factory=threading.Event)
    group: str | None = None  # submit_many: queued runs with one group train as one batched model
    cfg: RunConfig | None = None  # what it trains (for the time estimates)
    continuing: bool = False  # a continuation of a stored run (resume)

class JobSlots:
    """The state of a job manager and its slot threads, at most `max_concurrent` jobs training at once."""

    def __init__(
        self, store: RunStore, max_concurrent: int | None = None, train_fn: Callable[..., Any] | None = None,
        limits: Limits | None = None, mode: str | None = None, backup: Path | None = None,
        ray_address: str | None = None,
    ) -> None:
        self.store = store
        self.train_fn = train_fn
        if max_concurrent is not None:
            self._check_slots(max_concurrent)
        # where training runs: a worker process by default (lab/engine/pool.py); a custom train_fn
        # (tests) runs in the job's thread unless `mode` says otherwise; `ray_address` (or LAB_RAY_ADDRESS,
        # when nothing else is asked) makes every run a task on that Ray cluster (lab/engine/ray_backend.py)
        if ray_address is None and mode is None and train_fn is None:
            ray_address = env_ray_address()
        self.mode = "ray" if ray_address else mode or ("thread" if train_fn is not None else default_mode())
        if self.mode not in MODES + ("ray",) or (self.mode == "ray" and not ray_address):
            raise ValueError(f"mode: {self.mode!r} is not one of {', '.join(MODES)} (Ray: give its address)")
        self.pool: Any = None
        if self.mode == "ray":
            try:
                from lab.engine.ray_backend import RayPool  # only here: Ray is optional
            except ImportError as exc:
                raise ConfigError("LAB_RAY_ADDRESS", f"Ray is not installed here ({exc}); install it with "
                                  "`pip install -r requirements-scale.txt`") from None
            self.pool = RayPool(ray_address, ray_gpus())
        if max_concurrent is None and self.mode == "ray":  # LAB_MAX_CONCURRENT, else the cluster's CPUs
            max_concurrent = detect({**os.environ, "LAB_RAY_ADDRESS": ray_address}).slots or self.pool.slots()
        elif max_concurrent is None:
            max_concurrent = default_max_concurrent()
        self.max_concurrent = self._check_slots(max_concurrent)
        if self.mode == "process":
            self.pool = WorkerPool(max_concurrent)
        self.batch_seeds = train_fn is None and self.mode != "ray" and batch_seeds_default()
        self.limits = limits if limits is not None else Limits()  # lab/engine/limits.py; Limits.from_env() for a server
        self._admitting: dict[str, int] = {}  # owner -> runs admitted whose folder is still being written
        self._cond = threading.Condition()
        self._jobs: dict[str, _Job] = {}
        self._queue: deque[str] = deque()
        self._workers: list[threading.Thread] = []
        self._idle = 0
        self._closed = False
        self._speed = SpeedLog()  # measured speed of this server's jobs, for the time estimates
        self.shared = SharedRuns(store)  # which run answers which configuration, and who holds it (lock held)
        self._claiming = threading.Lock()  # claims one at a time (lab/engine/jobs.py claim_many)
        self._device: str | None = None  # where the queue trains, read on first need (jobs.py _live_device)
        self.backup = backup  # a folder that outlives the disk (LAB_BACKUP_DIR): finished runs are copied there

    @staticmethod
    def _check_slots(n: Any) -> int:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"max_concurrent: {n!r} is not a positive integer")
        return n

    def warm_up(self, delay_s: float = 0.0) -> None:
        """Start the worker processes (one per slot) in the background after `delay_s`, so the first runs
        start at once. The app waits a little: importing torch in them while the app itself starts slowed
        its cold start (benchmarks/README.md, "Concurrency")."""
        if self.pool is not None:
            timer = threading.Timer(delay_s, self.pool.warm_up, args=(self.max_concurrent,))
            timer.daemon = True
            timer.start()

    def threads_for(self, cfg: RunConfig) -> int:
        """Intra-op threads for a job. Torch threads are process-global, so concurrent jobs
        get one each; a lone worker uses the config's choice or every core."""
        if self.mode == "ray":  # a Ray task asks for one CPU per thread
            return cfg.train.threads or 1
        if self.max_concurrent >= 2:
            return 1
        return cfg.train.threads or default_threads()

    def _start_worker_if_needed(self) -> None:
        """More queued jobs than idle workers, and room under the cap: start workers for them."""
        for _ in range(min(len(self._queue) - self._idle, self.max_concurrent - len(self._workers))):
            worker = threading.Thread(target=self._work, name=f"lab-job-{len(self._workers)}", daemon=True)
            self._workers.append(worker)
            worker.start()

    def _probe(self) -> None:
        """Measure the CPU our jobs can get now, unless measured in the last seconds (lab/engine/estimate.py)."""
        with self._cond:
            if not self._speed.needs_probe(time.monotonic()):
                return
            running, n_cores = len(self._speed.live), self._speed.n_cores
        # tens of milliseconds, outside the lock; no more threads than training slots (a big machine's
        # cores are not all ours to use)
        capacity = probe_capacity(running, n_cores, threads=self.max_concurrent)
        with self._cond:
            self._speed.probed(capacity, time.monotonic())

    def _snapshot(self, job: _Job) -> JobStatus:
        rec = job.last_step
        step = rec.step if rec else 0
        rate = rec.step / rec.elapsed_s if rec and rec.elapsed_s > 0 else None
        live = job.state == "running" and rate
        return JobStatus(
            run_id=job.run_id, state=job.state, owner=job.owner, step=step, total_steps=job.total_steps,
            queue_position=self._queue.index(job.run_id) + 1 if job.state == "queued" else None,
            steps_per_s=rate, eta_s=max(0.0, (job.total_steps - step) / rate) if live else None,
            last_loss=rec.loss if rec else None, error=job.error,
        )

    def _from_store(self, run_id: str) -> JobStatus:
        status = self.store.status(run_id)
        try:
            total = self.store.config(run_id).train.steps
        except DamagedRunError:
            total = 0
        return JobStatus(
            run_id=run_id, state=str(status.get("state")), owner=str(status.get("owner", "")),
            step=int(status.get("step") or 0), total_steps=total, queue_position=None,
            steps_per_s=None, eta_s=None, last_loss=None, error=status.get("error"),
        )

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                while not self._queue and not self._closed:
                    self._cond.wait()
                self._idle -= 1
                if not self._queue:
                    return  # closed and nothing left
                batch = [self._jobs[self._next_queued()]]
                if batch[0].group is not None:  # its group mates, queued behind it, train with it
                    batch += [self._jobs[r] for r in self._queue if self._jobs[r].group == batch[0].group]
                    for job in batch[1:]:
                        self._queue.remove(job.run_id)
                for job in batch:
                    job.state = "running"
                self._speed.start(batch[0].run_id, batch[0].owner, [cost(j.cfg) for j in batch if j.cfg is not None],
                                  time.monotonic())
            self._probe()  # the capacity while it trains, for its sample
            self._run(batch)
            self._probe()  # and as it leaves the machine, for the next estimates

    def _next_queued(self) -> str:
        """Take the next run off the queue, fairly: the oldest queued run of the owner with the fewest
        runs training now, so one user's ten-run preset does not hold back everyone else's single run
        (with one user, plain first-in first-out). Called with the lock held and the queue non-empty."""
        running: dict[str, int] = {}
        for job in self._jobs.values():
            if job.state == "running":
                running[job.owner] = running.get(job.owner, 0) + 1
        best = min(range(len(self._queue)), key=lambda i: (running.get(self._jobs[self._queue[i]].owner, 0), i))
        run_id = self._queue[best]
        del self._queue[best]
        return run_id

    def _run(self, batch: list[_Job]) -> None:
        """Train one job, or a batched group, in this thread or a worker process."""
        jobs = {job.run_id: job for job in batch}
        head = batch[0].run_id  # the job's measured speed: its first run's records (a group's share its steps)

        def seen(run_id: str, rec: Record) -> None:
            if isinstance(rec, StepRecord):
                with self._cond:
                    jobs[run_id].last_step = rec
                    if run_id == head:
                        self._speed.step(head, rec.step, rec.elapsed_s)

        ends: dict[str, Outcome] = {}
        try:
            ends = self._train(list(jobs), {job.run_id: job.stop_event for job in batch}, seen)
        except BaseException as exc:  # never lose a worker: its runs fail with the reason, the slot stays
            log.warning("job worker: %s", error_line(exc), exc_info=True)
            ends = fail_runs(self.store, list(jobs), error_line(exc))
        finally:
            self.back_up(list(jobs))  # before the job reads finished: a finished run is a backed-up one
            with self._cond:
                for run_id, job in jobs.items():
                    end = ends.get(run_id, Outcome("failed", "the job's worker stopped unexpectedly"))
                    job.state, job.error = end.state, end.error
                    if end.state != "completed":
                        self.shared.drop(run_id)  # a failed or stopped run answers no later request
                self._speed.end(head, all(j.state == "completed" for j in batch), time.monotonic())
                self._forget_old()
                self._cond.notify_all()

    def back_up(self, run_ids: Sequence[str]) -> None:
        """Copy finished runs to the backup folder, if there is one (lab/engine/backup.py). A failure is
        logged, never raised: the run itself is safe in the store."""
        if self.backup is None:
            return
        for run_id in run_ids:
            try:
                if self.store.status(run_id).get("state") in TERMINAL_STATES:
                    backup_run(self.store, run_id, self.backup)
            except Exception:  # a full or unmounted bucket must not stop the slot
                log.warning("could not back up run %s", run_id, exc_info=True)

    def _train(self, run_ids: list[str], stops: dict[str, threading.Event],
               seen: Callable[[str, Record], None]) -> dict[str, Outcome]:
        """Train the runs of one job where this manager trains (a worker process or this thread)."""
        try:
            threads = self.threads_for(self.store.config(run_ids[0]))
        except (DamagedRunError, OSError):
            threads = 1  # recording the run reports the damage as its failure
        if self.pool is None:
            return outcomes(self.store, run_ids, {r: e.is_set for r, e in stops.items()}, threads,
                            {r: functools.partial(seen, r) for r in run_ids}, self.train_fn)
        try:
            return self.pool.run(self.store, run_ids, stops, threads, seen, self.train_fn)
        except Exception as exc:  # could not even start the process
            log.warning("could not start a training process", exc_info=True)
            return fail_runs(self.store, run_ids, f"could not start the training process: {exc}")

    def _forget_old(self) -> None:
        finished = [r for r, j in self._jobs.items() if j.state in TERMINAL_STATES]
        for run_id in finished[: max(0, len(finished) - MAX_FINISHED)]:
            del self._jobs[run_id]
