"""The run store: atomic creation and writes, id validation, damage tolerance, round-trips."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import lab.engine.store as runs
from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.records import CROSS, DEC_SELF, EXACT_MATCH, EvalRecord, SnapshotRecord, StepRecord
from lab.engine.liveness import LOCK_DIR, my_token
from lab.engine.store import DamagedRunError, RunIdError, RunNotFoundError, RunStore

REPO = Path(__file__).resolve().parents[1]
CFG = RunConfig(
    model=ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32, pos="rope"),
    task=TaskConfig(name="copy", max_len=4),
    train=TrainConfig(steps=20, eval_every=10),
)


def step_rec(step: int, loss: float = 1.0) -> StepRecord:
    return StepRecord(step=step, loss=loss, lr=1e-3, grad_norm=0.5, tokens=10 * step, elapsed_s=0.1 * step,
                      tokens_per_s=100.0)


def visible(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def leftovers(root: Path) -> list[str]:
    """Everything in the store but this process's own writer lock (held while it lives)."""
    mine = f"{LOCK_DIR}/{my_token()}.lock"
    found = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    return [p for p in found if p not in (LOCK_DIR, mine)]


@pytest.fixture()
def store(tmp_path: Path) -> RunStore:
    s = RunStore(tmp_path / "runs")
    yield s
    s.close()


def test_root_defaults_to_env_then_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path / "elsewhere"))
    assert RunStore().root == (tmp_path / "elsewhere").resolve()
    monkeypatch.delenv("LAB_RUNS_DIR")
    monkeypatch.chdir(tmp_path)
    s = RunStore()
    assert s.root == tmp_path / "runs"
    assert not s.root.exists()  # created lazily
    s.create(CFG)
    assert s.root.is_dir()


def test_create_writes_config_and_queued_status(store):
    run_id = store.create(CFG, owner="ada")
    assert run_id.split("-")[2:5] == ["copy", "rope", "pre"]
    assert store.exists(run_id) and store.config(run_id) == CFG
    status = store.status(run_id)
    assert (status["state"], status["owner"], status["pid"]) == ("queued", "ada", os.getpid())
    assert status["writer"] == my_token() and (store.root / LOCK_DIR / f"{my_token()}.lock").is_file()
    assert status["created_at"].startswith("20")
    assert store.new_run_id(CFG) != store.new_run_id(CFG)
    with pytest.raises(ValueError, match="already exists"):
        store.create(CFG, run_id=run_id)


def test_create_is_invisible_until_complete(store, monkeypatch):
    store.root.mkdir(parents=True)
    seen = []
    real_rename = os.rename

    def spy(src, dst):
        seen.append((visible(store.root), len(store.list()), sorted(os.listdir(src))))
        real_rename(src, dst)

    monkeypatch.setattr(runs.os, "rename", spy)
    run_id = store.create(CFG)
    assert seen == [([], 0, ["config.json", "status.json"])]
    assert visible(store.root) == [run_id]


def test_failed_create_leaves_nothing(store, monkeypatch):
    calls = []
    real_write = runs._atomic_write

    def write_then_crash(path, data, tag=None):
        calls.append(path.name)
        if path.name == "status.json":
            raise OSError("disk full")
        real_write(path, data, tag)

    monkeypatch.setattr(runs, "_atomic_write", write_then_crash)
    with pytest.raises(OSError, match="disk full"):
        store.create(CFG)
    assert calls == ["config.json", "status.json"]
    assert leftovers(store.root) == []  # the temp folder is gone too
    assert store.list().empty


