"""Training in a worker process: the job manager's threads drive it, the GIL does not serialise it.

Why: a training step is tens to hundreds of small torch ops, each entered from Python, and the
web server shares the interpreter with any training thread; a process per job slot keeps the
page responsive, isolates a crash or an out-of-memory kill, and lets two runs use two cores
(measured in benchmarks/RESULTS.md: two runs at once ~1.8x the throughput of one alone).

Protocol (a job is one run, or a batched group of runs, see lab/batched.py):
  - The child is `python -m lab.engine.worker CTRL_FD EVENTS_FD`, a fresh interpreter (no fork of the
    threaded app, no re-import of the app's __main__). It imports torch once, then runs jobs one
    after another: a child whose job ended cleanly goes back to the spares, one per job slot, so
    runs start at once instead of after a 1.5-5 s import each.
  - parent -> child: ("run", store root, run ids, threads, train_fn), then ("stop", run_id).
    End-of-file on this pipe means the app died (or no longer needs the child): the child marks
    its runs interrupted and exits at once, so a killed server (even SIGKILL) leaves no training
    process behind.
  - child -> parent: ("step", run_id, StepRecord) for the live status, ("done", run_id, state,
    error) once per run. The child writes everything into the run folders itself (metrics,
    status, snapshots, weights, summary) through `RunStore`, exactly as `execute_run` does.
  - A child that exits without "done" (killed, out of memory, segfault) leaves its runs
    "failed", with the exit code or signal in the message, and is replaced.
One intra-op thread per child when several run at once (oversubscribing 2 cores slows steps
10-50x, docs/SCIENCE.md).
"""
from __future__ import annotations

import functools
import importlib
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Optional

from lab.records import Record, StepRecord
from lab.engine.store import LIVE_STATES, RunStore, now_iso

log = logging.getLogger(__name__)
MODES = ("thread", "process")
BATCH_ON_CPU = False  # measured 0.78x (batched slower) for the default run on this CPU: RESULTS.md
_POLL_S = 0.1  # how often the parent checks the stop flags while waiting for messages


def default_mode() -> str:
    """LAB_JOBS_MODE (thread | process); else process on POSIX (it passes pipe fds to children)."""
    env = os.environ.get("LAB_JOBS_MODE", "").strip().lower()
    if env:
        if env not in MODES:
            raise ValueError(f"LAB_JOBS_MODE: {env!r} is not one of {', '.join(MODES)}")
        return env
    return "process" if os.name == "posix" else "thread"


def batch_seeds_default() -> bool:
    """LAB_BATCH_SEEDS (on | off); else on with a CUDA GPU (tiny models are launch-bound there)
    and on the CPU as measured by benchmarks/run_all.py (batched-vs-sequential ratio)."""
    env = os.environ.get("LAB_BATCH_SEEDS", "").strip().lower()
    if env:
        if env not in ("on", "off"):
            raise ValueError(f"LAB_BATCH_SEEDS: {env!r} is not one of on, off")
        return env == "on"
    import torch

    return torch.cuda.is_available() or BATCH_ON_CPU


class _Child:
    """A started `python -m lab.engine.worker` process and our ends of its two pipes."""

    def __init__(self) -> None:
        c_ctrl, p_ctrl = os.pipe()  # parent writes, child reads
        p_ev, c_ev = os.pipe()  # child writes, parent reads
        root = str(Path(__file__).resolve().parents[1])  # the folder holding the lab package
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

    def close(self) -> None:
        self.ctrl.close()
        self.events.close()


_SPARE_LOCK = threading.Lock()
_SPARES: list[_Child] = []  # started children waiting for a job, torch imported; most recently used first
_BUSY = 0  # children running a job now
_WANTED = 1  # processes to keep, busy or spare: one per job slot (JobManager calls warm_up(max_concurrent))


def _take_child() -> _Child:
    """A warm spare if one is alive (the one that finished a job last), else a new child."""
    global _BUSY
    child = None
    with _SPARE_LOCK:
        _BUSY += 1
        while _SPARES and child is None:
            child = _SPARES.pop(0)
            if child.proc.poll() is not None:
                child.close()
                child = None
    if child is None:
        try:
            child = _Child()
        except BaseException:
            with _SPARE_LOCK:
                _BUSY -= 1  # no child to release: the job fails to start
            raise
    return child


