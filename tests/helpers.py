"""Plain helpers shared by the test modules (the fixtures built on them are in tests/conftest.py, the
browser helpers in tests/browser.py): tiny run configurations, the real app launched in a subprocess,
the app's API through gradio_client, the CLI as a subprocess, a fake trainer, and comparisons of stored
runs. Test modules import from here, never from one another.

The server gets its own run store (LAB_RUNS_DIR in a temp folder) and writes its output to a log
file, so tests can check that no traceback was printed. It is terminated (killed if it hangs) at
the end. Waits are generous: the CI host is small, shared and noisy. Heavy libraries (torch, numpy,
pandas, gradio) are imported where they are used, so collecting a light test module stays light.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import pytest

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig, declared_fields

if TYPE_CHECKING:
    import pandas as pd

    from lab.engine.store import RunStore
    from lab.trainer import TrainResult
    from ui.common import AppContext

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 120.0  # importing torch and gradio on a busy 2-core host can take a while


# ---- tiny run configurations --------------------------------------------------------------------------

TINY = RunConfig(model=ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32), task=TaskConfig(name="copy", max_len=4))
"""One layer, d_model 16, two heads, copy up to length 4 (the other knobs at their defaults): it trains
in well under a second per hundred steps on one CPU thread."""

_SECTIONS = {section: {f.name for f in dataclasses.fields(cls)}
             for section, cls in (("model", ModelConfig), ("task", TaskConfig), ("train", TrainConfig))}


def tiny_config(base: RunConfig | None = None, *, task: str | None = None, name: str | None = None,
                **changes: Any) -> RunConfig:
    """`base` (TINY when None) with `changes` given by field name alone (n_heads=1, max_len=6, steps=30...):
    each goes to the section that has it. `task` is the task's name, `name` the run's label. Each section
    is rebuilt once, so its checks see all of its changes together."""
    base = TINY if base is None else base
    sections: dict[str, dict[str, Any]] = {"model": {}, "task": {}, "train": {}}
    if task is not None:
        sections["task"]["name"] = task
    for key, value in changes.items():
        owner = [section for section, names in _SECTIONS.items() if key in names]
        if not owner:
            raise TypeError(f"tiny_config: no configuration field {key!r}")
        sections[owner[0]][key] = value
    parts = {section: dataclasses.replace(getattr(base, section), **values) if values else getattr(base, section)
             for section, values in sections.items()}
    return RunConfig(**parts, name=base.name if name is None else name)


RESUMABLE = tiny_config(task="reverse", n_symbols=5, n_ctx=16, dropout=0.1, steps=30, batch_size=8, warmup=5,
                        eval_every=10, eval_samples=16, snapshots=4, device="cpu", seed=3, threads=1)
"""A run with dropout, a schedule and snapshots, small enough to train, stop and continue many times."""


def named(name: str, steps: int = 20) -> RunConfig:
    """A tiny copy run labelled `name` (the fake trainer fails or gates runs by their label)."""
    return tiny_config(name=name, steps=steps, eval_every=10)


# ---- the app in a subprocess --------------------------------------------------------------------------

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


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    family, more = set(), {pid}
    while more:
        family |= more
        more = {p for p, pp in parents.items() if pp in more} - family
    return family - {pid}


# ---- the app's API through gradio_client --------------------------------------------------------------

COMPARE_OUTPUTS = ("table", "pick", "curves", "finals", "configs", "params", "stability", "bands", "groups", "files",
                   "timer", "note", "metric", "group", "cell", "lengths")  # what Compare's one event returns (ui/compare/tab.py), as
# gradio_client sees it (without the page's record, a gr.State)
WAIT_S = 120.0  # a run started through the API finishes within this
SMALL = {"task": "copy", "max_len": 4, "d_model": 32, "n_heads": 2, "steps": 150}  # Train tab knobs of a short run

LABELS = {f.key: f.spec.label for f in declared_fields()}  # knob key -> the label the UI shows
INVALID: list[tuple[dict[str, Any], tuple[str, ...]]] = [
    ({"d_model": 100, "n_heads": 8}, ("model.d_model", "model.n_heads")),
    ({"pos": "rope", "d_model": 48, "n_heads": 16}, ("model.pos", "model.d_model", "model.n_heads")),  # d_head 3
    ({"min_len": 6, "max_len": 3}, ("task.max_len", "task.min_len")),
    ({"task": "induction", "arch": "encoder-decoder", "min_len": 4}, ("task.name", "model.arch")),
    ({"steps": 0}, ("train.steps",)),
    ({"lr": -1}, ("train.lr",)),
    ({"lr": "abc"}, ("train.lr",)),
    ({"task": "unknown"}, ("task.name",)),
    ({"n_layers": 0}, ("model.n_layers",)),
    ({"batch_size": 0}, ("train.batch_size",)),
    ({"d_ff": -5}, ("model.d_ff",)),
    ({"dropout": 2}, ("model.dropout",)),
    ({"n_heads": 0}, ("model.n_heads",)),
    ({"n_symbols": 1}, ("task.n_symbols",)),
    ({"warmup": 1.5}, ("train.warmup",)),
    ({"seed": -1}, ("train.seed",)),
    ({"steps": "--5"}, ("train.steps",)),
    ({"max_len": None}, ("task.max_len",)),
    ({"arch": "transformer"}, ("model.arch",)),
    ({"norm": "sideways"}, ("model.norm",)),
]  # Train tab knobs the app must refuse, and the fields its message names
INVALID_IDS = ["-".join(f"{k}={v}" for k, v in case.items()) for case, _ in INVALID]

OTHER_ARGS = {"who": "u" * 32, "owner": "u" * 32, "runs": [], "my_runs": [], "source": "sampled", "text": "",
              "prompt": "1 2",  # symbols of the runs' task (copy): a refusal then speaks of the run
              "probe": "", "step": 0, "metric": "train loss", "x": "step", "smoothing": 0.0, "diff_only": True,
              "grouped": False, "group": False}


def compare_api(client, run_ids=(), metric="train loss (batch)", **controls) -> dict:
    """Compare's views for `run_ids` and `controls` (x, smoothing, diff_only, grouped, filters by their API
    names) through the app's API, by output name: a fresh page's first call, so every view is sent."""
    out = client.predict(run_ids=list(run_ids), metric=[metric] if isinstance(metric, str) else list(metric),
                         last_preset={}, api_name="/compare", **controls)
    return dict(zip(COMPARE_OUTPUTS, out))


def plotted(curves: Any) -> Any:
    """The curves a Compare plot value (as the API sends it) draws: columns x, value, run."""
    import pandas as pd

    traces = json.loads(curves["plot"])["data"] if curves and curves.get("plot") else []
    frames = [pd.DataFrame({"x": t.get("x", []), "value": t.get("y", []), "run": t["name"]}) for t in traces]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["x", "value", "run"])


def frame(value: Any) -> "pd.DataFrame":
    """A plot's or table's value as sent to the browser ({'columns'|'headers': ..., 'data': ...}),
    also inside a component update ({'__type__': 'update', 'value': ...})."""
    import pandas as pd

    if isinstance(value, dict) and value.get("__type__") == "update":
        value = value.get("value")
    if not value:
        return pd.DataFrame()
    return pd.DataFrame(value["data"], columns=value.get("columns") or value.get("headers"))


_SEEDS = iter(range(1000, 10**6))


def start(client, **knobs: Any) -> str:
    """Start a new run through /start (SMALL, overridden by `knobs`; a seed of its own unless `knobs` names one:
    the same configuration again would watch the run already there, lab/engine/sharing.py); return its id."""
    knobs = {"seed": next(_SEEDS), **knobs}
    pick, my_runs, text, timer, *_, note = client.predict(**{**SMALL, **knobs}, my_runs=[], owner="u1",
                                                          api_name="/start")
    run_id = pick["value"]
    assert isinstance(run_id, str) and run_id
    assert my_runs == [run_id]
    assert timer["active"] is True
    assert "Queued" in text or "Running" in text, text
    assert note == ""  # a good Start clears the note beside the button
    return run_id


def poll(client, run_id: str) -> tuple[str, "pd.DataFrame", "pd.DataFrame", bool]:
    """(progress text, loss frame, accuracy frame, timer still active) from /poll."""
    text, loss, acc, _attention, timer = client.predict(run_id, api_name="/poll")
    return text, frame(loss), frame(acc), timer["active"]


def poll_until_done(client, run_id: str, timeout: float = WAIT_S) -> tuple[str, "pd.DataFrame", "pd.DataFrame"]:
    deadline = time.monotonic() + timeout
    while True:
        text, loss, acc, active = poll(client, run_id)
        if not active:
            return text, loss, acc
        assert time.monotonic() < deadline, f"run {run_id} still live after {timeout:.0f} s: {text}"
        time.sleep(0.5)


def compare(client, run_ids: list[str]) -> tuple["pd.DataFrame", "pd.DataFrame", "pd.DataFrame", Any]:
    """Compare's curves, final metrics and configs (as frames) and parameter figure for finished `run_ids`."""
    from ui.compare.render import LIVE_POLL_S

    views = compare_api(client, run_ids)
    assert views["timer"].get("value") != LIVE_POLL_S  # finished runs: the timer only watches (when sent at all)
    layout = json.loads(views["curves"]["plot"])["layout"]
    assert layout["xaxis"]["title"]["text"] == "step" and layout["yaxis"]["title"]["text"] == "train loss (batch)"
    colours = [t["line"]["color"] for t in json.loads(views["curves"]["plot"])["data"]]
    assert len(set(colours)) == len(colours) == len(run_ids)  # a colour per run, in the selection's order
    return plotted(views["curves"]), frame(views["finals"]), frame(views["configs"]), views["params"]


def run_id_endpoints(client) -> dict[str, list[dict]]:
    """api name -> its parameters, for every endpoint with a run_id or run_ids parameter."""
    info = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    return {name: e["parameters"] for name, e in info.items()
            if any(p["parameter_name"] in ("run_id", "run_ids") for p in e["parameters"])}


def call_with(client, api_name: str, params: list[dict], bad: str):
    """Call `api_name` with `bad` as its run id (or the only one of its run ids) and plain other arguments."""
    args = []
    for p in params:
        name = p["parameter_name"]
        if name == "run_id":
            args.append(bad)
        elif name == "run_ids":
            args.append([bad])
        elif name in OTHER_ARGS:
            args.append(OTHER_ARGS[name])
        else:
            args.append(p.get("parameter_default"))
    return client.predict(*args, api_name=api_name)


# ---- the command line as a subprocess -----------------------------------------------------------------

CLI_TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff", "32", "--batch-size", "8",
            "--max-len", "4", "--n-ctx", "32", "--threads", "1", "--device", "cpu"]  # `lab train` flags of a tiny run


def lab_env(runs_dir: Path | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("LAB_RUNS_DIR", None)
    if runs_dir is not None:
        env["LAB_RUNS_DIR"] = str(runs_dir)
    return env


def lab(*args: str, runs_dir: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run `python -m lab ARGS` from the repository root; the store comes from $LAB_RUNS_DIR."""
    return subprocess.run([sys.executable, "-m", "lab", *args], cwd=REPO, env=lab_env(runs_dir),
                          capture_output=True, text=True, timeout=timeout)


def one_json(stdout: str):
    assert stdout.count("\n") == 1 and stdout.endswith("\n"), stdout  # exactly one line
    return json.loads(stdout)


# ---- a fake trainer for the job manager ---------------------------------------------------------------

WAIT = 30.0  # generous: the host is shared and noisy




class FakeTrainer:
    """The trainer's signature: emits records each step, honours should_stop, sleeps a little."""

    def __init__(self, step_s: float = 0.005, fail_on: str | None = None, gate: threading.Event | None = None):
        self.step_s, self.fail_on, self.gate = step_s, fail_on, gate
        self.calls: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.active = self.peak = 0

    def __call__(self, cfg: RunConfig, on_record: Callable | None = None,
                 should_stop: Callable[[], bool] | None = None, threads: int | None = None, **_: Any) -> "TrainResult":
        import numpy as np
        import torch

        from lab.records import DEC_SELF, EvalRecord, SnapshotRecord, StepRecord
        from lab.trainer import TrainResult  # the trainer's own result record

        emit = on_record or (lambda r: None)
        with self.lock:
            self.calls.append({"name": cfg.name, "threads": threads, "thread": threading.get_ident()})
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            if cfg.name == self.fail_on:
                raise RuntimeError("boom:\n  bad things")
            if self.gate is not None:
                self.gate.wait(WAIT)
            emit(SnapshotRecord(0, {DEC_SELF: np.full((1, 2, 3, 3), 1 / 3, np.float32)}))
            step, stopped, t0 = 0, False, time.perf_counter()
            while step < cfg.train.steps:
                if should_stop and should_stop():
                    stopped = True
                    break
                time.sleep(self.step_s)
                step += 1
                emit(StepRecord(step, 1.0 / step, 1e-3, 0.5, 8 * step, time.perf_counter() - t0, 100.0))
            ev = EvalRecord(step, time.perf_counter() - t0, 8 * step, 0.5, 0.9, 0.8, 1.5, 0.4, 0.1)
            emit(ev)
            return TrainResult(step, stopped, time.perf_counter() - t0, "cpu", 42, 100.0, 1.0 / max(step, 1), ev,
                               {"w": torch.arange(6.0).reshape(2, 3)})
        finally:
            with self.lock:
                self.active -= 1


def wait_for(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


# ---- stored runs --------------------------------------------------------------------------------------

CLOCK = ("elapsed_s", "tokens_per_s")  # wall-clock fields: the only ones allowed to differ between equal runs


def metrics_rows(store: RunStore, run_id: str) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in CLOCK}
            for line in (store.path(run_id) / "metrics.jsonl").read_bytes().splitlines()]


def same_run(store: RunStore, a: str, b: str) -> None:
    """Two stored runs hold the same weights, metrics (but the clock) and attention snapshots."""
    import numpy as np
    import torch

    wa, wb = store.load_weights(a), store.load_weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert metrics_rows(store, a) == metrics_rows(store, b)
    assert store.snapshot_steps(a) == store.snapshot_steps(b)
    for step in store.snapshot_steps(a):
        sa, sb = store.load_snapshot(a, step), store.load_snapshot(b, step)
        assert sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k]) for k in sa)


