"""Runs survive a restart, end to end with the real app: with LAB_BACKUP_DIR set, two runs finish; the
server is killed (SIGKILL) and its runs folder deleted, as a Space's disk is wiped on restart; the app
started again with the same LAB_BACKUP_DIR has both runs back, and they render in Compare and Inspect. And a
run interrupted by a killed server is continued from the restarted app (issue 14's acceptance)."""
from __future__ import annotations

import shutil

import pytest
from gradio_client import Client

from tests.helpers import compare, launch_app, poll_until_done, start

pytestmark = pytest.mark.app  # the real app in a subprocess (tests/conftest.py, the tiers)


def test_finished_runs_come_back_after_the_disk_is_wiped(tmp_path):
    folder, bucket = tmp_path / "space", tmp_path / "bucket"
    folder.mkdir()
    env = {"LAB_BACKUP_DIR": str(bucket)}
    with launch_app(folder, env) as server:
        client = Client(server.url, verbose=False)
        ids = [start(client, seed=s) for s in (1, 2)]
        before = {}
        for r in ids:
            poll_until_done(client, r)
            before[r] = (server.runs_dir / r / "metrics.jsonl").read_bytes()
        server.proc.kill()  # no clean shutdown
        server.proc.wait(timeout=20)
    shutil.rmtree(folder / "runs")  # the disk after a restart

    with launch_app(folder, env) as server:
        assert "Restored 2 run(s)" in server.log_text()
        client = Client(server.url, verbose=False)
        for r in ids:
            assert (server.runs_dir / r / "metrics.jsonl").read_bytes() == before[r]
        curves, finals, _, _ = compare(client, ids)
        assert sorted(finals["state"]) == ["completed", "completed"] and set(finals["steps"]) == {150}
        assert curves.groupby("run")["x"].max().tolist() == [150, 150]
        for r in ids:  # Inspect: the attention heatmaps and the positional panel of each restored run
            _, dec_self, _, caption = client.predict(run_id=r, source="sampled", text="", step=150,
                                                     api_name="/attention_for_run")
            assert dec_self["visible"] is True and dec_self["value"]["plot"].startswith("data:image"), caption
            pca, _, note = client.predict(r, api_name="/positional_a")
            assert pca["value"]["plot"].startswith("data:image") and note.startswith("PCA of")


def test_a_run_interrupted_by_a_killed_server_is_continued_from_the_app(tmp_path):
    """A server is SIGKILLed while a run trains: the restarted app reads the run interrupted, and Continue
    training goes on from its last checkpoint in its own folder, with no repeated step."""
    import json
    import time

    folder = tmp_path / "server"
    folder.mkdir()
    with launch_app(folder) as server:
        client = Client(server.url, verbose=False)
        run_id = start(client, steps=5000)
        checkpoint = server.runs_dir / run_id / "checkpoint.safetensors"
        deadline = time.monotonic() + 120
        while not checkpoint.exists():  # its first checkpoint: an evaluation point
            assert time.monotonic() < deadline, "the run never reached an evaluation point"
            time.sleep(0.5)
        server.proc.kill()
        server.proc.wait(timeout=20)

    with launch_app(folder) as server:
        client = Client(server.url, verbose=False)
        status = json.loads((server.runs_dir / run_id / "status.json").read_text())
        assert status["state"] == "interrupted", status
        note, _, _ = client.predict(run_id, 100, "u1", api_name="/continue_run")
        assert note == "", note
        text, _, _ = poll_until_done(client, run_id)
        assert "Completed" in text, text
        steps = [json.loads(line)["step"] for line in (server.runs_dir / run_id / "metrics.jsonl").open()
                 if json.loads(line)["kind"] == "train"]
        assert steps == sorted(set(steps)) and steps[-1] == json.loads(
            (server.runs_dir / run_id / "config.json").read_text())["train"]["steps"]