@pytest.mark.parametrize("bad", ["..", "../x", "a/b", "/etc", "", "x" * 129, ".hidden", "a..b", "a\\b", "a b", 7, None])
def test_bad_run_ids_are_refused_everywhere(store, bad):
    good = store.create(CFG)
    calls = [store.path, store.exists, store.config, store.status, store.metrics, store.delete,
             store.load_weights, store.snapshot_steps, store.summary,
             lambda r: store.set_status(r, "running"), lambda r: store.append(r, step_rec(1)),
             lambda r: store.save_weights(r, {}), lambda r: store.load_snapshot(r, 0)]
    for call in calls:
        with pytest.raises(RunIdError, match=r"run_id: .* is not a valid run id"):
            call(bad)
    assert store.exists(good)


def test_symlink_out_of_root_is_refused(store, tmp_path):
    store.root.mkdir(parents=True)
    (store.root / "escape").symlink_to(tmp_path)
    with pytest.raises(RunIdError):
        store.path("escape")


def test_unknown_run_raises_not_found(store):
    with pytest.raises(RunNotFoundError, match="'nope' does not exist"):
        store.status("nope")
    with pytest.raises(RunNotFoundError):
        store.config("nope")
    assert not store.exists("nope")


def test_set_status_merges_atomically(store, monkeypatch):
    run_id = store.create(CFG, owner="ada")
    store.set_status(run_id, "running", step=5, started_at="t0")
    store.set_status(run_id, "running", step=9)
    status = store.status(run_id)
    assert (status["state"], status["step"], status["started_at"], status["owner"]) == ("running", 9, "t0", "ada")
    assert status["updated_at"] >= status["created_at"]
    with pytest.raises(ValueError, match="state: 'done' is not one of"):
        store.set_status(run_id, "done")

    def crash(src, dst):
        raise OSError("power cut")

    monkeypatch.setattr(runs.os, "replace", crash)
    with pytest.raises(OSError):
        store.set_status(run_id, "failed", error="x" * 10_000)
    monkeypatch.undo()
    assert store.status(run_id)["step"] == 9  # the old file, whole
    assert [p for p in os.listdir(store.path(run_id)) if p.endswith(".tmp")] == []


def test_concurrent_reader_never_sees_a_torn_status(store):
    run_id = store.create(CFG)
    done, errors, reads = threading.Event(), [], [0]

    def read() -> None:
        while not done.is_set():
            try:
                assert json.loads((store.path(run_id) / "status.json").read_bytes())["state"] == "running"
                reads[0] += 1
            except Exception as exc:  # noqa: BLE001 - any failure is what we look for
                errors.append(exc)

    reader = threading.Thread(target=read)
    store.set_status(run_id, "running")
    reader.start()
    for i in range(100):
        store.set_status(run_id, "running", step=i, blob="x" * (i * 997 % 50_000))
    done.set()
    reader.join()
    assert errors == [] and reads[0] > 0
    assert store.status(run_id)["step"] == 99


def test_appends_from_threads_never_interleave(store):
    run_id = store.create(CFG)
    threads = [threading.Thread(target=lambda k=k: [store.append(run_id, step_rec(k * 1000 + i)) for i in range(100)])
               for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = (store.path(run_id) / "metrics.jsonl").read_bytes().splitlines()
    assert len(lines) == 400 and all(json.loads(line)["kind"] == "train" for line in lines)
    assert sorted(store.metrics(run_id)["step"]) == sorted(k * 1000 + i for k in range(4) for i in range(100))


def test_metrics_round_trip_and_torn_last_line(store):
    run_id = store.create(CFG)
    assert list(store.metrics(run_id).columns[:3]) == ["kind", "step", "loss"]
    assert store.metrics(run_id).empty
    store.append(run_id, step_rec(1, 2.5))
    store.append(run_id, EvalRecord(1, 0.1, 10, 2.0, 0.5, 0.25, 3.0, 0.2, 0.0))
    store.append(run_id, step_rec(2, np.float32(2.0)))
    store.close()
    path = store.path(run_id) / "metrics.jsonl"
    with open(path, "ab") as fh:
        fh.write(b'{"kind": "train", "step": 3, "lo')  # a crash mid-line
    df = store.metrics(run_id)
    assert df["kind"].tolist() == ["train", "eval", "train"]
    assert df["step"].tolist() == [1, 1, 2]
    assert df["loss"].tolist() == [2.5, 2.0, 2.0]
    assert df.loc[1, "ood_exact_match"] == 0.0 and np.isnan(df.loc[0, "ood_loss"])
    store.append(run_id, step_rec(4))  # the torn line is terminated, not glued to
    assert store.metrics(run_id)["step"].tolist() == [1, 1, 2, 4]
    with pytest.raises(TypeError, match="record"):
        store.append(run_id, SnapshotRecord(1))


def test_weights_round_trip_exactly(store):
    run_id = store.create(CFG)
    emb = torch.randn(7, 4)
    state = {"emb.weight": emb, "head.weight": emb, "qkv": torch.randn(4, 12)[:, :4],
             "half": torch.randn(3).half(), "count": torch.tensor(3)}
    store.save_weights(run_id, state)
    loaded = store.load_weights(run_id)
    assert loaded.keys() == state.keys()
    for key, value in state.items():
        assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value)
    with pytest.raises(RunNotFoundError, match="no saved weights"):
        store.load_weights(store.create(CFG))


