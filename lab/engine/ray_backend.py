"""Training on a Ray cluster (https://docs.ray.io): the job manager's third place to train, beside worker
processes (lab/engine/pool.py) and threads. Only this module imports Ray, and only the job manager imports
this module, when LAB_RAY_ADDRESS or `--ray` asks for it (lab/engine/environment.py).

Each run is one Ray task with its own resources (`num_cpus` = its torch threads, `num_gpus` = LAB_RAY_GPUS,
a fraction of a GPU), the `lab` package shipped to the cluster with Ray's runtime environment
(`py_modules`). The task is a Ray generator (streaming): it trains in a thread and yields each record,
checkpoint and the final result as they come. The driver (this process) replays them into the same
callbacks a local run calls (lab/engine/recorder.py), so it stays the only writer of the run store, and
Compare shows a Ray run's curves live exactly as a local run's.

Stop: the driver sets the run's flag on a small actor pinned to the driver's node (`StopFlags`), which the
task polls without blocking (every FLAG_POLL_S); a task that has not ended STOP_GRACE_S after the flag is
cancelled, as the last resort. A lost node or a dead task surfaces as a Ray exception on the driver, which
becomes the run's failure with the reason in words (`ray_failure`). The queue, fairness and limits stay the
job manager's: this pool trains what a slot hands it, one run per task (no batched seed groups).
"""
from __future__ import annotations

import functools
import logging
import os
import queue
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from lab.config import ConfigError, RunConfig
from lab.engine.recorder import Outcome, RunLost, outcomes
from lab.engine.store import RunStore
from lab.records import Record

log = logging.getLogger(__name__)
FLAG_POLL_S = 0.25  # how often a task asks whether its run was stopped
BATCH_S = 0.1  # a task sends what training made within this long as one object (live curves: 10 per second)
STOP_GRACE_S = 30.0  # after a stop, how long a task may take to end before it is cancelled
LOCAL = "local"  # LAB_RAY_ADDRESS=local: start a one-machine cluster in this process


def connect(address: str, field: str = "LAB_RAY_ADDRESS") -> None:
    """Join the cluster at `address` ("auto": the one running on this machine, "local": start one here,
    else host:port or ray://host:port), shipping the `lab` package with the runtime environment. ConfigError
    naming `field` when there is no cluster there."""
    if ray.is_initialized():
        return
    lab_dir = str(Path(__file__).resolve().parents[1])  # the `lab` package, as the tasks import it
    runtime_env = {"py_modules": [lab_dir], "env_vars": {"OMP_NUM_THREADS": "1"}}
    options: dict[str, Any] = dict(runtime_env=runtime_env, namespace="lab", log_to_driver=False,
                                   logging_level=logging.WARNING)
    try:
        if address not in (LOCAL, "auto"):
            _reachable(address)
        if address == LOCAL:
            ray.init(include_dashboard=False, **options)
        else:
            ray.init(address=address, **options)
    except (ConnectionError, RuntimeError, ValueError, OSError) as exc:
        raise ConfigError(field, f"no Ray cluster answers at {address!r} ({' '.join(str(exc).split())[:300]}); "
                          "allowed: auto (a cluster started on this machine with `ray start --head`), local (start "
                          "one in this process), or host:port of a cluster's head") from None


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """OSError unless something listens at host:port (ray.init would retry an unreachable one for minutes)."""
    host, sep, port = address.split("://")[-1].rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not host:port")
    socket.create_connection((host, int(port)), timeout=timeout_s).close()


@ray.remote(num_cpus=0)
class StopFlags:
    """The runs asked to stop, polled by their tasks."""

    def __init__(self) -> None:
        self.stopped: set[str] = set()

    def set(self, run_id: str) -> None:
        self.stopped.add(run_id)

    def clear(self, run_id: str) -> None:
        self.stopped.discard(run_id)

    def get(self, run_id: str) -> bool:
        return run_id in self.stopped