def _release(child: _Child, reusable: bool) -> None:
    """A job has ended. A child that finished it cleanly waits for the slot's next job, so a slot keeps
    one process for job after job (no fresh import of torch per run); beyond one process per slot the
    extras exit. A child that died or was torn down is replaced, now that its job is over: importing
    torch while other runs train slows them (measured: two runs at once reached 1.2x the throughput of
    one alone with replacements importing beside them)."""
    global _BUSY
    with _SPARE_LOCK:
        _BUSY -= 1
        if reusable:
            _SPARES.insert(0, child)
        keep = max(0, _WANTED - _BUSY)
        extra, _SPARES[keep:] = _SPARES[keep:], []
    for c in extra:
        c.close()  # end-of-file: an idle child exits
    if not reusable:
        child.close()
        if child.proc.poll() is None:  # we are being torn down mid-job: take the child with us
            child.proc.kill()
        try:
            child.proc.wait(5)
        except subprocess.TimeoutExpired:
            log.warning("training process %s did not exit", child.proc.pid)
        threading.Thread(target=warm_up, name="lab-spare-worker", daemon=True).start()


def warm_up(n: Optional[int] = None) -> None:
    """Keep `n` (default: as many as last asked for) worker processes started, busy or spare, so that
    as many runs submitted at once each start at once instead of after a 1.5-5 s import of torch."""
    global _WANTED
    with _SPARE_LOCK:
        if n is not None:
            _WANTED = max(_WANTED, n)
        _SPARES[:] = [c for c in _SPARES if c.proc.poll() is None]
        try:
            while len(_SPARES) + _BUSY < _WANTED:
                _SPARES.append(_Child())
        except OSError:
            log.warning("could not start a spare training process", exc_info=True)