def test_snapshot_round_trip(store):
    run_id = store.create(CFG)
    rng = np.random.default_rng(0)
    pats = {DEC_SELF: rng.random((1, 2, 5, 5), dtype=np.float32), CROSS: rng.random((1, 2, 5, 3), dtype=np.float32)}
    for step in (20, 0, 100):
        store.save_snapshot(run_id, SnapshotRecord(step, pats))
    assert store.snapshot_steps(run_id) == [0, 20, 100]
    back = store.load_snapshot(run_id, 20)
    assert back.keys() == pats.keys()
    for key in pats:
        assert back[key].dtype == np.float32 and back[key].shape == pats[key].shape
        np.testing.assert_allclose(back[key], pats[key], atol=1e-3)
    with pytest.raises(RunNotFoundError):
        store.load_snapshot(run_id, 5)


def test_summary_and_list_columns(store):
    a = store.create(CFG, owner="ada")
    b = store.create(replace(CFG, model=replace(CFG.model, norm="post")))
    store.write_summary(a, {"params": 99, "train_loss": 0.5, "eval": {EXACT_MATCH: 0.75}, "ood": None})
    assert store.summary(a)["eval"] == {EXACT_MATCH: 0.75} and store.summary(b) is None
    df = store.list()
    assert df["run_id"].tolist() == [a, b]  # by created_at
    assert list(df.columns[:8]) == ["run_id", "state", "owner", "created_at", "updated_at", "step", "error", "damaged"]
    assert df.loc[0, "final.eval.exact_match"] == 0.75 and df.loc[0, "final.params"] == 99
    assert pd.isna(df.loc[1, "final.eval.exact_match"])
    assert df["model.norm"].tolist() == ["pre", "post"] and df["task.name"].tolist() == ["copy", "copy"]
    assert df["damaged"].tolist() == ["", ""]


def test_damaged_runs_are_listed_not_fatal(store):
    healthy = store.create(CFG)
    torn_cfg, garbage_status, missing_status, bad_value = (store.create(CFG) for _ in range(4))
    (store.path(torn_cfg) / "config.json").write_text('{"model": {"d_mod')
    (store.path(garbage_status) / "status.json").write_bytes(b"\x00\xff garbage")
    (store.path(missing_status) / "status.json").unlink()
    cfg = json.loads((store.path(bad_value) / "config.json").read_text())
    cfg["model"]["d_model"] = 15
    (store.path(bad_value) / "config.json").write_text(json.dumps(cfg))
    (store.root / "stray-file.txt").write_text("not a run")
    df = store.list().set_index("run_id")
    assert len(df) == 5
    assert df.loc[healthy, "damaged"] == "" and df.loc[healthy, "state"] == "queued"
    assert df.loc[torn_cfg, "damaged"] == "config.json: not valid JSON"
    assert df.loc[garbage_status, "damaged"] == "status.json: not valid JSON"
    assert df.loc[missing_status, "damaged"] == "status.json: missing"
    assert df.loc[bad_value, "damaged"].startswith("config.json: model.d_model: 15 is not divisible")
    assert df.loc[torn_cfg, "state"] == "queued" and pd.isna(df.loc[torn_cfg, "model.d_model"])
    with pytest.raises(DamagedRunError, match="config.json"):
        store.config(torn_cfg)
    store.delete(garbage_status)  # damaged runs can still be removed
    assert not store.exists(garbage_status)