class FlagWatch:
    """A task's `should_stop`: True once its run's flag is set. It asks the actor at most every FLAG_POLL_S
    and never waits for the answer inside a training step; an actor that cannot answer (its node is gone)
    is read as "not stopped", so the run goes on."""

    def __init__(self, flags: Any, run_id: str) -> None:
        self.flags, self.run_id = flags, run_id
        self.pending: Any = None
        self.asked = 0.0
        self.stopped = False

    def __call__(self) -> bool:
        if self.stopped or time.monotonic() - self.asked < FLAG_POLL_S:  # called every step: mostly this
            return self.stopped
        if self.pending is not None:
            ready, _ = ray.wait([self.pending], timeout=0)
            if not ready:
                return False
            try:
                self.stopped = bool(ray.get(self.pending))
            except ray.exceptions.RayError:
                pass
            self.pending = None
        else:
            self.pending = self.flags.get.remote(self.run_id)
        self.asked = time.monotonic()
        return self.stopped


@ray.remote(max_retries=0)
def train_task(cfg_json: str, run_id: str, flags: Any, threads: int, resume: Any,
               stop_at: Optional[int]) -> Iterator[tuple[str, Any]]:
    """On a cluster node: train one run, yielding lists of messages: [("where", (node id, node address,
    pid))] first, then ("record", Record) and ("checkpoint", Checkpoint) as training makes them, and last
    ("result", TrainResult)."""
    from lab.trainer import train

    out: queue.Queue[tuple[str, Any]] = queue.Queue()

    def work() -> None:
        try:
            result = train(RunConfig.from_json(cfg_json), on_record=lambda r: out.put(("record", r)),
                           should_stop=FlagWatch(flags, run_id), threads=threads,
                           on_checkpoint=lambda ck: out.put(("checkpoint", ck)), resume=resume, stop_at=stop_at)
            out.put(("result", result))
        except BaseException as exc:  # re-raised in the task, so the driver sees the training's own error
            out.put(("error", exc))

    ctx = ray.get_runtime_context()
    yield [("where", (ctx.get_node_id(), ray.util.get_node_ip_address(), os.getpid()))]
    threading.Thread(target=work, name="lab-train", daemon=True).start()
    while True:  # what came within BATCH_S goes as one object: a record each step would cost more than the step
        batch = [out.get()]
        deadline = time.monotonic() + BATCH_S
        while batch[-1][0] == "record" or batch[-1][0] == "checkpoint":
            try:
                batch.append(out.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        if batch[-1][0] == "error":
            if batch[:-1]:
                yield batch[:-1]
            raise batch[-1][1]
        yield batch
        if batch[-1][0] == "result":
            return


def ray_failure(exc: BaseException, where: str) -> BaseException:
    """What a Ray exception means for the run, as the exception its failure records. A training error
    raised on the node comes back as itself (the same message as a local run's)."""
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = getattr(exc, "cause", None)
        return cause if isinstance(cause, Exception) else RunLost(str(exc).splitlines()[0])
    at = f" (node {where})" if where else ""
    first = " ".join(str(exc).split()).split(". ")[0]
    if isinstance(exc, ray.exceptions.NodeDiedError):
        return RunLost(f"the Ray node training this run died{at}: {first}")
    if isinstance(exc, ray.exceptions.ObjectLostError):  # what the task sent lived in the lost node's store
        return RunLost(f"the Ray node training this run was lost with what it had sent{at}: {first}")
    if isinstance(exc, ray.exceptions.WorkerCrashedError):
        return RunLost(f"the Ray worker process training this run died{at} (killed, or out of memory)")
    if isinstance(exc, ray.exceptions.TaskCancelledError):
        return RunLost(f"its Ray task was cancelled{at}: it did not stop within {STOP_GRACE_S:.0f} s of the "
                       "stop (the last checkpoint is kept)")
    return RunLost(f"Ray: {type(exc).__name__}{at}: {first}")


class RayPool:
    """The job manager's pool for a Ray cluster: `run` trains one run as a Ray task and blocks until it
    ends, like WorkerPool.run (lab/engine/pool.py)."""

    def __init__(self, address: str, gpus_per_run: float = 0.0, field: str = "LAB_RAY_ADDRESS") -> None:
        connect(address, field)
        self.address, self.gpus_per_run = address, gpus_per_run
        here = ray.get_runtime_context().get_node_id()
        # on the driver's node: the flags live as long as the driver, whichever node is lost
        self.flags = StopFlags.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()
        self.where: dict[str, str] = {}  # run id -> "node at address", while its task runs

    def slots(self) -> int:
        """Runs the cluster can train at once (one CPU each), at least one."""
        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def describe(self) -> str:
        res = ray.cluster_resources()
        gpus = f", {res['GPU']:g} GPUs" if res.get("GPU") else ""
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        return (f"Ray cluster at {self.address}: {nodes} node{'s' if nodes != 1 else ''}, {res.get('CPU', 0):g} "
                f"CPU{'s' if res.get('CPU', 0) != 1 else ''}{gpus}")

    def warm_up(self, n: Optional[int] = None) -> None:
        """Nothing to warm: the cluster's workers are Ray's."""

    def close(self) -> None:
        """Nothing to close: tasks end with their runs; the connection ends with this process."""

    def run(self, store: RunStore, run_ids: list[str], stops: dict[str, threading.Event], threads: int,
            on_record: Callable[[str, Record], None], train_fn: Optional[Callable[..., Any]] = None
            ) -> dict[str, Outcome]:
        """Train queued runs one after another, each as a Ray task, recording them in `store` here."""
        if train_fn is not None:
            raise ValueError("train_fn: a custom trainer cannot run on Ray (the tasks run lab.trainer.train)")
        ends: dict[str, Outcome] = {}
        for rid in run_ids:
            remote = functools.partial(self._train, store, rid)
            ends |= outcomes(store, [rid], {rid: stops[rid].is_set}, threads,
                             {rid: functools.partial(on_record, rid)}, remote)
        return ends

    def _train(self, store: RunStore, run_id: str, cfg: RunConfig, on_record: Callable[[Record], None],
               should_stop: Callable[[], bool], threads: Optional[int], *, on_checkpoint: Callable[[Any], None],
               resume: Any = None, stop_at: Optional[int] = None) -> Any:
        """lab.trainer.train's signature, trained by a Ray task: its records, checkpoints and result come
        back here in order and go to the same callbacks."""
        threads = threads or 1
        gen = train_task.options(num_cpus=threads, num_gpus=self.gpus_per_run).remote(
            cfg.to_json(), run_id, self.flags, threads, resume, stop_at)
        done = threading.Event()
        threading.Thread(target=self._watch_stop, args=(run_id, gen, should_stop, done), daemon=True,
                         name=f"lab-ray-stop-{run_id}").start()
        try:
            for ref in gen:
                for kind, value in ray.get(ref):
                    if self._take(store, run_id, kind, value, on_record, on_checkpoint):
                        return value
            raise RunLost("its Ray task ended without a result")
        except ray.exceptions.RayError as exc:
            raise ray_failure(exc, self.where.get(run_id, "")) from None
        finally:
            done.set()
            self.where.pop(run_id, None)
            self.flags.clear.remote(run_id)

    def _take(self, store: RunStore, run_id: str, kind: str, value: Any, on_record: Callable[[Record], None],
              on_checkpoint: Callable[[Any], None]) -> bool:
        """One message of the task, handed to the local callbacks; True for the final result."""
        if kind == "where":
            node, ip, pid = value
            self.where[run_id] = f"{node[:8]} at {ip}"
            store.set_status(run_id, "running", ray_node=node, ray_node_ip=ip, ray_pid=pid)
        elif kind == "record":
            on_record(value)
        elif kind == "checkpoint":
            on_checkpoint(value)
        return kind == "result"

    def _watch_stop(self, run_id: str, gen: Any, should_stop: Callable[[], bool], done: threading.Event) -> None:
        """Pass a stop on to the task's flag; cancel the task if it has not ended STOP_GRACE_S later."""
        while not done.wait(0.1):
            if should_stop():
                self.flags.set.remote(run_id)
                if not done.wait(STOP_GRACE_S):
                    log.warning("run %s did not stop within %.0f s: cancelling its Ray task", run_id, STOP_GRACE_S)
                    ray.cancel(gen, force=True)
                return
