"""Continuing stored runs: `python -m lab train --stop-at` then `resume` equals one go; the job manager queues a
continuation in the run's own folder (in a thread, and through the real worker processes); a run whose
process was SIGKILLed mid-training continues from its last checkpoint after `recover()`; refusals name the
field by its label and write nothing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.cli.main import main
from lab.config import ConfigError, in_words
from lab.engine import continuation
from lab.engine.jobs import JobManager
from lab.engine.limits import LimitError, Limits
from lab.engine.recorder import record_run
from lab.engine.store import RunStore
from tests.helpers import RESUMABLE, continue_run, metrics_rows, same_run, tiny_config

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff", "32", "--batch-size", "8", "--max-len", "4",
        "--n-ctx", "32", "--threads", "1", "--device", "cpu", "--eval-every", "10", "--eval-samples", "16",
        "--warmup", "5", "--dropout", "0.1", "--snapshots", "4"]
WAIT = 120.0


def cli_json(capsys: pytest.CaptureFixture, *argv: str) -> dict:
    assert main(list(argv)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_cli_stop_at_then_resume_equals_one_go(tmp_path, capsys):
    runs = str(tmp_path / "runs")
    stopped = cli_json(capsys, "train", *TINY, "--steps", "40", "--stop-at", "20", "--runs-dir", runs, "--json")
    assert (stopped["status"], stopped["steps"]) == ("stopped", 20)
    resumed = cli_json(capsys, "resume", stopped["run_id"], "--runs-dir", runs, "--json")
    assert (resumed["run_id"], resumed["status"], resumed["steps"]) == (stopped["run_id"], "completed", 40)
    whole = cli_json(capsys, "train", *TINY, "--steps", "40", "--runs-dir", runs, "--json")
    store = RunStore(runs)
    same_run(store, whole["run_id"], stopped["run_id"])
    assert len(store.list()) == 2
    # a completed run goes on only to more steps: the error names the field and its flag
    assert main(["resume", stopped["run_id"], "--runs-dir", runs]) == 2
    err = capsys.readouterr().err
    assert "train.steps: 40 is not more than the 40 steps" in err and "--steps" in err


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def completed_run(store: RunStore, steps: int = 20) -> str:
    run_id = store.create(tiny_config(RESUMABLE, steps=steps))
    record_run(store, run_id, threads=1)
    return run_id


def test_refusals_name_the_field_by_its_label_and_write_nothing(tmp_path):
    store = RunStore(tmp_path / "runs")
    done = completed_run(store)
    bare = store.create(tiny_config(RESUMABLE))  # never trained: no checkpoint
    store.set_status(bare, "failed", error="before checkpoints existed")
    queued = store.create(tiny_config(RESUMABLE))  # queued by this (live) process
    jm = JobManager(store, max_concurrent=1, mode="thread", limits=Limits(max_steps=100))
    before = files_of(store.root)
    cases = [(done, 20, "Steps", "20 is not more than the 20 steps"), (done, 5, "Steps", "not more than"),
             (done, 500, "Steps", "above this server's limit of 100"), (bare, 40, "Run", "has no checkpoint"),
             (queued, 40, "Run", "is queued")]
    for run_id, steps, label, words in cases:
        with pytest.raises(ConfigError) as err:
            jm.resume(run_id, steps)
        what, message = in_words(err.value)
        assert (what, words in message) == (label, True), str(err.value)
    with pytest.raises(LimitError):
        jm.resume(done, 500)
    assert files_of(store.root) == before  # nothing written by any refusal
    jm.shutdown(wait=True)


def test_a_queued_continuation_stopped_before_it_starts_leaves_the_run_as_it_was(tmp_path):
    store = RunStore(tmp_path / "runs")
    done = completed_run(store)
    jm = JobManager(store, max_concurrent=1, mode="thread")
    try:
        busy = jm.submit(tiny_config(RESUMABLE, steps=100_000))  # holds the only slot
        while jm.status(busy).state != "running":
            time.sleep(0.01)
        jm.resume(done, 30)
        assert jm.status(done).state == "queued" and store.status(done)["state"] == "queued"
        with pytest.raises(ConfigError, match="is queued"):
            jm.resume(done, 40)  # a second request for a queued run
        assert jm.stop(done)
        assert jm.status(done).state == "completed" and store.status(done)["state"] == "completed"
        assert store.config(done).train.steps == 20 and continuation.plan(store, done, 30).from_step == 20
        jm.stop(busy)
    finally:
        jm.shutdown(wait=True)


@pytest.mark.parametrize("mode", ["thread", pytest.param("process", marks=pytest.mark.app)])
def test_job_manager_continues_a_completed_run_in_its_own_folder(tmp_path, mode):
    store = RunStore(tmp_path / "runs")
    run_id = completed_run(store, steps=20)
    jm = JobManager(store, max_concurrent=1, mode=mode)
    try:
        assert jm.resume(run_id, 40, owner="ada") == run_id
        final = jm.wait(run_id, timeout=WAIT)
    finally:
        jm.shutdown(wait=True)
    assert (final.state, final.step, final.total_steps) == ("completed", 40, 40), final
    assert store.status(run_id)["state"] == "completed" and store.status(run_id)["step"] == 40
    assert store.config(run_id).train.steps == 40 and store.summary(run_id)["steps"] == 40
    rows = metrics_rows(store, run_id)
    for kind in ("train", "eval"):
        steps = [r["step"] for r in rows if r["kind"] == kind]
        assert steps == sorted(set(steps)) and steps[-1] == 40  # the curve goes on, no step twice
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, 41))
    assert list(store.list()["run_id"]) == [run_id]  # no second run folder
    assert continuation.checkpoint_step(store, run_id) == 40


KILLED = r"""
import sys, time
from lab.config import RunConfig
from lab.engine.recorder import record_run
from lab.engine.store import RunStore
from lab.records import StepRecord

store = RunStore(sys.argv[1])
run_id = store.create(RunConfig.from_json(sys.argv[2]))
said = []
def slow(rec):
    if isinstance(rec, StepRecord) and rec.step >= 24:
        if not said:
            print(run_id, flush=True)
            said.append(1)
        time.sleep(0.05)  # a slow step: the kill lands mid-training, after the checkpoint at step 20
record_run(store, run_id, threads=1, on_record=slow)
"""


@pytest.mark.app
def test_a_run_killed_mid_training_continues_after_recover(tmp_path):
    store = RunStore(tmp_path / "runs")
    cfg = tiny_config(RESUMABLE, steps=60)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(store.root), cfg.to_json()], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        run_id = proc.stdout.readline().strip()
        assert run_id, "the training child said nothing"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    assert store.recover() == [run_id]
    status = store.status(run_id)
    reached = continuation.checkpoint_step(store, run_id)
    assert status["state"] == "interrupted" and reached in (20, 30) and status["step"] > reached
    continue_run(store, run_id)
    assert store.status(run_id)["state"] == "completed"
    whole = store.create(cfg)
    record_run(store, whole, threads=1)
    same_run(store, whole, run_id)  # the killed process's records after its checkpoint are gone