def continue_run(store: RunStore, run_id: str, steps: int | None = None, stop_at: int | None = None) -> None:
    """Queue a continuation of `run_id` (by `steps` more, or its own length) and train it here."""
    from lab.engine import continuation
    from lab.engine.recorder import record_run

    continuation.queue(store, continuation.plan(store, run_id, steps))
    record_run(store, run_id, threads=1, stop_at=stop_at)


# ---- Trackio export -----------------------------------------------------------------------------------

needs_trackio = pytest.mark.skipif(importlib.util.find_spec("trackio") is None,
                                   reason="trackio is not installed (pip install -r requirements-scale.txt)")
PUBLISHED = tiny_config(steps=120, eval_every=40, snapshots=1)  # runs exported to Trackio
READ_BACK = """
import json, sys
import trackio
from trackio.sqlite_storage import SQLiteStorage
project = sys.argv[1]
out = {}
for run in trackio.Api().runs(project):
    logs = SQLiteStorage.get_logs(project, run_id=run.id)
    out[run.name] = {"config": run.config, "logs": [{k: v for k, v in row.items() if k != "timestamp"} for row in logs]}
print(json.dumps(out))
"""


def expected_points(store: RunStore, run_id: str) -> list[dict]:
    """The store's metric records as Trackio rows: step plus '<kind>/<field>' for every value present."""
    rows = []
    for rec in store.metrics(run_id).to_dict("records"):
        row = {f"{rec['kind']}/{k}": v for k, v in rec.items() if k not in ("kind", "step")
               and v is not None and not (isinstance(v, float) and math.isnan(v))}
        rows.append({**row, "step": int(rec["step"])})
    return rows


