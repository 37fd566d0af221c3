"""Background execution, as the app and the CLI ask for it: admit runs under the server's limits
(lab/engine/limits.py) and queue them, queue a stored run's continuation from its checkpoint
(lab/engine/continuation.py), stop, delete, status, wait, and the time estimates. The slots that train
the queue are lab/engine/slots.py. Status snapshots are taken under one lock, from the latest records
each job has seen.
"""
from __future__ import annotations

import time
from typing import Sequence

from lab.batched import batch_key
from lab.config import ConfigError, RunConfig
from lab.engine import continuation
from lab.engine.backup import forget
from lab.engine.environment import detect
from lab.engine.estimate import Estimate, Server, forecast, group_jobs
from lab.engine.identity import code_version, identity
from lab.engine.limits import check_admission, check_owner
from lab.engine.sharing import Claim
from lab.engine.slots import SPARE_DELAY_S, JobSlots, JobStatus, _Job
from lab.engine.store import LIVE_STATES, TERMINAL_STATES, now_iso

__all__ = ["Claim", "JobManager", "JobStatus", "SPARE_DELAY_S"]
_SHUT_DOWN = "job manager shut down before the run started"


class JobManager(JobSlots):
    """Runs submitted configs on daemon worker threads, at most `max_concurrent` at once."""

    def submit(self, cfg: RunConfig, owner: str = "") -> str:
        """Create the run (queued) and enqueue it; returns its id at once. LimitError (before any
        run folder exists) when the server's limits refuse it."""
        return self.submit_many([cfg], owner=owner, batch=False)[0]

    def claim_many(self, cfgs: Sequence[RunConfig], owner: str = "", batch: bool = True,
                   seed_from: str = "") -> list[Claim]:
        """What Start, a preset and a grid ask for: for each config, the run that answers it
        (lab/engine/sharing.py): a run of the same identity this server has queued, is training or has
        completed, which `owner` now holds too (`attached`); else a new run, queued by `submit_many` (its
        limits, all or nothing, count only the new runs: distinct trainings, not clicks). `seed_from`
        ("class": the student's own seed) is recorded in a new run's status."""
        cfgs = list(cfgs)
        check_owner(self.limits, owner)  # an attachment is checked as a new run would be
        if not self.limits.share_runs:  # LAB_SHARE_RUNS=0: every request trains anew
            return [Claim(r, attached=False) for r in self.submit_many(cfgs, owner, batch, seed_from)]
        with self._claiming:  # one claim at a time: two clicks on one config never both create its run
            idents = [identity(c) for c in cfgs]
            claims: dict[str, Claim] = {}
            with self._cond:  # attach to what answers: found and held under one lock, so it cannot end between
                live = {r for r, j in self._jobs.items() if j.state in LIVE_STATES and not j.continuing}
                for ident in dict.fromkeys(idents):
                    run_id = self.shared.find(ident, live)
                    if run_id is not None:
                        self.shared.hold(run_id, owner)
                        claims[ident] = self._claim_of(run_id)
            new = {i: c for i, c in zip(idents, cfgs) if i not in claims}  # one run per identity asked for
            if new:
                ids = self.submit_many(list(new.values()), owner, batch, seed_from)
                claims |= {i: Claim(r, attached=False) for i, r in zip(new, ids)}
        return [claims[i] for i in idents]

    def attach(self, cfg: RunConfig, owner: str = "") -> Claim | None:
        """The run that answers `cfg` with `owner` attached to it, or None when no run does (nothing is
        queued): Train on GPU (ui/gpu.py) asks this before it trains a run of its own."""
        check_owner(self.limits, owner)
        if not self.limits.share_runs:
            return None
        with self._claiming, self._cond:
            live = {r for r, j in self._jobs.items() if j.state in LIVE_STATES and not j.continuing}
            run_id = self.shared.find(identity(cfg), live)
            if run_id is None:
                return None
            self.shared.hold(run_id, owner)
            return self._claim_of(run_id)

    def create_outside(self, cfg: RunConfig, owner: str = "") -> str:
        """Create a queued run that trains outside the queue (in GPU chunks), admitted by the server's limits
        and registered as the run that answers its configuration."""
        with self._claiming:
            self.admit(cfg, owner)
            run_id = self.store.create(cfg, owner=owner, identity=identity(cfg), code_version=code_version())
            with self._cond:
                self.shared.add(identity(cfg), run_id)
        return run_id

    def _claim_of(self, run_id: str) -> Claim:
        """The attached run as a Claim: its state, when it was queued and where it trained (lock held)."""
        status, job = self.store.status(run_id), self._jobs.get(run_id)
        summary = self.store.summary(run_id) if job is None or job.state not in LIVE_STATES else None
        device = str((summary or {}).get("device") or self._live_device())
        return Claim(run_id, attached=True, state=job.state if job is not None else str(status.get("state")),
                     trained_at=str(status.get("created_at") or ""), device=device,
                     code_version=str(status.get("code_version") or ""), bundle=str(status.get("bundle") or ""))

    def _live_device(self) -> str:
        """Where this server's queue trains ("cuda" or "cpu"), read once (a live run has no summary yet)."""
        if self._device is None:
            self._device = "cuda" if detect().cuda else "cpu"
        return self._device

    def holders(self, run_id: str) -> list[str]:
        """Who holds the run: its first starter and every student attached to it (lab/engine/sharing.py)."""
        with self._cond:
            return self.shared.holders(run_id)

    def submit_many(self, cfgs: list[RunConfig], owner: str = "", batch: bool = True,
                    seed_from: str = "") -> list[str]:
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
            for cfg in cfgs:
                self._admit(cfg, owner, len(cfgs))
            self._admitting[owner] = self._admitting.get(owner, 0) + len(cfgs)
        ids: list[str] = []
        try:
            marks = {"code_version": code_version(), **({"seed_from": seed_from} if seed_from else {})}
            for cfg in cfgs:
                ids.append(self.store.create(cfg, owner=owner, identity=identity(cfg), **marks))
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
                        self.shared.add(identity(cfg), run_id)
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
            self._admit(plan.cfg, owner)
            continuation.queue(self.store, plan)
            self.shared.drop(run_id)  # continued: no longer what its first config asked for
            self._jobs[run_id] = _Job(run_id, owner, plan.cfg.train.steps, cfg=plan.cfg, continuing=True)
            self._queue.append(run_id)
            self._start_worker_if_needed()
            self._cond.notify_all()
        return run_id

    def admit(self, cfg: RunConfig, owner: str = "") -> None:
        """LimitError if the server's limits would refuse one more run like `cfg` from `owner` now: for runs
        created outside the queue (Train on GPU, ui/gpu.py), which `adopt` may later take."""
        with self._cond:
            self._admit(cfg, owner)

    def _admit(self, cfg: RunConfig, owner: str, n: int = 1) -> None:
        """The admission check of `n` runs like `cfg` (lock held): per-user and queue limits, size, steps."""
        live = sum(1 for j in self._jobs.values() if j.owner == owner and j.state in LIVE_STATES)
        check_admission(self.limits, cfg, owner, live + self._admitting.get(owner, 0),
                        len(self._queue) + sum(self._admitting.values()), n=n)

    def adopt(self, run_id: str, owner: str = "") -> str:
        """Queue a run the store already holds as queued but no manager trains: a new run whose GPU chunk
        never started (lab/engine/chunks.py), or a continuation queued for one; it goes on from its checkpoint
        if it has one. It was admitted when it was created (`admit`): refusing it now would strand it."""
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
            self._jobs[run_id] = _Job(run_id, owner, steps, cfg=cfg, continuing=bool(status.get("continue_steps")))
            self._queue.append(run_id)
            self._start_worker_if_needed()
            self._cond.notify_all()
        return run_id

    def stop(self, run_id: str, owner: str | None = None) -> bool:
        """Dequeue a queued job ("stopped"), or ask a running one to stop at its next step.
        False if this manager does not know the run or it has finished. With `owner` given (a
        public server), PermissionError for a live run `owner` does not hold, and a run others hold too
        goes on for them: `owner` is only detached from it (lab/engine/sharing.py)."""
        self.store.path(run_id)  # RunIdError for anything that is not a run id
        with self._cond:
            job = self._jobs.get(run_id)
            if job is None or job.state not in LIVE_STATES:
                return False
            if owner is not None:  # a shared server: a holder among others only leaves the run
                holders = self.shared.holders(run_id)
                if owner not in holders:
                    raise PermissionError(f"run_id: {run_id!r} belongs to another user; you can stop only your own "
                                          "runs")
                if len(holders) > 1:
                    self.shared.release(run_id, owner)
                    return True
            self.shared.drop(run_id)
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

    def delete(self, run_id: str, owner: str | None = None) -> list[str]:
        """Delete a finished run from the store (refused while queued or running; with `owner` given,
        PermissionError for a run `owner` does not hold). On a shared server a run others hold too stays
        for them: `owner` is only detached. Returns who still holds it ([] once deleted)."""
        self.store.path(run_id)  # RunIdError for anything that is not a run id
        with self._cond:
            job = self._jobs.get(run_id)
            if owner is not None:
                holders = self.shared.holders(run_id)
                if owner not in holders:  # someone else's: whatever its state
                    raise PermissionError(f"run_id: {run_id!r} belongs to another user; you can delete only your "
                                          "own runs")
                if len(holders) > 1:
                    return self.shared.release(run_id, owner)
            if job is not None and job.state in LIVE_STATES:
                raise ValueError(f"run_id: {run_id!r} is {job.state}; stop it before deleting")
            self.shared.drop(run_id)
        self.store.delete(run_id, owner=owner)
        if self.backup is not None:
            forget(run_id, self.backup)
        with self._cond:
            self._jobs.pop(run_id, None)
        return []

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
