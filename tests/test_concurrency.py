"""Process mode of the job manager (lab/engine/worker.py): same results as thread mode, live status,
stop, a crashed or killed child becomes "failed", and a killed server leaves no training process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lab.config import RunConfig
from lab.engine.jobs import JobManager
from lab.engine.store import RunStore
from lab.engine.storefs import process_token
from tests.helpers import descendants, tiny_config
from lab.records import EXACT_MATCH, LOSS, TOKEN_ACC

REPO = Path(__file__).resolve().parents[1]
WAIT = 120.0  # a fresh worker imports torch; the host is shared and noisy
CFG = tiny_config(n_ctx=32, n_symbols=5, steps=30, batch_size=16, eval_every=15, eval_samples=32, snapshots=2,
                  device="cpu", warmup=5)


def long_cfg(steps: int = 20_000) -> RunConfig:
    """Minutes of training, a train record every 40 steps."""
    return tiny_config(CFG, steps=steps, eval_every=100_000)


def boom(cfg, on_record=None, should_stop=None, threads=None, **_):
    """A train_fn that fails inside the worker process (module level, so the child can import it)."""
    raise RuntimeError("exploded in the worker:\n  line two")


@pytest.fixture()
def store(tmp_path: Path) -> RunStore:
    s = RunStore(tmp_path / "runs")
    yield s
    s.close()


def wait_for(predicate, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def child_pid(store: RunStore, run_id: str, parent: int) -> int:
    """The pid stamped in status.json by the process that is training the run."""
    wait_for(lambda: store.status(run_id)["state"] == "running" and store.status(run_id)["pid"] != parent)
    return store.status(run_id)["pid"]


@pytest.mark.app
def test_process_mode_gives_the_same_run_as_thread_mode(store):
    ids = {}
    for mode in ("thread", "process"):
        jm = JobManager(store, max_concurrent=1, mode=mode)
        assert jm.mode == mode
        ids[mode] = jm.submit(CFG)
        final = jm.wait(ids[mode], timeout=WAIT)
        jm.shutdown(wait=True)
        assert final.state == "completed", final.error
        assert (final.step, final.total_steps) == (30, 30) and final.last_loss is not None
    t, p = ids["thread"], ids["process"]
    assert store.status(p)["pid"] != os.getpid()  # trained elsewhere
    mt, mp_ = store.metrics(t), store.metrics(p)
    cols = ["kind", "step", LOSS, "grad_norm", TOKEN_ACC, EXACT_MATCH, "ood_loss"]
    assert mt[cols].equals(mp_[cols])  # identical numbers, bit for bit (one thread each)
    wt, wp = store.load_weights(t), store.load_weights(p)
    assert all(torch.equal(wt[k], wp[k]) for k in wt)
    assert store.snapshot_steps(t) == store.snapshot_steps(p) == [0, 30]
    st, sp = store.summary(t), store.summary(p)
    assert {k: st[k] for k in ("params", "steps", "eval", "ood")} == {k: sp[k] for k in ("params", "steps", "eval", "ood")}


@pytest.mark.app
def test_live_status_and_stop_in_process_mode(store):
    jm = JobManager(store, max_concurrent=1, mode="process")
    run_id = jm.submit(long_cfg())
    wait_for(lambda: jm.status(run_id).step >= 40)
    snap = jm.status(run_id)
    assert snap.state == "running" and snap.steps_per_s > 0 and snap.last_loss is not None
    assert jm.stop(run_id) is True
    final = jm.wait(run_id, timeout=WAIT)
    assert final.state == "stopped" and final.error is None
    status = store.status(run_id)
    assert status["state"] == "stopped" and store.summary(run_id)["stopped"] is True
    steps = store.metrics(run_id).query("kind == 'train'")["step"]
    assert 40 <= steps.max() <= status["step"] < 20_000 and store.snapshot_steps(run_id)[-1] == status["step"]
    jm.shutdown(wait=True)


@pytest.mark.app
def test_exception_in_the_worker_process_is_failed_with_its_message(store):
    jm = JobManager(store, max_concurrent=1, train_fn=boom, mode="process")
    run_id = jm.submit(CFG)
    final = jm.wait(run_id, timeout=WAIT)
    assert (final.state, final.error) == ("failed", "exploded in the worker: line two")
    assert store.status(run_id)["error"] == "exploded in the worker: line two"
    jm.shutdown(wait=True)


@pytest.mark.app
def test_a_slot_reuses_its_worker_process_and_a_stop_right_after_the_start_reaches_it(store):
    """Job after job in one process of the manager's own pool (no second import of torch); a failed job does
    not end it; a stop sent the moment a reused worker is handed its run still stops that run."""
    jm = JobManager(store, max_concurrent=1, mode="process")
    first = jm.submit(CFG)
    assert jm.wait(first, timeout=WAIT).state == "completed"
    pid = store.status(first)["pid"]
    assert pid != os.getpid()
    # a job that fails inside the worker (no Apple GPU on Linux: the trainer refuses device "mps")
    bad = jm.submit(replace(CFG, train=replace(CFG.train, device="mps")))
    final = jm.wait(bad, timeout=WAIT)
    assert final.state == "failed" and "mps" in final.error, final
    assert store.status(bad)["pid"] == pid
    for _ in range(3):
        victim = jm.submit(long_cfg())
        wait_for(lambda v=victim: jm.status(v).state == "running", timeout=WAIT)
        assert jm.stop(victim) is True  # at once: the child may not have started the run yet
        final = jm.wait(victim, timeout=WAIT)
        assert final.state == "stopped", final
        assert store.status(victim)["pid"] == pid and store.status(victim)["step"] < 20_000
    jm.shutdown(wait=True)


@pytest.mark.app
def test_killed_worker_process_is_failed_and_the_next_run_goes_on(store):
    jm = JobManager(store, max_concurrent=1, mode="process")
    victim = jm.submit(long_cfg())
    after = jm.submit(CFG)
    pid = child_pid(store, victim, os.getpid())
    os.kill(pid, signal.SIGKILL)
    final = jm.wait(victim, timeout=WAIT)
    assert final.state == "failed" and "SIGKILL" in final.error, final
    status = store.status(victim)
    assert status["state"] == "failed" and "SIGKILL" in status["error"]
    assert jm.wait(after, timeout=WAIT).state == "completed"
    jm.shutdown(wait=True)


def test_bad_mode_is_refused(store, monkeypatch):
    with pytest.raises(ValueError, match="mode"):
        JobManager(store, max_concurrent=1, mode="fork")
    monkeypatch.setenv("LAB_JOBS_MODE", "greenlets")
    with pytest.raises(ValueError, match="LAB_JOBS_MODE"):
        JobManager(store, max_concurrent=1)
    monkeypatch.setenv("LAB_JOBS_MODE", "thread")
    assert JobManager(store, max_concurrent=1).mode == "thread"


SERVER = """
import json, sys, time
from lab.config import RunConfig
from lab.engine.jobs import JobManager
from lab.engine.store import RunStore

if __name__ == "__main__":
    jm = JobManager(RunStore(sys.argv[1]), max_concurrent=2, mode="process")
    for _ in range(2):
        print(jm.submit(RunConfig.from_dict(json.loads(sys.argv[2]))), flush=True)
    time.sleep(600)
"""


@pytest.mark.app
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds the server's children through /proc (Linux)")
def test_sigkill_of_the_server_leaves_no_training_process(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    runs = tmp_path / "runs"
    server = subprocess.Popen([sys.executable, str(script), str(runs), long_cfg().to_json()], cwd=REPO,
                              stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        ids = [server.stdout.readline().strip() for _ in range(2)]
        store = RunStore(runs)
        pids = [child_pid(store, r, server.pid) for r in ids]
        family = descendants(server.pid)  # the two training processes, and the warm spare
        assert len(set(pids)) == 2 and set(pids) <= family
        tokens = {p: process_token(p) for p in family}
        server.send_signal(signal.SIGKILL)
        server.wait(30)
        wait_for(lambda: all(process_token(p) != t for p, t in tokens.items()),
                 timeout=30)
        for r in ids:  # the children noticed and said so
            assert store.status(r)["state"] == "interrupted"
    finally:
        if server.poll() is None:
            server.kill()
