"""Time estimates: how long until runs submitted now are done, from the speed measured on this server.

A run's cost is modelled in seconds of one idle CPU core (lab/engine/cost.py). What a second of that
takes here now is measured: the runs training now (their step records: measured time per modelled
second), else the server's last finished runs, else a first guess (an idle core). Each measurement is
divided by the slowdown of its moment, `contention`: how many of our jobs trained at once, within the CPU
our jobs could get then (`capacity`, measured: other work on the machine takes its share, and Linux shares
the CPU between sessions, not threads, so the load average overstates it). Divided so, it applies to
another moment. Each finished run also measures its fixed cost outside the loop (hand-over to a worker
process, eval data, model build, saving).

`forecast` then replays the job manager: the jobs training now with their remaining work at their own
measured speed, the queue ahead taken fairly (lab/engine/jobs.py `_next_queued`: the oldest queued job
of the owner with the fewest jobs training), these runs last, `slots` at a time, every job slowed by how
many train at once. The answer is the time until the last of these runs is done, and a sentence that
says so and where the speed comes from.
"""
from __future__ import annotations

import hashlib
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Optional, Sequence

from lab.config import RunConfig
from lab.engine.environment import detect
from lab.engine.cost import FIXED_S, Cost, cost

PAIR_SLOWDOWN = 0.09  # each extra job's memory contention (benchmarks/RESULTS.md, "Runs at once")
PROBE_S = 0.06  # a capacity probe: this long, on one thread per core
PROBE_EVERY_S = 4.0  # at most one probe this often
PROBES_KEPT_S = 300.0  # capacity: the median of the last 5 minutes' probes (a run lasts minutes; a probe is
# a moment, and this machine's other work comes in bursts: a probe taken at one reads far too little)
MIN_CAPACITY = 0.25  # cores: below the slowest seen here under heavy load (benchmarks/RESULTS.md)
SAMPLES = 5  # measurements combined (median): the latest ones
MIN_MEASURED_S = 1.5  # a running job's speed counts once it has trained this long (its first steps are slow)
END_SHARE = 0.25  # of the fixed cost, the part after the training loop (weights, summary, status)


@dataclass(frozen=True)
class Job:
    """A job for the simulation: one run, or a batched group of seed repeats that trains as one."""

    owner: str
    work_s: float  # idle-core seconds of its training loop still to do
    runs: int = 1
    slowness: Optional[float] = None  # running: measured seconds per modelled second now (None: too early)
    fixed_left: float = 1.0  # the share of its fixed cost still to come (after its loop began: END_SHARE)


@dataclass(frozen=True)
class Sample:
    """What one finished job measured."""

    slowness: float  # its loop's measured seconds per modelled second
    fixed_s: float  # idle-core seconds of its fixed cost: slot time / slowness - modelled loop
    at_once: float  # our jobs training at once, on average, while it trained
    capacity: float  # cores' worth of CPU our jobs could get then


@dataclass(frozen=True)
class Server:
    """The job manager's state, taken under its lock (plain data: the forecast runs outside it)."""

    slots: int
    cores: int
    running: tuple[Job, ...]
    queued: tuple[Job, ...]  # in queue order
    finished: tuple[Sample, ...]  # recent, oldest first
    capacity: float  # cores' worth of CPU our jobs can get now (`probe_capacity`)


def group_jobs(runs: Iterable[tuple[str, RunConfig, Optional[Hashable]]]) -> tuple[Job, ...]:
    """(owner, config, batch group or None) of queued runs, in queue order -> jobs: the runs of one group
    train as one job (lab/batched.py), placed where its first run stands, its work the sum of theirs."""
    groups: dict[Any, list[tuple[str, RunConfig]]] = {}
    for i, (owner, cfg, group) in enumerate(runs):
        groups.setdefault(("run", i) if group is None else group, []).append((owner, cfg))
    return tuple(Job(g[0][0], sum(cost(c).loop_s for _, c in g), len(g)) for g in groups.values())


