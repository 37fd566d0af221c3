"""Publishing runs to a Trackio class board (lab/engine/trackio_board.py, lab/cli/publish.py; issue 16, item 3).

Three small real runs (an ablation grid's PE x seed: two rope seeds share a group) and three bad ones
(queued, damaged, failed with no metrics) are published to a local Trackio project in a temp folder,
then read back through Trackio: every published run with its config and group, and every metric point
(each train and eval record of the store, at its step) equal to what the store holds.

Trackio fixes its folder ($TRACKIO_DIR) when it is imported, so it is never imported in this process:
publishing and reading back run in subprocesses with TRACKIO_DIR set, and the tests that need Trackio
are skipped where it is not installed (the README's test command installs requirements-scale.txt).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.cli import publish as cli_publish
from lab.config import flatten
from lab.engine.recorder import record_run
from lab.engine.store import RunStore
from lab.engine.trackio_board import finished_run_ids, publish_runs, run_group
from lab.engine.grid import build_grid
from tests.helpers import PUBLISHED as BASE, REPO, expected_points, needs_trackio, read_back, sort_key

CLI = ("import sys; from lab.engine.store import RunStore; from lab.cli.publish import main; "
       "sys.exit(main(sys.argv[1:], RunStore))")
@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """A store with three trained grid runs (rope s0, rope s1, alibi s0) and three bad runs."""
    store = RunStore(tmp_path_factory.mktemp("publish") / "runs")
    good = []
    for cfg in build_grid(BASE, [("PE", "rope,alibi"), ("seed", "0,1")])[:3]:
        run_id = store.create(cfg)
        record_run(store, run_id, threads=1)
        good.append(run_id)
    queued = store.create(BASE)
    damaged = store.create(BASE)
    (store.path(damaged) / "status.json").write_text("{not json", encoding="utf-8")
    failed = store.create(BASE)
    store.set_status(failed, "failed", error="out of memory")
    return {"store": store, "good": good, "queued": queued, "damaged": damaged, "failed": failed}


def run_cli(args: list[str], trackio_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRACKIO_DIR": str(trackio_dir)}
    env.pop("LAB_TRACKIO_SPACE", None)
    env.pop("TRACKIO_SPACE_ID", None)
    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def published(runs, tmp_path_factory) -> dict:
    """The CLI's --json report of publishing the good and the bad runs, and the project's folder."""
    trackio_dir = tmp_path_factory.mktemp("trackio")
    bad = [runs["queued"], runs["damaged"], runs["failed"]]
    out = run_cli([*runs["good"], *bad, "--project", "class-board", "--runs-dir", str(runs["store"].root),
                   "--json"], trackio_dir)
    return {"out": out, "report": json.loads(out.stdout), "dir": trackio_dir}


@pytest.mark.app
@needs_trackio
def test_a_grid_is_published_and_reads_back_through_trackio(runs, published):
    store, report = runs["store"], published["report"]
    assert published["out"].returncode == 1  # some runs were skipped
    assert report["published"] == runs["good"]
    board = read_back("class-board", published["dir"])
    assert sorted(board) == sorted(report["names"][r] for r in runs["good"])
    groups = {}
    for run_id in runs["good"]:
        name = report["names"][run_id]
        assert run_id in name and name.startswith(store.config(run_id).name)  # 'pos=rope seed=1 [<run id>]'
        got = board[name]
        config = {k: v for k, v in got["config"].items() if not k.startswith("_")}
        assert config == {**json.loads(json.dumps(flatten(store.config(run_id)))), "run_id": run_id,
                          "state": "completed"}
        groups[run_id] = got["config"]["_Group"]
        want = expected_points(store, run_id)
        assert len(want) > 100 and any("eval/exact_match" in p for p in want)
        assert sorted(got["logs"], key=sort_key) == sorted(want, key=sort_key)  # every point, exactly
    rope0, rope1, alibi0 = runs["good"]
    assert groups == {rope0: "pos=rope", rope1: "pos=rope", alibi0: "pos=alibi"}  # seed repeats together


@pytest.mark.app
@needs_trackio
def test_bad_runs_are_skipped_with_their_reason(runs, published):
    reasons = {s["run_id"]: s["reason"] for s in published["report"]["skipped"]}
    assert set(reasons) == {runs["queued"], runs["damaged"], runs["failed"]}
    assert reasons[runs["queued"]].startswith("still queued")
    assert reasons[runs["damaged"]].startswith("damaged: status.json")
    assert reasons[runs["failed"]] == "failed with no metrics recorded"
    err = published["out"].stderr
    assert all(f"lab: skipped {r}: " in err for r in reasons) and "Traceback" not in err


@pytest.mark.app
@needs_trackio
def test_publishing_again_sends_nothing_twice(runs, published):
    before = read_back("class-board", published["dir"])
    out = run_cli(["--all", "--project", "class-board", "--runs-dir", str(runs["store"].root), "--json"],
                  published["dir"])
    report = json.loads(out.stdout)
    assert out.returncode == 0, out.stderr
    assert report["published"] == [] and report["already"] == runs["good"] and report["skipped"] == []
    assert read_back("class-board", published["dir"]) == before


def test_bad_runs_are_skipped_without_trackio(runs):
    """Nothing to send: Trackio is not even imported."""
    had = "trackio" in sys.modules
    report = publish_runs(runs["store"], [runs["queued"], runs["failed"], "no-such-run", "../up"], "p")
    assert report.published == [] and [r for r, _ in report.skipped] == [runs["queued"], runs["failed"],
                                                                          "no-such-run", "../up"]
    assert dict(report.skipped)["no-such-run"] == "does not exist in this run store"
    assert "not a valid run id" in dict(report.skipped)["../up"]
    assert ("trackio" in sys.modules) == had


def test_all_means_every_completed_or_stopped_run(runs):
    assert finished_run_ids(runs["store"]) == runs["good"]


def test_groups():
    grid = flatten(build_grid(BASE, [("PE", "rope"), ("norm", "post"), ("seed", "3")])[0])
    assert run_group(grid) == "pos=rope norm=post"
    seeds_only = flatten(build_grid(BASE, [("seed", "2")])[0])
    assert run_group(seeds_only) == "pos=learned norm=pre layers=1 heads=2 d_model=16"  # the config they share
    assert run_group(flatten(BASE)) is None  # not from a grid
    assert run_group({**flatten(BASE), "name": "pos=alibi"}) is None  # a name that is not its config's values
    assert run_group(flatten(BASE), ["model.norm", "task.name"]) == "norm=pre task.name=copy"


@pytest.mark.parametrize("args, flag", [
    (["RUN"], "--project"),
    (["RUN", "--project", "a b"], "--project"),
    (["--all", "RUN", "--project", "p"], "--all"),
    (["--project", "p"], "RUN_ID"),
    (["RUN", "--project", "p", "--group-by", "model.nope"], "--group-by"),
    (["RUN", "--project", "p", "--group-by", ","], "--group-by"),
    (["RUN", "--project", "p", "--bogus"], "--bogus"),
])
def test_a_bad_flag_is_one_line_naming_it(args, flag, tmp_path, capsys):
    try:
        rc = cli_publish.main([*args, "--runs-dir", str(tmp_path)], RunStore)
    except SystemExit as exc:  # argparse's own errors (an unknown flag)
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lab: error: ") and flag in err


def test_without_trackio_the_message_says_what_to_install(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "trackio", None)  # `import trackio` now fails as if it were not installed
    rc = cli_publish.main([runs["good"][0], "--project", "p", "--runs-dir", str(runs["store"].root)], RunStore)
    err = capsys.readouterr().err
    assert rc == 2 and "pip install -r requirements-scale.txt" in err and "Traceback" not in err


@pytest.mark.app
def test_importing_lab_imports_no_trackio():
    code = ("import sys, lab, lab.engine.trackio_board, lab.cli.publish, lab.cli; "
            "assert 'trackio' not in sys.modules, 'trackio imported'")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr

