"""Training a run in bounded chunks, each resuming from the last one's checkpoint: how a run trains on a
ZeroGPU Space, where the GPU exists only inside a `@spaces.GPU` call of bounded duration made from a
user's request, in a forked process (the `spaces` package, zero/wrappers.py), never for a background job.

A chunk trains the run for at most `seconds` and stops it there as a Stop click would: the recorder writes a
checkpoint at the step reached (lab/engine/recorder.py, lab/engine/continuation.py). The next chunk queues the
run's continuation to the same total and trains on from that checkpoint, so a run trained in chunks records
what one uninterrupted run would, bit for bit on the CPU (tests/test_chunks.py). Between chunks the run reads
"queued"; a chunk that reaches the total completes it.

Everything a chunk takes and returns is plain data (a folder, a run id, numbers): it crosses the pickling
queue of the forked GPU process. A Stop click cannot reach a flag inside that process, so a stop is asked
for with a file in the run's folder, which the chunk looks at every few steps.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from lab.engine import continuation
from lab.engine.recorder import record_run
from lab.engine.store import RunStore

STOP_FILE = "stop-requested"  # in the run's folder: the owner asked it to stop
CHECK_EVERY_S = 0.5  # how often a chunk looks for that file


@dataclass(frozen=True)
class Chunk:
    """Where a chunk left its run."""

    run_id: str
    step: int  # steps trained in all
    total: int  # the steps the run is to train
    state: str  # "completed"; "stopped" (by the owner); "paused" (the chunk's time was up); or "failed"
    device: str  # where it trained: "cuda" or "cpu"
    seconds: float  # the chunk's wall time
    error: Optional[str] = None

    @property
    def done(self) -> bool:
        return self.state != "paused"


def request_stop(store: RunStore, run_id: str) -> None:
    """Ask a run that trains in chunks to stop at its next check (also between chunks)."""
    (store.path(run_id) / STOP_FILE).touch()


def stop_requested(store: RunStore, run_id: str) -> bool:
    return (store.path(run_id) / STOP_FILE).exists()


def _clear_stop(store: RunStore, run_id: str) -> None:
    (store.path(run_id) / STOP_FILE).unlink(missing_ok=True)


def queue_next(store: RunStore, run_id: str, total: int) -> None:
    """Queue the continuation of a paused run to `total` (what the next chunk trains on from)."""
    continuation.queue(store, continuation.plan(store, run_id, total))


def run_chunk(runs_dir: str, run_id: str, seconds: float, threads: Optional[int] = None) -> Chunk:
    """Train the queued run (new, or a continuation queued by `queue_next`) for at most `seconds`, recording
    everything in the store at `runs_dir`. It trains where the run's config says (its device knob: `auto` is
    the GPU inside a ZeroGPU call, the CPU here)."""
    store = RunStore(runs_dir)
    t0 = time.monotonic()
    checked = [0.0]  # the first step looks at once (a stop asked for between chunks), then every CHECK_EVERY_S

    def halt() -> bool:
        now = time.monotonic()
        if checked[0] and now - t0 >= seconds:  # (never before the first step: every chunk makes progress)
            return True
        if now - checked[0] >= CHECK_EVERY_S:
            checked[0] = now
            return stop_requested(store, run_id)
        return False

    try:
        result = record_run(store, run_id, should_stop=halt, threads=threads)
    except Exception as exc:  # recorded as failed by the recorder; said to the caller in one line
        status = store.status(run_id)
        return Chunk(run_id, int(status.get("step") or 0), store.config(run_id).train.steps, "failed", "?",
                     time.monotonic() - t0, " ".join(str(exc).split())[:300] or type(exc).__name__)
    total = store.config(run_id).train.steps
    if not result.stopped:
        state = "completed"
    elif stop_requested(store, run_id):
        state = "stopped"
    else:
        state = "paused"
    if state != "paused":
        _clear_stop(store, run_id)
    return Chunk(run_id, result.steps_done, total, state, result.device, time.monotonic() - t0)


ChunkCall = Callable[[str, str, float], Chunk]  # (runs_dir, run_id, seconds) -> Chunk: run_chunk, or it on a GPU


def train_in_chunks(store: RunStore, run_id: str, seconds: float, call: ChunkCall = run_chunk) -> Iterator[Chunk]:
    """Train a queued run chunk after chunk until it completes, fails or its owner stops it; yields each
    chunk. `call` runs one chunk (on ZeroGPU: `run_chunk` inside a `@spaces.GPU` call). An exception from
    `call` (no GPU to be had) reaches the caller with the run queued for its next chunk, so the caller can
    hand it to the CPU queue (JobManager.resume) from its last checkpoint."""
    while True:
        chunk = call(str(store.root), run_id, seconds)
        if not chunk.done and stop_requested(store, run_id):  # asked to stop as the chunk's time ran out
            _clear_stop(store, run_id)
            chunk = Chunk(run_id, chunk.step, chunk.total, "stopped", chunk.device, chunk.seconds)
        if not chunk.done:
            queue_next(store, run_id, chunk.total)  # between chunks the run reads queued
        yield chunk
        if chunk.done:
            return
