"""Lesson bundles (lab/engine/bundle.py, `python -m lab bundle`): finished runs in one file that an app loads at
start; what a bundle keeps and leaves out; damaged or hostile files write nothing; a class attaches to a
bundle's runs when they are this code's; another version's runs are labelled."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from lab.engine.bundle import MANIFEST, BundleError, bundle_paths, load_bundle, load_bundles, write_bundle
from lab.engine.identity import code_version, identity
from lab.engine.jobs import JobManager
from lab.engine.recorder import record_run
from lab.engine.sharing import describe_claim, provenance
from lab.engine.store import RunStore
from lab.teach.presets.catalog import PRESETS
from tests.helpers import FakeTrainer, lab, named, preset_bundle


def finished(store: RunStore, cfg, version: str | None = None) -> str:
    run_id = store.create(cfg, owner="teacher-0001", identity=identity(cfg, version),
                          code_version=version or code_version())
    record_run(store, run_id, train_fn=FakeTrainer(step_s=0))
    (store.path(run_id) / "checkpoint.safetensors").write_bytes(b"x" * 1000)  # as a real run keeps one
    store.write_json(run_id, "holders.json", ["teacher-0001", "student-0001"])
    return run_id


def test_a_bundle_carries_what_the_views_read_and_loads_whole(tmp_path):
    src = RunStore(tmp_path / "a")
    ids = [finished(src, named("one")), finished(src, named("two"))]
    size = write_bundle(src, ids, tmp_path / "lesson.zip", ["hello_sort"])
    names = zipfile.ZipFile(tmp_path / "lesson.zip").namelist()
    assert size == (tmp_path / "lesson.zip").stat().st_size and MANIFEST in names
    assert f"{ids[0]}/weights.safetensors" in names and f"{ids[0]}/attention/step_0000000.safetensors" in names
    assert not [n for n in names if n.endswith(("checkpoint.safetensors", "holders.json"))]

    dst = RunStore(tmp_path / "b")
    got = load_bundle(dst, tmp_path / "lesson.zip")
    assert sorted(got.runs) == sorted(ids) and got.present == () and got.code_version == code_version()
    for run_id in ids:
        status = dst.status(run_id)
        assert status["state"] == "completed" and status["owner"] == "" and status["bundle"] == "lesson.zip"
        assert dst.metrics(run_id).equals(src.metrics(run_id)) and dst.config(run_id) == src.config(run_id)
        assert dst.holders(run_id) == [""]  # nobody's: no student can delete it
    again = load_bundle(dst, tmp_path / "lesson.zip")
    assert again.runs == () and sorted(again.present) == sorted(ids)
    assert provenance(dst.status(ids[0])) == "From the lesson bundle lesson.zip."

    jobs = JobManager(dst, max_concurrent=1, train_fn=FakeTrainer(step_s=0))  # a class attaches to it
    claim = jobs.claim_many([named("one")], owner="student-0002")[0]
    assert claim.attached and claim.run_id == ids[0] and claim.bundle == "lesson.zip"
    assert "trained for this lesson" in describe_claim(claim) and "so the same result" in describe_claim(claim)
    with pytest.raises(PermissionError):
        jobs.delete(ids[1], owner="student-0002")
    jobs.shutdown(wait=True)


def test_another_versions_runs_are_shown_labelled_and_not_reused(tmp_path):
    src = RunStore(tmp_path / "a")
    old = finished(src, named("old"), "0.0.9+0123456789")
    write_bundle(src, [old], tmp_path / "old.zip")
    dst = RunStore(tmp_path / "b")
    lines = load_bundles(dst, [tmp_path / "old.zip"])
    assert lines == ["Lesson bundle old.zip: 1 run(s) loaded, 0 already here"]  # the manifest: this code wrote it
    assert "another version of the lab (0.0.9+0123456789" in provenance(dst.status(old))
    jobs = JobManager(dst, max_concurrent=1, train_fn=FakeTrainer(step_s=0))
    claim = jobs.claim_many([named("old")], owner="student-0002")[0]
    assert not claim.attached and claim.run_id != old
    from ui.common import AppContext
    from ui.presets import compare_note

    said = compare_note(AppContext(dst, jobs), {}, [old, claim.run_id])  # Compare labels the old one
    assert said == (f"*1 of the 2 runs shown were trained by another version of the lab (1 by lab 0.0.9+0123456789; "
                    f"this server runs {code_version()}).*")
    assert compare_note(AppContext(dst, jobs), {}, [claim.run_id]) == ""
    jobs.wait(claim.run_id, 30)
    jobs.shutdown(wait=True)


def test_a_damaged_or_hostile_bundle_writes_nothing(tmp_path):
    src = RunStore(tmp_path / "a")
    run_id = finished(src, named("one"))
    good = tmp_path / "good.zip"
    write_bundle(src, [run_id], good)
    manifest = json.loads(zipfile.ZipFile(good).read(MANIFEST))

    def variant(name: str, change) -> Path:
        path = tmp_path / name
        with zipfile.ZipFile(good) as zin, zipfile.ZipFile(path, "w") as zout:
            for item in zin.namelist():
                data = zin.read(item)
                out = change(item, data)
                if out is not None:
                    zout.writestr(out[0], out[1])
        return path

    tampered = variant("tampered.zip", lambda n, d: (n, d + b"!" if n.endswith("metrics.jsonl") else d))
    escaping = dict(manifest, runs={run_id: {"../../evil.txt": {"size": 1, "sha256": "0"}}})
    hostile = variant("hostile.zip", lambda n, d: (n, json.dumps(escaping).encode() if n == MANIFEST else d))
    bomb = dict(manifest, runs={run_id: {"metrics.jsonl": {"size": 2**40, "sha256": "0"}}})
    huge = variant("huge.zip", lambda n, d: (n, json.dumps(bomb).encode() if n == MANIFEST else d))
    (tmp_path / "not.zip").write_bytes(b"hello")
    dst = RunStore(tmp_path / "b")
    for path, why in ((tampered, "does not match its manifest"), (hostile, "is not a plain file of a run"),
                      (huge, "unpacks to"), (tmp_path / "not.zip", "not a readable zip file")):
        with pytest.raises(BundleError, match=why):
            load_bundle(dst, path)
    assert dst.run_ids() == [] and not list((tmp_path / "b").glob(".*")) and not (tmp_path / "evil.txt").exists()
    assert "not loaded" in load_bundles(dst, [tampered])[0]
    with pytest.raises(BundleError, match="only finished runs"):
        write_bundle(src, [src.create(named("q"))], tmp_path / "q.zip")
    assert not (tmp_path / "q.zip").exists()


def test_bundle_paths_come_from_lab_bundle_and_the_backup_folder(tmp_path):
    (tmp_path / "lessons").mkdir()
    for name in ("b.zip", "a.zip", "notes.txt"):
        (tmp_path / "lessons" / name).write_bytes(b"")
    (tmp_path / "bucket" / "bundles").mkdir(parents=True)
    (tmp_path / "bucket" / "bundles" / "c.zip").write_bytes(b"")
    env = {"LAB_BUNDLE": f"{tmp_path / 'lessons'}:{tmp_path / 'one.zip'}"}
    assert bundle_paths(env, tmp_path / "bucket") == [tmp_path / "bucket" / "bundles" / "c.zip",
                                                       tmp_path / "lessons" / "a.zip", tmp_path / "lessons" / "b.zip",
                                                       tmp_path / "one.zip"]
    assert bundle_paths({}) == []


def test_a_bundle_of_presets_answers_their_cards(tmp_path):
    from ui.common import AppContext
    from ui.presets import cards

    path = preset_bundle(tmp_path, ["hello_sort", "induction"])
    store = RunStore(tmp_path / "runs")
    load_bundle(store, path)
    jobs = JobManager(store, max_concurrent=1, train_fn=FakeTrainer(step_s=0))
    texts = dict(zip(PRESETS, cards(AppContext(store, jobs), "student-0003")))
    for key in ("hello_sort", "induction"):
        assert "**Last result on this server** (finished by" in texts[key]
        assert "UTC; *From the lesson bundle lesson.zip*): " in texts[key]
    assert "Not run on this server yet" in texts["grokking"]
    claims = jobs.claim_many(list(PRESETS["induction"].runs), owner="student-0003")
    assert all(c.attached for c in claims) and jobs.train_fn.calls == []  # no training at all
    jobs.shutdown(wait=True)


@pytest.mark.app
def test_the_bundle_command(tmp_path):
    bad = lab("bundle", "--out", str(tmp_path / "x.zip"), runs_dir=tmp_path / "runs")
    assert bad.returncode == 2 and "name the presets to bundle, or give --all" in bad.stderr
    bad = lab("bundle", "nope", "--out", str(tmp_path / "x.zip"), runs_dir=tmp_path / "runs")
    assert bad.returncode == 2 and "'nope' is not a preset" in bad.stderr
    bad = lab("bundle", "hello_sort", "--out", str(tmp_path / "x.txt"), runs_dir=tmp_path / "runs")
    assert bad.returncode == 2 and "is not a .zip file" in bad.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.app
def test_the_bundle_command_trains_once_and_writes_a_bundle_the_app_loads(tmp_path):
    out = lab("bundle", "hello_sort", "--out", str(tmp_path / "sort.zip"), runs_dir=tmp_path / "runs", timeout=600)
    assert out.returncode == 0, out.stderr
    assert f"{tmp_path / 'sort.zip'}: 1 runs of 1 preset(s)" in out.stdout and "LAB_BUNDLE=" in out.stdout
    first = RunStore(tmp_path / "runs").run_ids()
    again = lab("bundle", "hello_sort", "--out", str(tmp_path / "again.zip"), runs_dir=tmp_path / "runs", timeout=600)
    assert again.returncode == 0 and RunStore(tmp_path / "runs").run_ids() == first  # trained nothing twice
    loaded = load_bundle(RunStore(tmp_path / "app"), tmp_path / "sort.zip")
    assert loaded.runs == tuple(first)
