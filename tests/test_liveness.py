"""Liveness of a run's writer by the lock it holds for life (lab/engine/liveness.py): reading a
status writes nothing, a second process reads alive while it lives and interrupted once killed,
a run handed between two live processes never reads interrupted, the same process answers for
itself, and the fallbacks (no token, a lock that cannot be probed, a store that cannot be
written) still answer. `recover()` is what records a dead run as interrupted; `sweep()` removes
the lock and temp files of dead writers and keeps those of live ones."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import filelock
import pytest

import lab.engine.liveness as liveness
from lab.engine.liveness import LOCK_DIR, my_token, writer_alive
from lab.engine.store import RunStore
from lab.engine.storefs import process_token, temp_tag
from tests.helpers import tiny_config

CFG = tiny_config(steps=20, eval_every=10)

REPO = Path(__file__).resolve().parents[1]
DEAD = "w999999-0123456789ab"  # a writer token no process holds


@pytest.fixture()
def store(tmp_path: Path) -> RunStore:
    s = RunStore(tmp_path / "runs")
    yield s
    s.close()


def tree(root: Path) -> dict[str, str]:
    """Every path in the store (folders too) -> digest of its bytes: what a reader must not change."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def raw(store: RunStore, run_id: str) -> dict:
    return json.loads((store.path(run_id) / "status.json").read_bytes())


def spawn(code: str, *args: str) -> subprocess.Popen:
    """A second Python process running `code` (it prints lines the test waits for)."""
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, stdout=subprocess.PIPE, text=True)


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()


def test_reading_a_dead_run_writes_nothing(store):
    dead = store.create(CFG)
    store.set_status(dead, "running", step=4, writer=DEAD)
    done = store.create(CFG)
    store.set_status(done, "completed")
    before = tree(store.root)
    for _ in range(3):
        assert store.status(dead)["state"] == "interrupted"
        assert store.status(dead)["error"] == "process died while running"
        assert store.list().set_index("run_id")["state"].to_dict() == {dead: "interrupted", done: "completed"}
    assert tree(store.root) == before  # no status rewritten, no lock file created by the probe
    assert raw(store, dead)["state"] == "running"
    assert store.recover() == [dead]
    after = raw(store, dead)
    assert (after["state"], after["error"], after["step"]) == ("interrupted", "process died while running", 4)
    assert store.recover() == [] and store.status(done)["state"] == "completed"


@pytest.mark.app
def test_a_second_process_reads_alive_until_killed(store):
    code = ("import sys, time; from lab.config import RunConfig; from lab.engine.store import RunStore; "
            "print(RunStore(sys.argv[1]).create(RunConfig(), owner='other'), flush=True); time.sleep(120)")
    proc = spawn(code, str(store.root))
    try:
        run_id = proc.stdout.readline().strip()
        status = raw(store, run_id)
        assert status["writer"].startswith(f"w{proc.pid}-") and status["pid"] == proc.pid
        assert writer_alive(store.root, status["writer"]) is True  # probed: its lock is held
        assert store.status(run_id)["state"] == "queued"
        with pytest.raises(ValueError, match="is queued"):
            store.delete(run_id)
        before = tree(store.root)
        assert store.recover() == [] and store.sweep() == 0  # nothing of a live writer is touched
        assert tree(store.root) == before
    finally:
        kill(proc)
    assert writer_alive(store.root, status["writer"]) is False
    before = tree(store.root)
    assert store.status(run_id)["state"] == "interrupted" and store.list().loc[0, "state"] == "interrupted"
    assert tree(store.root) == before
    assert store.recover() == [run_id] and raw(store, run_id)["error"] == "process died while queued"
    assert store.sweep() == 1  # its lock file
    assert not (store.root / LOCK_DIR / f"{status['writer']}.lock").exists()
    assert store.status(run_id)["state"] == "interrupted"  # a missing lock file reads as a dead writer too