def contention(at_once: float, capacity: float, cores: int) -> float:
    """Seconds per idle-core second for each of `at_once` jobs training together when our jobs can get
    `capacity` cores' worth of CPU: a share of it each when there are more jobs than that, and a little
    memory contention between jobs on separate cores."""
    n = max(1.0, at_once)
    return max(1.0, n / max(capacity, MIN_CAPACITY)) * (1 + PAIR_SLOWDOWN * (min(n, cores) - 1))


def cores() -> int:
    """The CPUs this process may use (affinity, cgroup quota, a Space's CPU_CORES: lab/engine/environment.py)."""
    return detect().cpus


_BUFFER = bytes(1 << 16)  # hashing it releases the interpreter lock: the probe's threads run in parallel


def probe_capacity(running: int, n_cores: int, seconds: float = PROBE_S, threads: Optional[int] = None) -> float:
    """Cores' worth of CPU our jobs can get now: `threads` threads (default: one per core) work for `seconds`
    beside our `running` jobs (this process's children, scheduled in its group); if each got a share s of a
    core, the k + running threads shared s (k + running) cores, at most all of them. A free 2-core machine
    gives 2."""
    k = max(1, min(n_cores, threads or n_cores))
    spent = [0.0] * k

    def work(i: int) -> None:
        c0, w0 = time.thread_time(), time.perf_counter()
        while time.perf_counter() - w0 < seconds:
            hashlib.sha256(_BUFFER).digest()
        spent[i] = (time.thread_time() - c0) / max(time.perf_counter() - w0, 1e-9)

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(k)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    share = min(1.0, sum(spent) / k)
    return float(n_cores) if share >= 0.95 else min(float(n_cores), share * (k + running))


@dataclass(frozen=True)
class Speed:
    """Seconds per idle-core second of a job training alone on a free core here, and where it comes from."""

    factor: float
    basis: str  # "now": the runs training now; "recent": finished runs; "guess": nothing measured yet
    measured: int  # jobs it comes from
    fixed_s: float  # idle-core seconds of a run's fixed cost
    seen: float = 1.0  # what those jobs measured, as they ran (the median): the figure the text quotes


def speed(server: Server) -> Speed:
    n_now = len(server.running)
    now = [j.slowness / contention(n_now, server.capacity, server.cores) for j in server.running
           if j.slowness is not None]
    done = server.finished[-SAMPLES:]
    fixed = statistics.median([s.fixed_s for s in done]) if done else FIXED_S
    if now:
        seen = statistics.median([j.slowness for j in server.running if j.slowness is not None])
        return Speed(statistics.median(now[-SAMPLES:]), "now", len(now), fixed, seen)
    if done:
        factors = [s.slowness / contention(s.at_once, s.capacity, server.cores) for s in done]
        return Speed(statistics.median(factors), "recent", len(done), fixed, statistics.median(s.slowness for s in done))
    return Speed(1.0, "guess", 0, fixed)


def simulate(server: Server, mine: Sequence[Job], base: float) -> tuple[float, int]:
    """(seconds until the last of `mine` is done, runs that start before the first of them) when `mine` join
    the queue now: `server.slots` jobs at a time, the queue taken fairly, each job's remaining work at its
    speed (its measured one, else `base`) times the contention of the moment."""
    n_now = max(1, len(server.running))
    # [work left, seconds per idle-core second alone on a free core, owner, is mine]
    active = [[j.work_s, (j.slowness / contention(n_now, server.capacity, server.cores)) if j.slowness else base,
               j.owner, False] for j in server.running]
    queue = [(j, False) for j in server.queued] + [(j, True) for j in mine]
    t, last, left = 0.0, 0.0, len(mine)
    ahead, started = sum(j.runs for j in server.running), False

    def fill() -> None:  # free slots take the oldest queued job of the owner with the fewest training
        nonlocal ahead, started
        while queue and len(active) < server.slots:
            training: dict[str, int] = {}
            for a in active:
                training[a[2]] = training.get(a[2], 0) + 1
            i = min(range(len(queue)), key=lambda k: (training.get(queue[k][0].owner, 0), k))
            job, is_mine = queue.pop(i)
            started = started or is_mine
            ahead += 0 if started else job.runs
            active.append([job.work_s, base, job.owner, is_mine])

    fill()
    while left and active:
        slow = contention(len(active), server.capacity, server.cores)
        dt = min(a[0] * a[1] * slow for a in active)
        t += dt
        for a in active:
            a[0] -= dt / (a[1] * slow)
        for a in [a for a in active if a[0] <= 1e-9]:  # one by one, as the job manager's slots free up
            active.remove(a)
            if a[3]:
                left, last = left - 1, t
            fill()
    return last, ahead


