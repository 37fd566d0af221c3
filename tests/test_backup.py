"""Runs that survive a restart (lab/engine/backup.py): a finished run copied to the backup folder as whole
files and a manifest comes back into an empty store exactly, with its metrics, weights and snapshots; a
backup caught half-written is not restored; a deleted run's backup goes; nothing is rewritten that did not
change. The end-to-end restart of a real server is in tests/test_backup_server.py."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from lab.engine.backup import MANIFEST, backup_dir, backup_run, forget, read_manifest, restore
from lab.engine.jobs import JobManager
from lab.engine.recorder import record_run
from lab.engine.store import RunStore
from ui.knobs import config_from_values

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = config_from_values({"task.name": "copy", "task.max_len": 4, "model.d_model": 16, "model.n_heads": 2,
                           "model.n_layers": 1, "model.d_ff": 32, "train.steps": 12, "train.batch_size": 8,
                           "train.eval_every": 4, "train.eval_samples": 16, "train.snapshots": 2})


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[RunStore, list[str]]:
    """Two finished runs, really trained (a fraction of a second each)."""
    store = RunStore(tmp_path_factory.mktemp("live") / "runs")
    ids = [store.create(replace(TINY, train=replace(TINY.train, seed=s)), owner="teacher") for s in (1, 2)]
    for r in ids:
        record_run(store, r, threads=1)
    return store, ids


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != MANIFEST}


def test_a_restored_run_is_the_run_it_backed_up(trained, tmp_path):
    store, ids = trained
    dest = tmp_path / "bucket"
    assert all(backup_run(store, r, dest) for r in ids)
    fresh = RunStore(tmp_path / "wiped" / "runs")  # the disk after a restart: empty
    done = restore(fresh, dest)
    assert sorted(done.runs) == sorted(ids) and done.incomplete == ()
    for r in ids:
        assert files_of(fresh.path(r)) == files_of(store.path(r))  # byte for byte, checkpoint included
        assert fresh.status(r)["state"] == "completed" and fresh.status(r)["owner"] == "teacher"
        assert fresh.metrics(r).equals(store.metrics(r))
        assert fresh.snapshot_steps(r) == store.snapshot_steps(r) and fresh.load_weights(r).keys()
    assert sorted(fresh.list()["run_id"]) == sorted(ids)
    assert restore(fresh, dest).runs == ()  # a run the store has is left alone


def test_the_manifest_lists_every_file_with_size_and_hash(trained, tmp_path):
    store, ids = trained
    backup_run(store, ids[0], tmp_path)
    manifest = read_manifest(tmp_path / ids[0])
    files = files_of(store.path(ids[0]))
    assert set(manifest) == set(files) and {"config.json", "status.json", "summary.json"} <= set(manifest)
    assert all(manifest[k]["size"] == len(v) for k, v in files.items())


def test_a_half_written_backup_is_not_restored(trained, tmp_path):
    store, ids = trained
    dest = tmp_path / "bucket"
    backup_run(store, ids[0], dest)
    backup_run(store, ids[1], dest)
    # run 0: cut off before its manifest was written; run 1: a file read stale (shorter than the manifest)
    (dest / ids[0] / MANIFEST).unlink()
    metrics = next(p for p in (dest / ids[1]).rglob("*") if p.is_file() and p.name.startswith("metrics"))
    metrics.write_bytes(metrics.read_bytes()[:-10])
    fresh = RunStore(tmp_path / "runs")
    done = restore(fresh, dest)
    assert done.runs == () and done.incomplete == tuple(sorted(ids))
    assert fresh.list().empty and not (fresh.root.exists() and any(fresh.root.iterdir()))  # no temp left


def test_nothing_unchanged_is_written_again_and_a_deleted_run_goes(trained, tmp_path):
    store, ids = trained
    assert backup_run(store, ids[0], tmp_path) is True
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / ids[0]).rglob("*") if p.is_file()}
    assert backup_run(store, ids[0], tmp_path) is False
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    forget(ids[0], tmp_path)
    assert not (tmp_path / ids[0]).exists()
    assert restore(RunStore(tmp_path / "runs"), tmp_path).runs == ()


def test_folders_that_are_not_runs_are_ignored(tmp_path):
    dest = tmp_path / "bucket"
    (dest / "..evil").mkdir(parents=True)
    (dest / "not a run id!").mkdir()
    (dest / "20991231-000000-copy-rope-pre-abcdef").mkdir()  # a run id with no manifest
    (dest / "20991231-000000-copy-rope-pre-abcdef" / MANIFEST).write_text(json.dumps(
        {"files": {"../../outside": {"size": 0, "sha256": ""}}}))
    done = restore(RunStore(tmp_path / "runs"), dest)
    assert done.runs == () and done.incomplete == ("20991231-000000-copy-rope-pre-abcdef",)
    assert not (tmp_path / "outside").exists()


def test_the_backup_folder_comes_from_lab_backup_dir(tmp_path):
    assert backup_dir({}) is None and backup_dir({"LAB_BACKUP_DIR": "  "}) is None
    assert backup_dir({"LAB_BACKUP_DIR": str(tmp_path)}) == tmp_path


def test_the_job_manager_backs_up_each_finished_run_and_forgets_a_deleted_one(tmp_path):
    store = RunStore(tmp_path / "runs")
    bucket = tmp_path / "bucket"
    jobs = JobManager(store, max_concurrent=1, mode="thread", backup=bucket)
    try:
        run = jobs.submit(TINY, owner="u1")
        assert jobs.wait(run, timeout=120).state == "completed"
        assert read_manifest(bucket / run) is not None  # backed up by the time the run reads finished
        fresh = RunStore(tmp_path / "wiped")
        assert restore(fresh, bucket).runs == (run,) and fresh.summary(run) == store.summary(run)
        jobs.delete(run, owner="u1")
        assert not (bucket / run).exists()
    finally:
        jobs.shutdown(wait=True)
