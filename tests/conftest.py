"""Shared fixtures: the real app launched in a subprocess (`python app.py`) on a free port, and torch
held to one intra-op thread for a test module.

The server gets its own run store (LAB_RUNS_DIR in a temp folder) and writes its output to a log
file, so tests can check that no traceback was printed. It is terminated (killed if it hangs) at
the end. Waits are generous: the CI host is small, shared and noisy. Helpers for the browser tests
are in tests/browser.py.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

import pytest

if TYPE_CHECKING:
    from ui.common import AppContext

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 120.0  # importing torch and gradio on a busy 2-core host can take a while


@dataclass(frozen=True)
class AppServer:
    url: str  # "http://127.0.0.1:PORT"
    runs_dir: Path  # the server's LAB_RUNS_DIR
    log_path: Path  # its stdout and stderr
    proc: subprocess.Popen

    def log_text(self, start: int = 0) -> str:
        """The server's output from byte `start` on."""
        with open(self.log_path, "rb") as fh:
            fh.seek(start)
            return fh.read().decode("utf-8", "replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def run_folders(self) -> set[str]:
        """Run folders in the store (dot-folders are runs still being created)."""
        if not self.runs_dir.is_dir():
            return set()
        return {p.name for p in self.runs_dir.iterdir() if p.is_dir() and p.name != ".locks"}  # not writer locks


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def trained_run(store, cfg) -> str:
    """A run of `cfg` trained to the end in this process (one thread) in `store`; its id."""
    from lab.engine.recorder import record_run

    run_id = store.create(cfg)
    record_run(store, run_id, threads=1)
    return run_id


@contextmanager
def app_with_run(folder: Path, cfg) -> Iterator[tuple[AppServer, str]]:
    """`python app.py` on a store in `folder/runs` holding one trained run of `cfg`: (server, run id)."""
    from lab.engine.store import RunStore

    store = RunStore(folder / "runs")
    run_id = trained_run(store, cfg)
    store.close()
    with launch_app(folder) as server:
        yield server, run_id


@contextmanager
def app_context(folder: Path, **jobs_kwargs) -> Iterator["AppContext"]:
    """The UI's context on a store in `folder/runs` with one training slot (JobManager(**jobs_kwargs));
    jobs shut down and the store closed after."""
    from lab.engine.jobs import JobManager
    from lab.engine.store import RunStore
    from ui.common import AppContext

    store = RunStore(folder / "runs")
    jobs = JobManager(store, **{"max_concurrent": 1, **jobs_kwargs})
    try:
        yield AppContext(store, jobs)
    finally:
        jobs.shutdown(wait=True)
        store.close()


@contextmanager
def launch_app(folder: Path, extra_env: Optional[dict[str, str]] = None) -> Iterator[AppServer]:
    """Start `python app.py` with its store in `folder/runs` (and `extra_env`); yield once it answers HTTP."""
    runs_dir, log_path = folder / "runs", folder / "server.log"
    port = free_port()
    env = dict(os.environ, LAB_RUNS_DIR=str(runs_dir), GRADIO_SERVER_PORT=str(port),
               GRADIO_SERVER_NAME="127.0.0.1", GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1",
               **(extra_env or {}))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "app.py"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = AppServer(f"http://127.0.0.1:{port}", runs_dir, log_path, proc)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(server.url + "/"):
            if proc.poll() is not None:
                pytest.fail(f"app.py exited with status {proc.returncode} before answering:\n"
                            f"{server.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"app.py did not answer on {server.url} within {START_TIMEOUT_S:.0f} s:\n"
                            f"{server.log_text()[-3000:]}")
            time.sleep(0.5)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


@pytest.fixture(scope="session")
def app_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """One launched app shared by the gradio_client tests."""
    with launch_app(tmp_path_factory.mktemp("app")) as server:
        yield server


@pytest.fixture(scope="session")
def client(app_server: AppServer):
    """A gradio_client.Client connected to the shared app."""
    from gradio_client import Client

    return Client(app_server.url, verbose=False)


@pytest.fixture(scope="module")
def browser_app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """A launched app of the requesting test module's own, with an empty store (its tests count the
    runs they create, or take screenshots that show only their runs)."""
    with launch_app(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])) as server:
        yield server


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Torch at one intra-op thread for the module that asks for it (`pytestmark =
    pytest.mark.usefixtures("one_thread")`), restored after its last test. Tiny models are per-op
    overhead bound: two intra-op threads on a busy 2-core machine run them ~4x slower than one
    (docs/SCIENCE.md, thread oversubscription)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


COMPARE_OUTPUTS = ("table", "pick", "curves", "finals", "configs", "params", "bands", "groups", "files", "timer",
                   "note")  # what Compare's one event returns (ui/compare.py), as gradio_client sees it


def compare_api(client, run_ids=(), metric="train loss (batch)", **controls) -> dict:
    """Compare's views for `run_ids` and `controls` (x, smoothing, diff_only, grouped, filters by their API
    names) through the app's API, by output name: a fresh page's first call, so every view is sent."""
    out = client.predict(run_ids=list(run_ids), metric=[metric] if isinstance(metric, str) else list(metric),
                         last_preset={}, api_name="/compare", **controls)
    return dict(zip(COMPARE_OUTPUTS, out))


def plotted(curves: Any) -> Any:
    """The curves a Compare plot value (as the API sends it) draws: columns x, value, run."""
    import json

    import pandas as pd

    traces = json.loads(curves["plot"])["data"] if curves and curves.get("plot") else []
    frames = [pd.DataFrame({"x": t.get("x", []), "value": t.get("y", []), "run": t["name"]}) for t in traces]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["x", "value", "run"])
