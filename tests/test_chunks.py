"""Training in bounded chunks (lab/engine/chunks.py), the path a ZeroGPU Space's GPU calls take: a run
trained one time-boxed chunk after another records what one uninterrupted run records, bit for bit on the
CPU; a stop asked for between chunks ends it; when no GPU can be had mid-run, the CPU queue goes on from the
last checkpoint to the same result. The `@spaces.GPU` wrapping of a chunk is tested in tests/test_gpu_ui.py."""
from __future__ import annotations

import pytest

from lab.engine.chunks import Chunk, request_stop, run_chunk, train_in_chunks
from lab.engine.jobs import JobManager
from lab.engine.recorder import record_run
from lab.engine.store import RunStore
from tests.helpers import RESUMABLE, same_run, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def test_one_step_chunks_equal_one_go(tmp_path):
    """A budget of a millisecond: every chunk trains exactly one step (a chunk always makes progress), so
    six steps take six chunks, each resuming the last one's checkpoint."""
    store = RunStore(tmp_path / "runs")
    cfg = tiny_config(RESUMABLE, arch="decoder", dropout=0.1, steps=6)
    whole = store.create(cfg)
    record_run(store, whole, threads=1)
    chunked = store.create(cfg)
    chunks = list(train_in_chunks(store, chunked, seconds=0.001))
    assert [c.step for c in chunks] == [1, 2, 3, 4, 5, 6]
    assert [c.state for c in chunks] == ["paused"] * 5 + ["completed"] and chunks[-1].done
    assert all(c.total == 6 and c.device == "cpu" for c in chunks)
    same_run(store, whole, chunked)
    assert store.status(chunked)["state"] == "completed" and store.config(chunked) == cfg


def test_an_encoder_decoder_in_time_boxed_chunks_equals_one_go(tmp_path):
    store = RunStore(tmp_path / "runs")
    cfg = tiny_config(RESUMABLE, arch="encoder-decoder", dropout=0.1, schedule="linear", steps=30)
    whole = store.create(cfg)
    record_run(store, whole, threads=1)
    chunked = store.create(cfg)
    chunks = list(train_in_chunks(store, chunked, seconds=0.05))
    assert len(chunks) >= 2 and chunks[-1].state == "completed" and chunks[-1].step == 30
    same_run(store, whole, chunked)


def test_a_stop_asked_for_ends_the_run_at_its_next_check(tmp_path):
    store = RunStore(tmp_path / "runs")
    run = store.create(tiny_config(RESUMABLE, steps=30))
    seen: list[Chunk] = []
    for chunk in train_in_chunks(store, run, seconds=0.001):
        seen.append(chunk)
        if len(seen) == 2:
            request_stop(store, run)  # between chunks: the next one stops at once
    assert [c.state for c in seen] == ["paused", "paused", "stopped"] and seen[-1].step == 2
    assert store.status(run)["state"] == "stopped" and not (store.path(run) / "stop-requested").exists()


def test_when_no_gpu_can_be_had_the_cpu_queue_goes_on_from_the_checkpoint(tmp_path):
    """The third chunk's GPU call fails (quota spent): the run is queued for its next chunk; the job manager
    adopts it and trains it to the end from its last checkpoint, as if nothing had happened."""
    store = RunStore(tmp_path / "runs")
    cfg = tiny_config(RESUMABLE, arch="decoder", dropout=0.1, steps=12)
    whole = store.create(cfg)
    record_run(store, whole, threads=1)
    run = store.create(cfg)
    calls = []

    def gpu(runs_dir: str, run_id: str, seconds: float) -> Chunk:
        calls.append(run_id)
        if len(calls) == 3:
            raise RuntimeError("ZeroGPU quota exceeded")
        return run_chunk(runs_dir, run_id, seconds, threads=1)

    with pytest.raises(RuntimeError):
        for _ in train_in_chunks(store, run, seconds=0.001, call=gpu):
            pass
    assert store.status(run)["state"] == "queued" and store.status(run)["continue_steps"] == 12
    jobs = JobManager(store, max_concurrent=1, mode="thread")
    try:
        assert jobs.adopt(run, owner="u1") == run
        assert jobs.wait(run, timeout=120).state == "completed"
    finally:
        jobs.shutdown(wait=True)
    same_run(store, whole, run)


def test_a_new_run_whose_first_chunk_never_started_trains_in_the_cpu_queue(tmp_path):
    store = RunStore(tmp_path / "runs")
    cfg = tiny_config(RESUMABLE, steps=8)
    whole, run = store.create(cfg), store.create(cfg)
    record_run(store, whole, threads=1)
    jobs = JobManager(store, max_concurrent=1, mode="thread")
    try:
        jobs.adopt(run, owner="u1")
        assert jobs.wait(run, timeout=120).state == "completed"
        with pytest.raises(Exception, match="not queued"):  # a finished run is not adopted again
            jobs.adopt(run, owner="u1")
    finally:
        jobs.shutdown(wait=True)
    same_run(store, whole, run)
