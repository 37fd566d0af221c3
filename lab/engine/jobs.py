"""Background execution: a fair queue, job threads under a concurrency cap, stop, status.

`JobManager` admits runs under the server's limits (lab/engine/limits.py), queues them and gives each
free slot the next one; a slot's thread has the run trained and recorded (lab/engine/record.py) in a
worker process of its pool (lab/engine/pool.py) or, for tests, in the thread itself. `resume` queues the
continuation of a stored run from its checkpoint (lab/engine/continuation.py) the same way. A job's exception
becomes a "failed" status with its message, and the slot goes on to the next job. Status snapshots are
taken under one lock, from the latest records each job has seen.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from lab.batched import batch_key
from lab.config import ConfigError, RunConfig
from lab.engine import continuation
from lab.engine.backup import backup_run, forget
from lab.engine.cost import cost
from lab.engine.environment import MODES, batch_seeds_default, default_max_concurrent, default_mode, default_threads
from lab.engine.estimate import Estimate, Server, SpeedLog, forecast, group_jobs, probe_capacity
from lab.engine.limits import Limits, check_admission
from lab.engine.pool import WorkerPool
from lab.engine.record import Outcome, error_line, fail_runs, outcomes
from lab.engine.store import LIVE_STATES, TERMINAL_STATES, DamagedRunError, RunStore, now_iso
from lab.records import Record, StepRecord

log = logging.getLogger(__name__)
MAX_FINISHED = 500  # finished jobs remembered in memory (older ones are read from the store)
SPARE_DELAY_S = 10.0  # the app warms up its spare worker processes this long after it starts
_SHUT_DOWN = "job manager shut down before the run started"


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


class JobManager:
    """Runs submitted configs on daemon worker threads, at most `max_concurrent` at once."""

    def __init__(
        self, store: RunStore, max_concurrent: int | None = None, train_fn: Callable[..., Any] | None = None,
        limits: Limits | None = None, mode: str | None = None, backup: Path | None = None,
    ) -> None:
        if max_concurrent is None:
            max_concurrent = default_max_concurrent()
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(f"max_concurrent: {max_concurrent!r} is not a positive integer")
        self.store = store
        self.max_concurrent = max_concurrent
        self.train_fn = train_fn
        # where training runs: a worker process by default (lab/engine/pool.py); a custom train_fn
        # (tests) runs in the job's thread unless `mode` says otherwise
        self.mode = mode or ("thread" if train_fn is not None else default_mode())
        if self.mode not in MODES:
            raise ValueError(f"mode: {self.mode!r} is not one of {', '.join(MODES)}")
        self.batch_seeds = train_fn is None and batch_seeds_default()
        self.pool = WorkerPool(max_concurrent) if self.mode == "process" else None
        self.limits = limits if limits is not None else Limits()  # lab/limits.py; Limits.from_env() for a server
        self._admitting: dict[str, int] = {}  # owner -> runs admitted whose folder is still being written
        self._cond = threading.Condition()
        self._jobs: dict[str, _Job] = {}
        self._queue: deque[str] = deque()
        self._workers: list[threading.Thread] = []
        self._idle = 0
        self._closed = False
        self._speed = SpeedLog()  # measured speed of this server's jobs, for the time estimates
        self.backup = backup  # a folder that outlives the disk (LAB_BACKUP_DIR): finished runs are copied there

    def warm_up(self, delay_s: float = 0.0) -> None:
        """Start the worker processes (one per slot) in the background after `delay_s`, so the first runs
        start at once. The app waits a little: importing torch in them while the app itself starts slowed
        its cold start (1.15x -> 1.36x of a bare import of gradio and torch, measured)."""
        if self.pool is not None:
            timer = threading.Timer(delay_s, self.pool.warm_up, args=(self.max_concurrent,))
            timer.daemon = True
            timer.start()

    def threads_for(self, cfg: RunConfig) -> int:
        """Intra-op threads for a job. Torch threads are process-global, so concurrent jobs
        get one each; a lone worker uses the config's choice or every core."""
        if self.max_concurrent >= 2:
            return 1
        return cfg.train.threads or default_threads()

    # ---- commands -----------------------------------------------------------------
    def submit(self, cfg: RunConfig, owner: str = "") -> str:
        """Create the run (queued) and enqueue it; returns its id at once. LimitError (before any
        run folder exists) when the server's limits refuse it."""
        return self.submit_many([cfg], owner=owner, batch=False)[0]

    def submit_many(self, cfgs: list[RunConfig], owner: str = "", batch: bool = True) -> list[str]:
        """Submit several configs (a preset, an ablation grid); returns their run ids in order.
        All or nothing: the server's limits are checked for the whole set before any folder is
        written, so a set too large for them is refused whole (LimitError) rather than half-started.
        With `batch_seeds` on, configs that differ only in seed (or lr) train as one batched model
        (lab/batched.py) and are stored as separate runs; none starts before every run is queued,
        so a group stays whole."""
        cfgs = list(cfgs)
        with self._cond:
            if self._closed:
                raise RuntimeError("job manager: shut down; no new runs accepted")
            live = sum(1 for j in self._jobs.values() if j.owner == owner and j.state in LIVE_STATES)
            for cfg in cfgs:
                check_admission(self.limits, cfg, owner, live + self._admitting.get(owner, 0),
                                len(self._queue) + sum(self._admitting.values()), n=len(cfgs))
            self._admitting[owner] = self._admitting.get(owner, 0) + len(cfgs)
        ids: list[str] = []
        try:
            for cfg in cfgs:
                ids.append(self.store.create(cfg, owner=owner))
        finally:
            with self._cond:
                self._admitting[owner] -= len(cfgs)
                if not self._admitting[owner]:
                    del self._admitting[owner]
                closed = self._closed  # shut down while the folders were being written
                if not closed:
                    keys = [batch_key(c) if batch and self.batch_seeds else None for c in cfgs[:len(ids)]]
                    shared = {k for k in keys if k is not None and keys.count(k) > 1}
                    for run_id, cfg, key in zip(ids, cfgs, keys):
                        job = _Job(run_id, owner, cfg.train.steps, cfg=cfg)
                        job.group = f"{ids[0]}/{hash(key)}" if key in shared else None
                        self._jobs[run_id] = job
                        self._queue.append(run_id)
                    self._start_worker_if_needed()
                    self._cond.notify_all()
        if closed:
            for run_id in ids:
                self.store.set_status(run_id, "interrupted", error=_SHUT_DOWN)
            raise RuntimeError("job manager: shut down; no new runs accepted")
        return ids

    def resume(self, run_id: str, steps: int | None = None, owner: str = "") -> str:
        """Queue the continuation of a stored run from its checkpoint to `steps` in all (default: its config's
        train.steps), in its own folder, through the same queue, slots and limits as a new run; returns the
        run id. ConfigError naming the field (Steps, run) when it cannot be continued: a total not above its
        checkpoint's step or above the server's limit, a run queued or running, a run without a checkpoint
        (nothing is written then); PermissionError for someone else's run on a shared server."""
        self.store.path(run_id)  # RunIdError for anything that is not a run id
        with self._cond:  # held throughout: two requests for one run cannot both queue it
            if self._closed:
                raise RuntimeError("job manager: shut down; no new runs accepted")
            job = self._jobs.get(run_id)
            if job is not None and job.state in LIVE_STATES:
                raise ConfigError("run", f"{run_id!r} is {job.state}; wait for it to end (or stop it), then "
                                  "continue it")
            plan = continuation.plan(self.store, run_id, steps, owner if self.limits.public else None, self.limits)
            live = sum(1 for j in self._jobs.values() if j.owner == owner and j.state in LIVE_STATES)
            check_admission(self.limits, plan.cfg, owner, live + self._admitting.get(owner, 0),
                            len(self._queue) + sum(self._admitting.values()))
            continuation.queue(self.store, plan)
            self._jobs[run_id] = _Job(run_id, owner, plan.cfg.train.steps, cfg=plan.cfg, continuing=True)
            self._queue.append(run_id)
            self._start_worker_if_needed()
            self._cond.notify_all()
        return run_id

    def adopt(self, run_id: str, owner: str = "") -> str:
        """Queue a run the store already holds as queued but no manager trains: a new run whose GPU chunk
        never started (lab/engine/chunks.py), or a continuation queued for one; it goes on from its checkpoint
        if it has one. Admission limits apply as to a new run (LimitError)."""
        self.store.path(run_id)  # RunIdError for anything that is not a run id
        status = self.store.status(run_id)
        if status.get("state") != "queued":
            raise ConfigError("run", f"{run_id!r} is {status.get('state')}, not queued")
        cfg = self.store.config(run_id)
        steps = int(status.get("continue_steps") or cfg.train.steps)
        with self._cond:
            if self._closed:
                raise RuntimeError("job manager: shut down; no new runs accepted")
            job = self._jobs.get(run_id)
            if job is not None and job.state in LIVE_STATES:
                return run_id
            live = sum(1 for j in self._jobs.values() if j.owner == owner and j.state in LIVE_STATES)
            check_admission(self.limits, cfg, owner, live + self._admitting.get(owner, 0),
                            len(self._queue) + sum(self._admitting.values()))
            self._jobs[run_id] = _Job(run_id, owner, steps, cfg=cfg, continuing=bool(status.get("continue_steps")))
            self._queue.append(run_id)
            self._start_worker_if_needed()
            self._cond.notify_all()
        return run_id

    def _start_worker_if_needed(self) -> None:
        """More queued jobs than idle workers, and room under the cap: start workers for them."""
        for _ in range(min(len(self._queue) - self._idle, self.max_concurrent - len(self._workers))):
            worker = threading.Thread(target=self._work, name=f"lab-job-{len(self._workers)}", daemon=True)
            self._workers.append(worker)
            worker.start()

    def stop(self, run_id: str, owner: str | None = None) -> bool:
        """Dequeue a queued job ("stopped"), or ask a running one to stop at its next step.
        False if this manager does not know the run or it has finished. With `owner` given (a
        public server), PermissionError for a live run of someone else."""
        self.store.path(run_id)  # RunIdError for anything that is not a run id
        with self._cond:
            job = self._jobs.get(run_id)
            if job is None or job.state not in LIVE_STATES:
                return False
            if owner is not None and job.owner != owner:
                raise PermissionError(f"run_id: {run_id!r} belongs to another user; you can stop only your own runs")
            if job.state == "running":
                job.stop_event.set()
                return True
            self._queue.remove(run_id)
            job.state = "stopped"
            self._cond.notify_all()
        if job.continuing:  # not started: the run is as it was before
            before = str(continuation.unqueue(self.store, run_id)["state"])
            with self._cond:
                job.state = before
            return True
        self.store.set_status(run_id, "stopped", finished_at=now_iso())
        return True

    def delete(self, run_id: str, owner: str | None = None) -> None:
        """Delete a finished run from the store (refused while queued or running; with `owner`
        given, PermissionError for someone else's run)."""
        self.store.path(run_id)  # RunIdError for anything that is not a run id
        with self._cond:
            job = self._jobs.get(run_id)
            if job is not None and owner is not None and job.owner != owner:  # someone else's: whatever its state
                raise PermissionError(f"run_id: {run_id!r} belongs to another user; you can delete only your own runs")
            if job is not None and job.state in LIVE_STATES:
                raise ValueError(f"run_id: {run_id!r} is {job.state}; stop it before deleting")
        self.store.delete(run_id, owner=owner)
        if self.backup is not None:
            forget(run_id, self.backup)
        with self._cond:
            self._jobs.pop(run_id, None)

    def shutdown(self, wait: bool = False, stop_running: bool = True) -> None:
        """Refuse new runs; queued ones become "interrupted"; running ones are asked to stop
        (if `stop_running`); with `wait`, block until the workers have exited."""
        with self._cond:
            self._closed = True
            dropped = list(self._queue)
            self._queue.clear()
            resumed = {run_id for run_id in dropped if self._jobs[run_id].continuing}
            for run_id in dropped:
                self._jobs[run_id].state, self._jobs[run_id].error = "interrupted", _SHUT_DOWN
            if stop_running:
                for job in self._jobs.values():
                    if job.state == "running":
                        job.stop_event.set()
            self._cond.notify_all()
            workers = list(self._workers)
        for run_id in dropped:
            if run_id in resumed:  # a continuation not started: the run stays as it was
                continuation.unqueue(self.store, run_id)
                continue
            self.store.set_status(run_id, "interrupted", error=_SHUT_DOWN, finished_at=now_iso())
        if self.pool is not None:
            self.pool.close()
        if wait:
            for worker in workers:
                worker.join()

    # ---- queries ------------------------------------------------------------------
    def status(self, run_id: str) -> JobStatus:
        """Live progress for this manager's jobs; for other runs, what the store says."""
        with self._cond:
            job = self._jobs.get(run_id)
            if job is not None:
                return self._snapshot(job)
        return self._from_store(run_id)

    def jobs(self) -> list[JobStatus]:
        """Every job this manager knows: running, then queued (in order), then finished."""
        order = {"running": 0, "queued": 1}
        with self._cond:
            snaps = [self._snapshot(job) for job in self._jobs.values()]
        return sorted(snaps, key=lambda s: (order.get(s.state, 2), s.queue_position or 0))

    def estimate(self, cfgs: Sequence[RunConfig], owner: str = "", batch: bool = True) -> Estimate:
        """How long until the last of these runs would be done if submitted now (by `owner`, as one
        `submit_many(cfgs, owner, batch)`), from this server's measured speed, its jobs training now and
        the fair queue ahead (lab/engine/estimate.py). Cheap (no store reads): it runs on every knob change.
        `.wall_s` is the time, `.text()` a sentence saying it and where it comes from."""
        keys = [batch_key(c) if batch and self.batch_seeds else None for c in cfgs]
        mine = group_jobs((owner, c, k if keys.count(k) > 1 else None) for c, k in zip(cfgs, keys))
        self._probe()
        with self._cond:
            running = tuple(self._speed.running(key) for key in self._speed.live)
            queued = group_jobs((j.owner, j.cfg, j.group) for j in map(self._jobs.get, self._queue) if j.cfg)
            server = Server(self.max_concurrent, self._speed.n_cores, running, queued, tuple(self._speed.samples),
                            self._speed.capacity(time.monotonic()))
        return forecast(server, mine, owner)

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

    def wait(self, run_id: str, timeout: float | None = None) -> JobStatus:
        """Block until the run reaches a terminal state; TimeoutError after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            job = self._jobs.get(run_id)
            while job is not None and job.state in LIVE_STATES:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"run_id: {run_id!r} still {job.state} after {timeout} s")
                self._cond.wait(left)
            if job is not None:
                return self._snapshot(job)
        while True:  # a run of another process: poll the store
            snap = self._from_store(run_id)
            if snap.state in TERMINAL_STATES:
                return snap
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run_id: {run_id!r} still {snap.state} after {timeout} s")
            time.sleep(0.2)

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

    # ---- the worker ---------------------------------------------------------------
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