def _exit_message(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = " (killed: out of memory, or stopped from outside)" if name == "SIGKILL" else ""
        return f"the training process was killed by {name}{why}"
    return f"the training process exited unexpectedly (exit code {code})"


def run_in_process(
    store: RunStore,
    run_ids: list[str],
    stops: dict[str, threading.Event],
    threads: int,
    on_record: Callable[[str, Record], None],
    train_fn: Optional[Callable[..., Any]] = None,
) -> dict[str, tuple[str, Optional[str]]]:
    """Train queued runs (one, or a batched group) in a child process; block until it ends.
    Returns run_id -> (final state, error). Setting stops[run_id] stops that run at its next step."""
    child = _take_child()
    proc, ctrl, events = child.proc, child.ctrl, child.events
    outcome: dict[str, tuple[str, Optional[str]]] = {}
    sent: set[str] = set()
    reusable = False
    try:
        try:
            ctrl.send(("run", str(store.root), run_ids, threads, train_fn))
        except OSError:
            pass  # died while idle: reported below from its exit code
        while len(outcome) < len(run_ids):
            for rid, ev in stops.items():
                if ev.is_set() and rid not in sent:
                    sent.add(rid)
                    try:
                        ctrl.send(("stop", rid))
                    except OSError:
                        pass  # the child is gone; handled below
            try:
                if not events.poll(_POLL_S):
                    continue
                msg = events.recv()
            except (EOFError, OSError):
                break  # the child died
            if msg[0] == "step":
                on_record(msg[1], msg[2])
            elif msg[0] == "done":
                outcome[msg[1]] = (msg[2], msg[3])
        reusable = len(outcome) == len(run_ids) and proc.poll() is None
    finally:
        _release(child, reusable)
    missing = [rid for rid in run_ids if rid not in outcome]
    if missing:
        outcome.update(_fail_all(store, missing, _exit_message(proc.returncode)))
    return outcome


def execute(
    store: RunStore,
    run_ids: list[str],
    stops: dict[str, threading.Event],
    threads: int,
    on_record: Callable[[str, Record], None],
    mode: str = "thread",
    train_fn: Optional[Callable[..., Any]] = None,
) -> dict[str, tuple[str, Optional[str]]]:
    """Train queued runs, one alone or several as a batched group (lab/batched.py), in this
    thread or in a worker process; never raises. Returns run_id -> (final state, error)."""
    if mode == "process":
        try:
            return run_in_process(store, run_ids, stops, threads, on_record, train_fn)
        except Exception as exc:  # could not even start the process
            log.warning("could not start a training process", exc_info=True)
            return _fail_all(store, run_ids, f"could not start the training process: {exc}")
    from lab.engine.jobs import error_line, execute_run

    if len(run_ids) > 1:
        from lab.batched import execute_group

        should_stop = {r: e.is_set for r, e in stops.items()}
        records = {r: functools.partial(on_record, r) for r in run_ids}
        return {r: (s, e) for r, s, e in execute_group(store, run_ids, should_stop, threads, records)}
    rid = run_ids[0]
    try:
        result = execute_run(store, rid, should_stop=stops[rid].is_set, train_fn=train_fn, threads=threads,
                             on_record=functools.partial(on_record, rid))
        return {rid: ("stopped" if result.stopped else "completed", None)}
    except BaseException as exc:  # never let a job kill its worker
        error = error_line(exc)
        log.warning("run %s failed: %s", rid, error, exc_info=True)
        return {rid: ("failed", error)}


def _fail_all(store: RunStore, run_ids: list[str], error: str) -> dict[str, tuple[str, Optional[str]]]:
    for rid in run_ids:
        try:
            if store.status(rid).get("state") in LIVE_STATES + ("interrupted",):
                store.set_status(rid, "failed", error=error, finished_at=now_iso())
        except Exception:  # a damaged or deleted run: the in-memory status still says failed
            pass
    return {rid: ("failed", error) for rid in run_ids}


# ---- the child --------------------------------------------------------------------------
class _Inbox:
    """The child's one reader of the control pipe. A "run" message registers the job's stop flags
    here, before the next message is read, so a "stop" that follows at once is never missed; the
    job then waits in `jobs` for the main thread. End-of-file (the app died) marks the current
    job's runs interrupted and ends the process at once."""

    def __init__(self, ctrl: Any) -> None:
        self.ctrl = ctrl
        self.jobs: queue.Queue = queue.Queue()  # (root, run_ids, threads, train_fn, stops)
        self.lock = threading.Lock()
        self.root: Optional[str] = None  # the current job's store, while it has one
        self.stops: dict[str, threading.Event] = {}
        threading.Thread(target=self._listen, name="lab-parent-watch", daemon=True).start()

    def finished(self, stops: dict[str, threading.Event]) -> None:
        """The main thread is done with the job of `stops` (its runs are recorded as ended): they
        are no longer ours to mark. A next job already registered stays registered."""
        with self.lock:
            if self.stops is stops:
                self.root, self.stops = None, {}

    def _listen(self) -> None:
        while True:
            try:
                msg = self.ctrl.recv()
            except (EOFError, OSError):  # the app died: leave the runs readable as interrupted
                with self.lock:
                    root, run_ids = self.root, list(self.stops)
                if root is not None:
                    _mark_interrupted(RunStore(Path(root)), run_ids)
                os._exit(3)
            if msg[0] == "run":
                _, root, run_ids, threads, train_fn = msg
                stops = {rid: threading.Event() for rid in run_ids}
                with self.lock:
                    self.root, self.stops = root, stops
                self.jobs.put((root, run_ids, threads, train_fn, stops))
            elif msg[0] == "stop":
                with self.lock:
                    if msg[1] in self.stops:
                        self.stops[msg[1]].set()


def _mark_interrupted(store: RunStore, run_ids: list[str]) -> None:
    for rid in run_ids:
        try:
            if store.status(rid).get("state") in LIVE_STATES:
                store.set_status(rid, "interrupted", error="the app stopped while this run was training",
                                 finished_at=now_iso())
        except Exception:
            pass


def child_main(root: str, run_ids: list[str], threads: int, stops: dict[str, threading.Event], events: Any,
               finished: Callable[[dict[str, threading.Event]], None],
               train_fn: Optional[Callable[..., Any]] = None) -> None:
    """Train the runs of one job inside a worker process (see the module docstring)."""
    store = RunStore(Path(root))
    send_lock = threading.Lock()

    def send(msg: tuple) -> None:
        with send_lock:
            events.send(msg)

    def relay(rid: str, rec: Record) -> None:
        if isinstance(rec, StepRecord):
            send(("step", rid, rec))

    outcome = execute(store, run_ids, stops, threads, relay, "thread", train_fn)
    finished(stops)  # before "done": the parent may send the next job as soon as it has read it
    for rid, (state, error) in outcome.items():
        send(("done", rid, state, error))
    store.close()


def _preload() -> None:
    """The slow first-time work of a fresh interpreter, done while the spare waits for a job:
    importing torch and the trainer, and the optimiser's lazy import of torch._dynamo (~1.5 s)."""
    importlib.import_module("lab.batched")
    import torch

    torch.optim.AdamW([torch.zeros(1, requires_grad=True)], fused=True)


def main(argv: list[str]) -> int:
    """`python -m lab.engine.worker CTRL_FD EVENTS_FD`: import torch, then run jobs as they come, one at a
    time, until the app closes the pipe (or dies)."""
    ctrl, events = Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False)
    _preload()
    inbox = _Inbox(ctrl)
    while True:
        root, run_ids, threads, train_fn, stops = inbox.jobs.get()
        child_main(root, run_ids, threads, stops, events, inbox.finished, train_fn)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