def sort_key(row: dict) -> tuple:
    return row["step"], "eval/exact_match" in row


def read_back(project: str, trackio_dir: Path) -> dict:
    """Every run of the Trackio `project` in `trackio_dir`, read back in a subprocess: name -> config, logs."""
    env = {**os.environ, "TRACKIO_DIR": str(trackio_dir)}
    out = subprocess.run([sys.executable, "-c", READ_BACK, project], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# ---- lesson bundles -----------------------------------------------------------------------------------

def short_training(steps: int = 3) -> Callable[..., "TrainResult"]:
    """The real trainer, cut to `steps` steps (an evaluation and a snapshot at the end): a run stored under its
    full config with real weights and attention snapshots, in a fraction of a second."""
    from lab.trainer import train

    def trained(cfg: RunConfig, *args: Any, **kwargs: Any) -> "TrainResult":
        short = dataclasses.replace(cfg.train, steps=steps, eval_every=steps, eval_samples=min(cfg.train.eval_samples, 64))
        return train(dataclasses.replace(cfg, train=short), *args, **kwargs)
    return trained


def preset_bundle(folder: Path, keys: list[str], steps: int = 3) -> Path:
    """A lesson bundle of these presets' runs (lab/engine/bundle.py), each trained `steps` steps under its
    preset's config: what `python -m lab bundle` writes, in seconds instead of the lesson's minutes. A
    configuration two presets share is one run; each is created as the job manager creates it (its identity
    and code version) and trained here, one after another, on one thread (a third of the job manager's time:
    no queue to wait on between runs)."""
    from lab.engine.bundle import write_bundle
    from lab.engine.identity import code_version, identity
    from lab.engine.recorder import record_run
    from lab.engine.store import RunStore
    from lab.teach.presets.catalog import PRESETS

    store = RunStore(folder / "bundle-runs")
    ids, trainer = {}, short_training(steps)
    for cfg in (cfg for key in keys for cfg in PRESETS[key].runs):
        if identity(cfg) not in ids:
            run_id = store.create(cfg, identity=identity(cfg), code_version=code_version())
            record_run(store, run_id, train_fn=trainer, threads=1)
            assert store.status(run_id)["state"] == "completed", store.status(run_id)
            ids[identity(cfg)] = run_id
    write_bundle(store, list(ids.values()), folder / "lesson.zip", keys)
    store.close()
    return folder / "lesson.zip"
