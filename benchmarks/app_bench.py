"""App-side figures for run_all.py: cold start, training inside the running app against the CLI,
Compare with 200 stored runs, Inspect for a stored run. Servers run in temp folders and are stopped."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from lab.config import RunConfig, TrainConfig
from lab.records import EXACT_MATCH, LOSS, TOKEN_ACC, EvalRecord, StepRecord
from lab.engine.store import RunStore
from results import free_port  # benchmarks/results.py (run_all puts this folder on the path)

REPO = Path(__file__).resolve().parents[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _env(runs: str, port: int) -> dict[str, str]:
    return dict(os.environ, LAB_RUNS_DIR=runs, GRADIO_SERVER_PORT=str(port), GRADIO_SERVER_NAME="127.0.0.1",
                GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))


def cold_start(rounds: int = 2) -> dict[str, Any]:
    """`python app.py` until GET / answers 200, against `python -c "import gradio, torch"`, interleaved;
    the fastest of `rounds` each (the machine is shared: the minimum is the least disturbed)."""
    app, bare = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import gradio, torch"], check=True, cwd=REPO)
        bare.append(time.perf_counter() - t0)
        with tempfile.TemporaryDirectory() as tmp:
            port = free_port()
            t0 = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "app.py"], cwd=REPO, env=_env(tmp, port),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                while not _answers(f"http://127.0.0.1:{port}/"):
                    if proc.poll() is not None or time.perf_counter() - t0 > 180:
                        raise RuntimeError("app.py did not answer")
                    time.sleep(0.05)
                app.append(time.perf_counter() - t0)
            finally:
                proc.terminate()
                proc.wait(30)
    return {"app_s": min(app), "import_s": min(bare), "ratio": min(app) / min(bare)}


def app_vs_cli(steps: int = 1000, rounds: int = 2) -> list[dict[str, Any]]:
    """The app's default run trained by `python -m lab train --threads 1` and through a launched app
    (build_demo, served): started with the app's own /start endpoint and polled with /poll once a second,
    as the page's timer does, so it trains in the app's own job manager (worker processes, one intra-op
    thread each). CLI and app alternate `rounds` times; tok/s of the training loop, best of the rounds."""
    from gradio_client import Client

    from app import build_demo
    from lab.engine.jobs import JobManager

    cli_best, app_best, polls = 0.0, 0.0, 0
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(tmp)
        demo = build_demo(store, JobManager(store, max_concurrent=2))
        port = free_port()
        demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        try:
            client = Client(f"http://127.0.0.1:{port}/", verbose=False)

            def in_app(n: int) -> str:
                run_id = client.predict(steps=n, my_runs=[], owner="bench-user",
                                        api_name="/start")[0]["value"]
                nonlocal polls
                while store.status(run_id).get("state") in ("queued", "running"):
                    client.predict(run_id, api_name="/poll")
                    polls += 1
                    time.sleep(1.0)
                return run_id

            in_app(20)  # warm: the first job's imports
            for _ in range(rounds):
                cli = subprocess.run([sys.executable, "-m", "lab", "train", "--steps", str(steps), "--device", "cpu",
                                      "--threads", "1", "--runs-dir", tmp, "--json"], cwd=REPO, capture_output=True,
                                     text=True, check=True, env=_env(tmp, 0))  # just before: the same machine load
                cli_best = max(cli_best, json.loads(cli.stdout)["tokens_per_s"])
                app_best = max(app_best, store.summary(in_app(steps))["tokens_per_s"])
        finally:
            demo.close()
            store.close()
    return [{"mode": "process", "app_tok_s": app_best, "cli_tok_s": cli_best, "slowdown": cli_best / app_best,
             "polls": polls}]


def _fake_runs(store: RunStore, n: int, points: int = 100) -> list[str]:
    """n completed runs with `points` train records and 10 evals each (as a 1000-step run logs)."""
    ids = []
    pes = ("learned", "rope", "alibi", "sinusoidal", "none")
    for i in range(n):
        base = RunConfig()
        cfg = replace(base, model=replace(base.model, pos=pes[i % 5]), train=replace(base.train, seed=i))
        rid = store.create(cfg)
        for s in range(1, points + 1):
            store.append(rid, StepRecord(s * 10, 2.0 / s, 1e-3, 0.5, s * 640, s * 0.1, 6400.0))
            if s % 10 == 0:
                store.append(rid, EvalRecord(s * 10, s * 0.1, s * 640, 1.0 / s, 0.5, 0.4, 2.0, 0.2, 0.1))
        store.write_summary(rid, {"params": 1000, "steps": points * 10, "train_loss": 0.02,
                                  "eval": {LOSS: 0.1, TOKEN_ACC: 0.9, EXACT_MATCH: 0.8},
                                  "ood": {LOSS: 2.0, TOKEN_ACC: 0.3, EXACT_MATCH: 0.1}, "wall_s": 10.0,
                                  "tokens_per_s": 6400.0, "device": "cpu", "stopped": False})
        store.set_status(rid, "completed", step=points * 10)
        ids.append(rid)
    return ids


def compare_200() -> dict[str, Any]:
    """Compare's one render event (ui/compare/render.py: listing, table, overlaid curves, final metrics,
    config diff, parameter chart, stability map and seed bands where they apply) for 200 stored runs
    picked at once: seconds until everything it returns is built, on a fresh page."""
    from lab.engine.jobs import JobManager
    from ui.common import AppContext
    from ui.compare.render import Controls, render

    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(tmp)
        ids = _fake_runs(store, 200)
        ctx = AppContext(store=store, jobs=JobManager(store, max_concurrent=1, mode="thread"))
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            out = render(ctx, Controls.of([], ids, ["train loss (batch)"], "step", 0.0, True, True), {})
            times.append(time.perf_counter() - t0)
        points = sum(len(t.x) for t in out["curves"].data)
        store.close()
    return {"runs": 200, "curve_points": points, "first_s": times[0], "again_s": times[1]}


def inspect_run() -> dict[str, Any]:
    """ui.inspect.attention for a stored run: attention heatmap grid at a snapshot, and the PE PCA panel."""
    from lab.engine.jobs import JobManager
    from lab.engine.recorder import record_run
    from ui.common import AppContext
    from ui.inspect.attention import attention_figures, positional_panel

    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(tmp)
        cfg = RunConfig(train=TrainConfig(steps=50, device="cpu", snapshots=3))
        rid = store.create(cfg)
        record_run(store, rid, threads=1)
        ctx = AppContext(store=store, jobs=JobManager(store, max_concurrent=1, mode="thread"))
        t0 = time.perf_counter()
        attention_figures(ctx, rid, "sampled", "", 50)
        t1 = time.perf_counter()
        positional_panel(ctx, rid)
        t2 = time.perf_counter()
        store.close()
    return {"heatmaps_s": t1 - t0, "pca_s": t2 - t1, "total_s": t2 - t0}
