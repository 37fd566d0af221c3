"""Background jobs: queue, concurrency cap, stop, failures, and record_run's bookkeeping."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from lab.engine.environment import detect
from lab.engine.jobs import JobManager, JobStatus
from lab.engine.recorder import record_run
from lab.engine.store import RunStore
from tests.helpers import WAIT, FakeTrainer, named, tiny_config, wait_for
from lab.records import EXACT_MATCH, LOSS, TOKEN_ACC

CFG = tiny_config(steps=20, eval_every=10)

@pytest.fixture()
def store(tmp_path: Path) -> RunStore:
    s = RunStore(tmp_path / "runs")
    yield s
    s.close()


def test_record_run_records_everything(store):
    run_id = store.create(CFG)
    seen = []
    result = record_run(store, run_id, train_fn=FakeTrainer(step_s=0), threads=3, on_record=seen.append)
    assert result.steps_done == 20 and len(seen) == 22
    status = store.status(run_id)
    assert (status["state"], status["step"], status["error"]) == ("completed", 20, None)
    assert status["started_at"] <= status["finished_at"]
    df = store.metrics(run_id)
    assert (df["kind"] == "train").sum() == 20 and df[df["kind"] == "eval"][EXACT_MATCH].tolist() == [0.8]
    assert torch.equal(store.load_weights(run_id)["w"], torch.arange(6.0).reshape(2, 3))
    assert store.snapshot_steps(run_id) == [0]
    assert store.summary(run_id) == {
        "params": 42, "steps": 20, "train_loss": 0.05, "eval": {LOSS: 0.5, TOKEN_ACC: 0.9, EXACT_MATCH: 0.8},
        "ood": {LOSS: 1.5, TOKEN_ACC: 0.4, EXACT_MATCH: 0.1}, "wall_s": result.wall_s,
        "tokens_per_s": 100.0, "device": "cpu", "stopped": False, "train_set": None}  # a fake measures no train set
    with pytest.raises(ValueError, match="is completed, not queued"):
        record_run(store, run_id, train_fn=FakeTrainer())


def test_record_run_failure_is_recorded_and_reraised(store):
    run_id = store.create(named("bad"))
    with pytest.raises(RuntimeError, match="boom"):
        record_run(store, run_id, train_fn=FakeTrainer(fail_on="bad"))
    status = store.status(run_id)
    assert (status["state"], status["error"]) == ("failed", "boom: bad things")  # one line


def test_submit_returns_at_once_and_queue_positions(store):
    gate = threading.Event()
    fake = FakeTrainer(gate=gate)
    jm = JobManager(store, max_concurrent=1, train_fn=fake)
    start = time.perf_counter()
    ids = [jm.submit(named(f"r{i}"), owner="ada") for i in range(3)]
    assert time.perf_counter() - start < 5  # the first job is blocked on the gate
    wait_for(lambda: jm.status(ids[0]).state == "running")
    assert [jm.status(r).queue_position for r in ids] == [None, 1, 2]
    assert [s.run_id for s in jm.jobs()] == ids
    assert store.status(ids[2])["state"] == "queued" and jm.status(ids[2]).owner == "ada"
    gate.set()
    final = [jm.wait(r, timeout=WAIT) for r in ids]
    assert [s.state for s in final] == ["completed"] * 3 and fake.peak == 1
    assert [c["name"] for c in fake.calls] == ["r0", "r1", "r2"]  # FIFO
    assert {c["threads"] for c in fake.calls} == {detect().cpus}  # every usable CPU, not the host's count
    done = jm.status(ids[0])
    assert (done.step, done.total_steps, done.last_loss, done.queue_position, done.eta_s) == (20, 20, 0.05, None, None)
    jm.shutdown(wait=True)


def test_live_progress_and_stop_running_job(store):
    jm = JobManager(store, max_concurrent=1, train_fn=FakeTrainer(step_s=0.01))
    run_id = jm.submit(named("long", steps=100_000))
    wait_for(lambda: jm.status(run_id).step >= 3)
    snap = jm.status(run_id)
    assert snap.state == "running" and snap.steps_per_s > 0 and snap.eta_s > 0 and snap.last_loss is not None
    assert jm.stop(run_id) is True
    at_stop = jm.status(run_id).step
    final = jm.wait(run_id, timeout=WAIT)
    assert final.state == "stopped" and at_stop <= final.step <= at_stop + 2  # stops at the next check
    assert store.status(run_id)["state"] == "stopped" and store.summary(run_id)["stopped"] is True
    assert jm.stop(run_id) is False and jm.stop("unknown-run") is False
    jm.shutdown(wait=True)


def test_stop_queued_job(store):
    gate = threading.Event()
    fake = FakeTrainer(gate=gate)
    jm = JobManager(store, max_concurrent=1, train_fn=fake)
    first, second, third = (jm.submit(named(n)) for n in ("a", "b", "c"))
    wait_for(lambda: jm.status(first).state == "running")  # else `first` may still be queued ahead of `third`
    assert jm.stop(second) is True
    assert jm.status(second).state == "stopped" and jm.status(third).queue_position == 1
    assert store.status(second)["state"] == "stopped"
    gate.set()
    assert jm.wait(third, timeout=WAIT).state == "completed"
    assert [c["name"] for c in fake.calls] == ["a", "c"]
    jm.shutdown(wait=True)


def test_failing_job_is_failed_and_worker_goes_on(store):
    fake = FakeTrainer(fail_on="bad")
    jm = JobManager(store, max_concurrent=1, train_fn=fake)
    bad, good = jm.submit(named("bad")), jm.submit(named("good"))
    failed = jm.wait(bad, timeout=WAIT)
    assert (failed.state, failed.error) == ("failed", "boom: bad things")
    assert store.status(bad)["error"] == "boom: bad things"
    assert jm.wait(good, timeout=WAIT).state == "completed"
    assert fake.calls[0]["thread"] == fake.calls[1]["thread"]  # the same worker survived
    jm.shutdown(wait=True)


def test_an_error_outside_training_fails_the_run_but_keeps_the_worker(store, monkeypatch):
    """Even an exception the training wrapper does not catch leaves the slot working (one slot here)."""
    real, calls = JobManager._train, []

    def flaky(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("disk on fire")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(JobManager, "_train", flaky)
    jm = JobManager(store, max_concurrent=1, train_fn=FakeTrainer())
    bad, good = jm.submit(named("bad")), jm.submit(named("good"))
    st = jm.wait(bad, timeout=30)
    assert st.state == "failed" and "disk on fire" in st.error
    assert store.status(bad)["state"] == "failed"  # recorded, not left "running"
    assert jm.wait(good, timeout=30).state == "completed"
    jm.shutdown(wait=True)


def test_listing_skips_links_and_dotted_names(store, tmp_path):
    """A symlink or a 'a..b' folder in the store is no run: listing skips it instead of failing."""
    good = store.create(named("good"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (store.root / "linked").symlink_to(outside, target_is_directory=True)
    (store.root / "a..b").mkdir()
    assert list(store.list()["run_id"]) == [good]


def test_two_jobs_run_concurrently(store):
    gate = threading.Event()
    fake = FakeTrainer(gate=gate)
    jm = JobManager(store, max_concurrent=2, train_fn=fake)
    gate.set()
    assert jm.wait(jm.submit(named("warm-up")), timeout=WAIT).state == "completed"  # leaves an idle worker
    gate.clear()
    ids = [jm.submit(named(n)) for n in ("a", "b", "c")]
    wait_for(lambda: fake.active == 2)
    assert [jm.status(r).state for r in ids] == ["running", "running", "queued"]
    gate.set()
    assert all(jm.wait(r, timeout=WAIT).state == "completed" for r in ids)
    assert fake.peak == 2 and {c["threads"] for c in fake.calls} == {1}
    jm.shutdown(wait=True)


def test_status_of_unmanaged_run_and_shutdown(store):
    other = store.create(CFG, owner="bob")
    jm = JobManager(store, max_concurrent=1, train_fn=FakeTrainer(step_s=0.01))
    assert jm.status(other) == JobStatus(other, "queued", "bob", 0, 20, None, None, None, None, None)
    running = jm.submit(named("long", steps=100_000))
    queued = jm.submit(named("next"))
    wait_for(lambda: jm.status(running).step >= 1)
    jm.shutdown(wait=True)
    assert jm.status(running).state == "stopped"
    assert store.status(queued)["state"] == "interrupted"
    with pytest.raises(RuntimeError, match="shut down"):
        jm.submit(CFG)
    with pytest.raises(TimeoutError):
        JobManager(store, max_concurrent=1).wait(other, timeout=0.3)


def test_max_concurrent_from_env(store, monkeypatch):
    monkeypatch.setenv("LAB_MAX_CONCURRENT", "3")
    assert JobManager(store).max_concurrent == 3
    monkeypatch.setenv("LAB_MAX_CONCURRENT", "many")
    with pytest.raises(ValueError, match="LAB_MAX_CONCURRENT"):
        JobManager(store)
    with pytest.raises(ValueError, match="max_concurrent"):
        JobManager(store, max_concurrent=0)


@pytest.mark.app
def test_real_training_through_job_manager(store):
    pytest.importorskip("lab.trainer")
    jm = JobManager(store, max_concurrent=1)
    run_id = jm.submit(CFG)
    final = jm.wait(run_id, timeout=120)
    jm.shutdown(wait=True)
    assert final.state == "completed", final.error
    assert store.status(run_id)["state"] == "completed"
    df = store.metrics(run_id)
    assert df[df["kind"] == "train"]["step"].max() == 20 and df[df["kind"] == "eval"]["step"].tolist() == [10, 20]
    summary = store.summary(run_id)
    assert summary["steps"] == 20 and summary["params"] > 0 and 0 <= summary["eval"][EXACT_MATCH] <= 1
    weights = store.load_weights(run_id)
    assert sum(t.numel() for t in weights.values()) >= summary["params"]
    assert store.snapshot_steps(run_id)[-1] == 20
