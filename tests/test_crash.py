"""Crash safety: a real server (`python app.py`) is SIGKILLed with runs in flight at random moments,
five times, restarting on the same store each time. After every kill and restart: finished runs
are intact (byte for byte), killed runs read `interrupted` with the metrics they had written, no
file is torn (every JSON file parses, every metrics line parses, every safetensors file is whole),
nothing a dead writer left behind survives the restart, and the listing works.

The seed of the random kill moments is printed (and can be fixed with LAB_CRASH_SEED).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from lab.engine.liveness import LOCK_DIR, writer_alive
from lab.engine.store import LIVE_STATES
from lab.engine.storefs import safetensors_problem
from tests.helpers import compare_api, descendants, launch_app

pytestmark = pytest.mark.app  # the real app in a subprocess (tests/conftest.py, the tiers)
KILLS = 5
OWNER = "c" * 32
SHORT = {"task": "copy", "max_len": 4, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "steps": 60}
LONG = {**SHORT, "steps": 4000}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def check_no_torn_file(runs_dir: Path) -> dict[str, dict]:
    """Every visible file of every run reads whole; returns run id -> {status, metrics lines}."""
    found = {}
    for folder in sorted(p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for name in ("config.json", "status.json", "summary.json"):
            if (folder / name).exists() or name != "summary.json":
                assert isinstance(json.loads((folder / name).read_bytes()), dict), f"{folder.name}/{name}"
        lines = (folder / "metrics.jsonl").read_bytes().split(b"\n") if (folder / "metrics.jsonl").exists() else [b""]
        assert lines[-1] == b"", f"{folder.name}/metrics.jsonl ends in a torn line"
        assert all(isinstance(json.loads(line), dict) for line in lines[:-1]), f"{folder.name}/metrics.jsonl"
        for tensors in [folder / "weights.safetensors", *(folder / "attention").glob("*.safetensors")]:
            if tensors.exists():
                assert safetensors_problem(tensors) is None, safetensors_problem(tensors)
        found[folder.name] = {"status": json.loads((folder / "status.json").read_bytes()), "lines": len(lines) - 1}
    return found


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != "status.json":  # status may gain a read-time field; checked separately
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def leftovers(runs_dir: Path) -> list[str]:
    """Dot-files and dot-folders (temp files, half-made or half-deleted runs), the lock folder aside."""
    return [str(p.relative_to(runs_dir)) for p in runs_dir.rglob(".*") if p != runs_dir / LOCK_DIR]


def dead_locks(runs_dir: Path) -> list[str]:
    """Lock files of writers that died: a restart's sweep removes them."""
    locks = runs_dir / LOCK_DIR
    return sorted(p.name for p in locks.glob("*.lock") if writer_alive(runs_dir, p.stem) is not True)


def test_sigkill_at_random_moments_then_restart(tmp_path, record_property):
    from gradio_client import Client

    seed = int(os.environ.get("LAB_CRASH_SEED", random.randrange(10**6)))
    print(f"\ncrash test seed: {seed} (LAB_CRASH_SEED)")
    rng = random.Random(seed)
    finished: dict[str, str] = {}  # completed run -> digest when first seen completed
    killed_live: dict[str, int] = {}  # run live at a kill -> metrics lines it had
    for kill in range(KILLS + 1):
        with launch_app(tmp_path) as server:
            runs_dir = server.runs_dir
            # after a restart: nothing of a dead writer is left, and the store is consistent
            if runs_dir.exists():
                assert leftovers(runs_dir) == [], leftovers(runs_dir)
                assert dead_locks(runs_dir) == [], dead_locks(runs_dir)
            client = Client(server.url, verbose=False)
            table = compare_api(client)["table"]
            listed = {row[0]: row for row in table["data"]}
            assert set(listed) == set(finished) | set(killed_live), "a run went missing or appeared"
            store_view = check_no_torn_file(runs_dir) if runs_dir.exists() else {}
            for run_id, lines in killed_live.items():
                text, loss, *_ = client.predict(run_id, api_name="/poll")
                assert "Interrupted" in text, text
                assert store_view[run_id]["status"]["state"] == "interrupted"
                assert store_view[run_id]["lines"] == lines  # its metrics so far, all kept
            for run_id, before in finished.items():
                assert digest(runs_dir / run_id) == before, f"finished run {run_id} changed"
                assert store_view[run_id]["status"]["state"] == "completed"
            if kill == KILLS:
                break

            # runs in flight: a short one (may finish before the kill) and two long ones
            for knobs in (SHORT, LONG, LONG):
                client.predict(**{**knobs, "seed": kill}, my_runs=[], owner=OWNER, api_name="/start")
            time.sleep(rng.uniform(0.5, 5.0))
            family = descendants(server.proc.pid)
            os.kill(server.proc.pid, signal.SIGKILL)
            server.proc.wait(timeout=30)
            deadline = time.monotonic() + 30
            while any(alive(p) for p in family):  # worker processes die with the server
                assert time.monotonic() < deadline, f"processes outlived the killed server: {family}"
                time.sleep(0.2)
            for run_id, info in check_no_torn_file(runs_dir).items():
                state = info["status"]["state"]
                if state in LIVE_STATES or state == "interrupted":  # (a worker may mark it itself as it dies)
                    killed_live[run_id] = info["lines"]
                elif state == "completed" and run_id not in finished:
                    finished[run_id] = digest(runs_dir / run_id)
                else:
                    assert state in ("completed", "interrupted"), (run_id, state)
    assert len(killed_live) >= KILLS, "too few runs were in flight at the kills"
    record_property("crash_runs_killed", len(killed_live))
    record_property("crash_runs_finished", len(finished))
