"""Training on a real Ray cluster (lab/engine/ray_backend.py): a two-node cluster started on this machine
(tests/ray_cluster.py), a 2x2 grid from the command line (`python -m lab sweep --ray`) and from the app
(LAB_RAY_ADDRESS): every run completes with metrics and weights bit for bit those of the same runs trained
locally, Compare shows a Ray run's curve while it trains, a stop reaches a run on the second node, and
killing the second node mid-run leaves its run failed with the reason while the other run finishes.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")  # the optional scale-out requirements (requirements-scale.txt)

from tests.helpers import REPO, compare_api, launch_app, plotted  # noqa: E402
from ui.compare.render import LIVE_POLL_S  # noqa: E402
from tests.ray_cluster import Cluster, start_cluster  # noqa: E402

pytestmark = pytest.mark.app  # the real app in a subprocess (tests/conftest.py, the tiers)
KNOBS = {"task": "copy", "max_len": 4, "d_model": 32, "n_heads": 2, "n_layers": 1}
FLAGS = ["--task", "copy", "--max-len", "4", "--d-model", "32", "--n-heads", "2", "--n-layers", "1"]
GRID = "pos=rope,alibi seed=0,1"
STEPS = 400
TIMING = ("elapsed_s", "tokens_per_s")  # wall-clock fields: the only ones allowed to differ


@pytest.fixture(scope="module")
def cluster() -> Any:
    c = start_cluster()
    try:
        yield c
    finally:
        c.stop()


def sweep(runs_dir: Path, *extra: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "lab", "sweep", "--grid", GRID, *FLAGS, "--steps", str(STEPS),
                          "--runs-dir", str(runs_dir), "--json", *extra], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def by_name(runs_dir: Path) -> dict[str, tuple[list[dict], dict]]:
    """Each run of a store by its name: (metrics without wall-clock fields, final weights)."""
    from lab.engine.store import RunStore

    store, out = RunStore(runs_dir), {}
    for run_id in store.list()["run_id"]:
        lines = (store.path(run_id) / "metrics.jsonl").read_text().splitlines()
        metrics = [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]
        out[store.config(run_id).name] = (metrics, store.load_weights(run_id))
    store.close()
    return out


def assert_same_runs(a: dict, b: dict) -> None:
    import torch

    assert sorted(a) == sorted(b)
    for name in a:
        (ma, wa), (mb, wb) = a[name], b[name]
        assert len(ma) > STEPS // 10 and ma == mb, name
        assert sorted(wa) == sorted(wb) and all(torch.equal(wa[k], wb[k]) for k in wa), name


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The grid trained locally (worker processes, one thread each), for the bit-for-bit comparisons."""
    folder = tmp_path_factory.mktemp("local")
    result = sweep(folder)
    assert [r["state"] for r in result["runs"]] == ["completed"] * 4
    return by_name(folder)


def test_a_sweep_on_ray_equals_the_same_sweep_trained_locally(cluster: Cluster, local_runs: dict, tmp_path: Path):
    result = sweep(tmp_path, "--ray", cluster.address)
    runs = result["runs"]
    assert [r["state"] for r in runs] == ["completed"] * 4, runs
    assert {r["ray_node"] for r in runs} == {cluster.head_node, cluster.worker_node}  # both nodes trained
    assert "Ray cluster" in result["where"] and "2 nodes" in result["where"]
    groups = {g["group"]: g for g in result["groups"]}
    assert sorted(groups) == ["pos=alibi", "pos=rope"] and all(g["runs"] == 2 for g in groups.values())
    assert_same_runs(by_name(tmp_path), local_runs)


# ---- the app, with LAB_RAY_ADDRESS -----------------------------------------------------------------------
def status(runs_dir: Path, run_id: str) -> dict:
    try:
        return json.loads((runs_dir / run_id / "status.json").read_text())
    except (OSError, ValueError):  # being replaced at this instant
        return {}


def wait_for(what: str, check: Any, timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


TIMER: dict = {}  # client -> the live timer's state its page last got


def live_curve(client: Any, run_id: str) -> tuple[Any, bool]:
    views = compare_api(client, [run_id], smoothing=0.0)
    # the client's session keeps what its page shows: the timer is sent when it changes (ui/compare/render.py)
    TIMER.update({client: views["timer"]["value"] == LIVE_POLL_S} if "value" in (views["timer"] or {}) else {})
    return plotted(views["curves"]), bool(TIMER.get(client))


def test_the_app_trains_on_ray_live_stops_and_survives_a_lost_node(cluster: Cluster, local_runs: dict,
                                                                   tmp_path: Path):
    from gradio_client import Client

    with launch_app(tmp_path, {"LAB_RAY_ADDRESS": cluster.address}) as server:
        assert "Training on the Ray cluster" in server.log_text()
        client = Client(server.url, verbose=False)
        out = client.predict(**KNOBS, steps=STEPS, axis1="PE", values1="rope, alibi", axis2="seed", values2="0, 1", axis3="", values3="",
                             my_runs=[], owner="teacher", api_name="/grid_launch")
        ids = out[1]
        assert len(ids) == 4, out[0]
        seen_live = False
        while not all(status(server.runs_dir, r).get("state") == "completed" for r in ids):
            for r in ids:
                if status(server.runs_dir, r).get("state") == "running":
                    curve, active = live_curve(client, r)
                    points = curve["x"].dropna() if len(curve) else curve
                    seen_live |= active and 0 < len(points) and points.max() < STEPS
            assert not any(status(server.runs_dir, r).get("state") == "failed" for r in ids)
            time.sleep(0.2)
        assert seen_live, "Compare never showed a Ray run's curve while it trained"
        assert_same_runs({k: v for k, v in by_name(server.runs_dir).items()}, local_runs)
        assert {status(server.runs_dir, r)["ray_node"] for r in ids} == {cluster.head_node, cluster.worker_node}

        # three long runs on two one-CPU nodes: two train, one waits
        long = [client.predict(**KNOBS, steps=3000, seed=s, my_runs=[], owner="teacher", api_name="/start")[0]["value"]
                for s in (10, 11, 12)]
        node = lambda r: status(server.runs_dir, r).get("ray_node")  # noqa: E731
        first = wait_for("two runs training on the two nodes", lambda: [r for r in long if node(r)][:2]
                         if sum(1 for r in long if node(r)) == 2 else None)
        on_worker = next(r for r in first if node(r) == cluster.worker_node)
        on_head = next(r for r in first if node(r) == cluster.head_node)
        assert client.predict(on_worker, "teacher", api_name="/stop")
        wait_for("the stop to reach the second node", lambda: status(server.runs_dir, on_worker).get("state") == "stopped",
                 60)
        last = next(r for r in long if r not in first)
        wait_for("the third run to start on the freed node",
                 lambda: node(last) == cluster.worker_node and status(server.runs_dir, last).get("step", 0) > 0)
        curve, active = live_curve(client, last)
        assert active and len(curve["x"].dropna())
        cluster.kill_worker_node()
        failed = wait_for("the killed node's run to fail", lambda: status(server.runs_dir, last).get("state") == "failed"
                          and status(server.runs_dir, last), 120)
        # the node died under the task, or took with it a batch of records the task had sent (ObjectLostError)
        assert failed["error"].startswith("the Ray node training this run "), failed
        done = wait_for("the run on the head node to finish",
                        lambda: status(server.runs_dir, on_head).get("state") in ("completed", "failed")
                        and status(server.runs_dir, on_head), 300)
        assert done["state"] == "completed", done
        assert "Traceback" not in server.log_text()