@dataclass(frozen=True)
class Estimate:
    """The wall time until the last of the estimated runs is done if they are submitted now."""

    runs: int
    wall_s: float
    ahead: int  # runs training or queued that start before these
    training: int  # of those, the runs training now
    slots: int
    speed: Speed
    capacity: float  # cores' worth of CPU our jobs can get now
    cores: int

    def text(self, counted: bool = True) -> str:
        """One sentence: the wait, and what it comes from (`counted`: name the number of runs)."""
        n = self.runs
        what = "until it is done" if n == 1 else f"until all {n} runs are done" if counted else "until all are done"
        parts = []
        if self.ahead:
            queued = self.ahead - self.training
            which = ("training now" if not queued else "queued" if not self.training
                     else f"{self.training} training, {queued} queued")
            parts.append(f"{self.ahead} run{'s' if self.ahead != 1 else ''} ahead of {'it' if n == 1 else 'them'} "
                         f"({which})")
        if n > 1 or self.ahead:
            parts.append(f"{self.slots} at a time")
        sp = self.speed
        if sp.basis == "guess":
            parts.append("a first guess: nothing has trained on this server yet, so it assumes an idle core's speed")
        else:
            runs = f"run{'s' if sp.measured != 1 else ''}"
            where = (f"now, from the {runs} training" if sp.measured == 1 else f"now, from the {sp.measured} {runs} "
                     "training") if sp.basis == "now" else f"over its last {sp.measured} {runs}"
            parts.append(f"speed measured on this server {where}: {sp.seen:.1f}x the time of an idle core")
        if self.capacity < self.cores - 0.25:
            parts.append(f"other work leaves training about {self.capacity:.1f} of the machine's {self.cores} cores")
        return f"About {_dur(self.wall_s)} {what} ({'; '.join(parts)})."


def _dur(s: float) -> str:
    return f"{max(1.0, s):.0f} s" if s < 90 else f"{s / 60:.1f} min" if s < 5400 else f"{s / 3600:.1f} h"


def forecast(server: Server, mine: Sequence[Job], owner: str = "") -> Estimate:
    """The estimate for `mine` (jobs with their modelled idle-core work, fixed cost not included)."""
    sp = speed(server)

    def fixed(jobs: Iterable[Job]) -> tuple[Job, ...]:
        return tuple(Job(j.owner, j.work_s + sp.fixed_s * j.runs * j.fixed_left, j.runs, j.slowness) for j in jobs)

    wall, ahead = simulate(Server(server.slots, server.cores, fixed(server.running), fixed(server.queued),
                                  server.finished, server.capacity), fixed(Job(owner, j.work_s, j.runs) for j in mine),
                           sp.factor)
    return Estimate(sum(j.runs for j in mine), wall, ahead, sum(j.runs for j in server.running), server.slots, sp,
                    server.capacity, server.cores)


# ---- measuring: what the job manager feeds in (always under its lock) ---------------------------
@dataclass
class _Live:
    """A job training now: its runs' modelled costs and the step records seen so far."""

    owner: str
    costs: tuple[Cost, ...]
    start: float  # monotonic time a slot took it
    busy: float  # `SpeedLog.busy` then
    marks: deque = field(default_factory=deque)  # (elapsed_s, step) of its recent step records

    def upto(self, step: int) -> float:
        return sum(c.upto(step) for c in self.costs)

    def slowness(self) -> Optional[float]:
        """Measured seconds per modelled second over its last WINDOW_S of training (or since it began)."""
        if not self.marks:
            return None
        (e0, s0), (e1, s1) = self.marks[0], self.marks[-1]
        if e1 - e0 < MIN_MEASURED_S:
            e0, s0 = 0.0, 0
        modelled = self.upto(s1) - self.upto(s0)
        return (e1 - e0) / modelled if e1 - e0 >= MIN_MEASURED_S and modelled > 0 else None


WINDOW_S = 6.0  # a running job's speed is measured over its last few seconds


class SpeedLog:
    """The measurements behind the estimates: the jobs training now, finished jobs' samples, and capacity
    probes. Not thread-safe: the job manager calls it under its lock (and probes outside it). `now` is
    time.monotonic()."""

    def __init__(self, keep: int = 20) -> None:
        self.samples: deque[Sample] = deque(maxlen=keep)
        self.probes: deque[tuple[float, float]] = deque(maxlen=32)  # (when, capacity)
        self.live: dict[str, _Live] = {}
        self.busy, self._t = 0.0, None  # jobs training, integrated over time, and when last updated
        self.n_cores = cores()

    def _tick(self, now: float) -> None:
        self.busy += len(self.live) * (now - self._t) if self._t is not None else 0.0
        self._t = now

    def needs_probe(self, now: float) -> bool:
        return not self.probes or now - self.probes[-1][0] >= PROBE_EVERY_S

    def probed(self, capacity: float, now: float) -> None:
        self.probes.append((now, capacity))

    def capacity(self, now: float) -> float:
        """The median of the last 5 minutes' probes (the latest if older; all cores if none yet)."""
        recent = [c for t, c in self.probes if now - t <= PROBES_KEPT_S] or [c for _, c in list(self.probes)[-1:]]
        return statistics.median(recent) if recent else float(self.n_cores)

    def start(self, key: str, owner: str, costs: Sequence[Cost], now: float) -> None:
        self._tick(now)
        self.live[key] = _Live(owner, tuple(costs), now, self.busy)

    def step(self, key: str, step: int, elapsed_s: float) -> None:
        job = self.live.get(key)
        if job is None:
            return
        job.marks.append((elapsed_s, step))
        while len(job.marks) > 2 and job.marks[1][0] <= elapsed_s - WINDOW_S:
            job.marks.popleft()

    def end(self, key: str, completed: bool, now: float) -> None:
        """A job ended; a completed one whose loop was measured leaves a sample."""
        self._tick(now)
        job = self.live.pop(key, None)
        if job is None or not completed or not job.marks:
            return
        elapsed, step = job.marks[-1]
        modelled = job.upto(step)
        if elapsed < MIN_MEASURED_S or modelled <= 0:
            return
        slowness = elapsed / modelled
        total = sum(c.loop_s for c in job.costs)
        fixed = max(0.0, (now - job.start) / slowness - total) / len(job.costs)
        at_once = (self.busy - job.busy) / max(now - job.start, 1e-9)
        during = [c for t, c in self.probes if job.start - PROBE_EVERY_S <= t <= now]
        capacity = statistics.median(during) if during else self.capacity(now)
        self.samples.append(Sample(slowness, fixed, at_once, capacity))

    def running(self, key: str) -> Job:
        """The simulation's view of a live job: its loop's modelled work left and its measured speed."""
        job = self.live[key]
        step = job.marks[-1][1] if job.marks else 0
        left = sum(c.loop_s for c in job.costs) - job.upto(step)
        return Job(job.owner, max(0.0, left), len(job.costs), job.slowness(), END_SHARE if job.marks else 1.0)