@pytest.mark.app
def test_a_run_handed_between_live_processes_never_reads_interrupted(store):
    """create() stamps queued here (as the app does); a second process stamps running again and
    again (as a worker does) while this one reads; killing the second one interrupts the run."""
    run_id = store.create(CFG)
    code = ("import sys; from lab.engine.store import RunStore; s = RunStore(sys.argv[1]); "
            "print('go', flush=True); [s.set_status(sys.argv[2], 'running', step=i) for i in range(300)]; "
            "print('done', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(store.root), run_id], cwd=REPO,
                            stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "go"
        seen, deadline = set(), time.monotonic() + 60
        while raw(store, run_id).get("step", 0) < 299:
            seen.add(store.status(run_id)["state"])
            assert time.monotonic() < deadline and proc.poll() is None
        assert proc.stdout.readline().strip() == "done"
        assert seen <= {"queued", "running"} and "running" in seen
        assert store.status(run_id)["state"] == "running" and store.status(run_id)["pid"] == proc.pid
    finally:
        kill(proc)
        proc.stdin.close()
    assert store.status(run_id)["state"] == "interrupted"  # its writer died, though this process lives


def test_the_same_process_answers_for_itself(store, monkeypatch):
    run_id = store.create(CFG)
    lock = store.root / LOCK_DIR / f"{my_token()}.lock"
    assert raw(store, run_id)["writer"] == my_token() and lock.is_file()
    monkeypatch.setattr(liveness, "_probe", lambda path: pytest.fail("probed its own lock"))
    assert store.status(run_id)["state"] == "queued"
    monkeypatch.undo()
    # a second descriptor in the holder's own process is refused like another process would be
    assert liveness._probe(lock) is True
    first = filelock.FileLock(str(store.root / "x.lock"), thread_local=False)
    second = filelock.FileLock(str(store.root / "x.lock"), thread_local=False)
    with first.acquire(timeout=0):
        with pytest.raises(filelock.Timeout):
            second.acquire(timeout=0)
    with second.acquire(timeout=0):  # free once released
        pass


def test_status_files_without_a_token_use_the_pid(store):
    """Status files written before writers held locks (pid and /proc identity only)."""
    live, gone = store.create(CFG), store.create(CFG)
    for run_id, pid, proc in ((live, os.getpid(), process_token()), (gone, 2**22 + 7, None)):
        status = {k: v for k, v in raw(store, run_id).items() if k != "writer"}
        (store.path(run_id) / "status.json").write_text(json.dumps({**status, "pid": pid, "proc": proc}))
    assert store.status(live)["state"] == "queued" and store.status(gone)["state"] == "interrupted"
    assert store.recover() == [gone]


def test_a_lock_that_cannot_be_probed_falls_back_to_the_pid(store, monkeypatch):
    run_id = store.create(CFG)
    store.set_status(run_id, "running", writer=DEAD)  # the pid and identity stamped are this process's
    (store.root / LOCK_DIR / f"{DEAD}.lock").write_text("")  # a dead writer's lock file, not held
    assert store.status(run_id)["state"] == "interrupted"  # the lock says dead

    def no_locks(fd, blocking=True):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(liveness, "_lock_descriptor", no_locks)
    assert writer_alive(store.root, DEAD) is None
    assert store.status(run_id)["state"] == "running"  # unknown: this pid and start time live
    store.set_status(run_id, "running", writer=DEAD, pid=os.getpid(), proc=f"{os.getpid()}:1")
    assert store.status(run_id)["state"] == "interrupted"  # unknown, and the identity is not this process
    assert writer_alive(store.root, "../../etc/passwd") is None  # never a path outside the lock folder


@pytest.mark.app
def test_a_reader_that_cannot_write_still_probes(store, monkeypatch):
    """Readers open lock files read-only where read-write is refused (a store they cannot write)."""
    code = ("import sys, time; from lab.config import RunConfig; from lab.engine.store import RunStore; "
            "print(RunStore(sys.argv[1]).create(RunConfig()), flush=True); time.sleep(120)")
    proc = spawn(code, str(store.root))
    real_open = os.open

    def read_only(path, flags, *args):
        if flags & (os.O_RDWR | os.O_WRONLY | os.O_CREAT):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    try:
        run_id = proc.stdout.readline().strip()
        monkeypatch.setattr(liveness.os, "open", read_only)
        assert store.status(run_id)["state"] == "queued"
    finally:
        kill(proc)
    assert store.status(run_id)["state"] == "interrupted"
    assert store.recover() == []  # cannot write: left as it is, still reads interrupted
    monkeypatch.undo()
    assert store.recover() == [run_id]


def test_a_writer_without_a_lock_stamps_its_pid(store, monkeypatch):
    """No native locks (or a store where the lock cannot be taken): pid and identity only."""
    monkeypatch.setattr(liveness, "_take", lambda path: None)
    run_id = store.create(CFG)
    status = raw(store, run_id)
    assert "writer" not in status and status["pid"] == os.getpid()
    assert store.status(run_id)["state"] == "queued"
    assert temp_tag(store.root).startswith("p")  # temp files named by pid, judged by pid
    monkeypatch.undo()
    store.set_status(run_id, "running")
    assert raw(store, run_id)["writer"] == my_token()


def test_sweep_keeps_what_live_writers_own(store):
    run_id = store.create(CFG)
    folder = store.path(run_id)
    mine = folder / f".status.json.{my_token()}.abc123.tmp"
    dead = folder / f".status.json.{DEAD}.abc123.tmp"
    half = store.root / f".{run_id}x.{DEAD}.abc123.new"
    for path in (mine, dead):
        path.write_text("{")
    half.mkdir()
    (store.root / LOCK_DIR / f"{DEAD}.lock").write_text("")
    (store.root / LOCK_DIR / "notes.txt").write_text("not a lock file")
    assert store.sweep() == 3
    assert mine.exists() and not dead.exists() and not half.exists()
    assert sorted(os.listdir(store.root / LOCK_DIR)) == sorted([f"{my_token()}.lock", "notes.txt"])


def test_a_store_removed_under_a_live_process_gets_a_new_lock(store):
    import shutil

    store.create(CFG)
    shutil.rmtree(store.root)
    run_id = store.create(CFG)
    assert (store.root / LOCK_DIR / f"{my_token()}.lock").is_file()
    assert liveness._probe(store.root / LOCK_DIR / f"{my_token()}.lock") is True
    assert raw(store, run_id)["writer"] == my_token()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_a_token_of_its_own():
    parent = my_token()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, my_token().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child.startswith(f"w{pid}-") and child != parent and my_token() == parent


def test_sweep_without_probes_judges_temp_names_by_pid(store, monkeypatch):
    run_id = store.create(CFG)
    dead = store.path(run_id) / f".status.json.{DEAD}.abc123.tmp"  # no process has pid 999999
    alive = store.path(run_id) / f".status.json.w{os.getpid()}-ffffffffffff.abc123.tmp"  # a pid that exists
    for path in (dead, alive):
        path.write_text("{")
        (store.root / LOCK_DIR / f"{path.name.split('.')[3]}.lock").write_text("")  # lock files: unknowable

    def no_locks(fd, blocking=True):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(liveness, "_lock_descriptor", no_locks)
    assert store.sweep() == 1 and alive.exists() and not dead.exists()


@pytest.mark.app
def test_a_writer_killed_mid_save_leaves_only_temp_files_the_sweep_removes(store):
    """SIGKILL, three times, a process that keeps saving weights and snapshots of some MB: whatever the
    moment, every temp file left carries its writer's name (safetensors' own save_file renames an unnamed
    `.tmpXXXXXX`, which the crash test once found surviving a restart), and a sweep leaves none."""
    run_id = store.create(CFG)
    code = f"""
import numpy as np, torch
from lab.engine.store import RunStore
from lab.records import SnapshotRecord
s = RunStore({str(store.root)!r})
big, snap = {{"w": torch.randn(4000, 2500)}}, SnapshotRecord(step=1, patterns={{"p": np.zeros((2000, 2000), np.float16)}})
print("ready", flush=True)
while True:
    s.save_weights({run_id!r}, big)
    s.save_snapshot({run_id!r}, snap)
"""
    folder = store.path(run_id)
    for pause in (0.4, 0.9, 1.3):
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(pause)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        left = [p.name for p in (*folder.glob(".*"), *(folder / "attention").glob(".*"))]
        assert all(name.endswith(".tmp") and ".w" in name for name in left), left  # all named after a writer
        store.sweep()
        assert [p.name for p in (*folder.glob(".*"), *(folder / "attention").glob(".*"))] == []


def test_sweep_removes_unnamed_safetensors_temp_files_of_earlier_versions(store):
    run_id = store.create(CFG)
    (store.path(run_id) / "attention").mkdir()
    old = [store.path(run_id) / ".tmp1LujpJ", store.path(run_id) / "attention" / ".tmpAb3dE9"]
    for path in old:
        path.write_bytes(b"\0" * 10)
    keep = store.path(run_id) / ".tmpnotes"  # not safetensors' name pattern: not ours to judge
    keep.write_text("x")
    assert store.sweep() == 2 and not any(p.exists() for p in old) and keep.exists()