def test_delete_refuses_live_runs_and_other_owners(store):
    run_id = store.create(CFG, owner="ada")
    with pytest.raises(ValueError, match="is queued"):
        store.delete(run_id)
    store.set_status(run_id, "running")
    store.append(run_id, step_rec(1))
    with pytest.raises(ValueError, match="is running"):
        store.delete(run_id)
    store.set_status(run_id, "completed")
    with pytest.raises(PermissionError):
        store.delete(run_id, owner="bob")
    store.delete(run_id, owner="ada")
    assert not store.exists(run_id) and leftovers(store.root) == []


def test_reused_pid_reads_as_interrupted(store):
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs /proc")
    run_id = store.create(CFG)
    store.set_status(run_id, "running", pid=os.getpid(), proc=f"{os.getpid()}:1")  # same pid, other start
    assert "writer" not in json.loads((store.path(run_id) / "status.json").read_text())  # no token vouches
    status = store.status(run_id)
    assert status["state"] == "interrupted" and "died while running" in status["error"]
    assert json.loads((store.path(run_id) / "status.json").read_text())["state"] == "running"  # read, not written
    assert store.recover() == [run_id]
    assert json.loads((store.path(run_id) / "status.json").read_text())["state"] == "interrupted"


@pytest.mark.app
def test_killed_process_reads_as_interrupted(store):
    run_id = store.create(CFG)
    code = ("import sys, time; from lab.engine.store import RunStore; "
            "RunStore(sys.argv[1]).set_status(sys.argv[2], 'running', step=3); print('ready', flush=True); "
            "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(store.root), run_id], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        status = store.status(run_id)
        assert (status["state"], status["pid"]) == ("running", proc.pid)
        assert status["writer"].startswith(f"w{proc.pid}-") and status["writer"] != my_token()
        with pytest.raises(ValueError, match="is running"):
            store.delete(run_id)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
        proc.stdout.close()
    before = (store.path(run_id) / "status.json").read_bytes()
    status = store.status(run_id)
    assert (status["state"], status["step"]) == ("interrupted", 3)
    assert store.list().loc[0, "state"] == "interrupted"
    assert (store.path(run_id) / "status.json").read_bytes() == before  # reading wrote nothing
    assert store.recover() == [run_id] and store.recover() == []
    on_disk = json.loads((store.path(run_id) / "status.json").read_bytes())
    assert (on_disk["state"], on_disk["error"], on_disk["step"]) == ("interrupted", "process died while running", 3)
    store.delete(run_id)


def test_listing_200_runs(store, record_property):
    for i in range(200):
        run_id = store.create(replace(CFG, train=replace(CFG.train, seed=i)))
        store.append(run_id, step_rec(1))
        store.write_summary(run_id, {"params": i, "eval": {"loss": 1.0}})
    store.close()
    start = time.perf_counter()
    df = store.list()
    elapsed = time.perf_counter() - start
    assert len(df) == 200 and sorted(df["train.seed"]) == list(range(200))
    assert (df["damaged"] == "").all() and df["created_at"].is_monotonic_increasing
    record_property("list_200_runs_s", round(elapsed, 3))  # measured, not asserted: the host is noisy
