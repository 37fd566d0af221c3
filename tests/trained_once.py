"""Full-size trainings shared by one test session: a configuration is trained once (the CPU, one thread) into
a store of its own, and every test that reads that run, on either pytest-xdist worker, gets the same run.

Same configuration, seed and code give the same result, so a run that several modules read (the grokking
preset's weight-decay run, the induction preset's 2-layer run) need not be trained by each. The folder is
the session's own (under pytest's base temporary folder), so nothing carries over from one session to the
next: every session trains with the code it tests. A file lock per configuration makes the second reader
wait for the first's training instead of repeating it.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from lab.config import RunConfig

ENV = "LAB_TEST_SHARED_RUNS"  # the session's folder, for the pool processes a test starts


@dataclass(frozen=True)
class Trained:
    """One trained run: its summary.json, every record in order, the final weights, and where it is stored."""

    summary: dict[str, Any]
    records: list
    weights: dict
    runs_dir: Path  # a RunStore folder holding this run only
    run_id: str


def session_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's shared folder: with pytest-xdist, beside the workers' own base folders (one session
    root holds popen-gw0, popen-gw1...); without it, inside the base folder. Pool processes find it in ENV."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "trained-once"
    folder.mkdir(exist_ok=True)
    os.environ[ENV] = str(folder)
    return folder


def on_cpu(cfg: RunConfig) -> RunConfig:
    """`cfg` as it trains on this machine's CPU: itself where its device already means the CPU here (so the
    stored run has the config, hence the identity, a click in the app asks for: lab/engine/identity.py),
    else with device "cpu"."""
    from lab.device import resolve_device

    here = cfg.train.device == "cpu" or cfg.train.device == "auto" and resolve_device("auto").type == "cpu"
    return cfg if here else replace(cfg, train=replace(cfg.train, device="cpu"))


def trained_once(cfg: RunConfig, folder: Path | str | None = None) -> Trained:
    """`cfg` (on the CPU) trained to its last step at one intra-op thread, or the session's earlier training of
    it; safe to call from several processes at once."""
    import torch
    from filelock import FileLock

    from lab.engine.identity import code_version, identity
    from lab.engine.recorder import record_run
    from lab.engine.store import RunStore

    cfg = on_cpu(cfg)
    folder = Path(folder or os.environ[ENV])
    key = hashlib.sha256(cfg.to_json().encode()).hexdigest()[:16]
    home, saved = folder / key, folder / key / "trained.pt"
    with FileLock(str(folder / f"{key}.lock")):
        if not saved.exists():
            before = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                store, records = RunStore(home / "runs"), []
                run_id = store.create(cfg, identity=identity(cfg), code_version=code_version())  # as the app's
                result = record_run(store, run_id, threads=1, on_record=records.append)
                assert result.steps_done == cfg.train.steps, (result.steps_done, cfg.train.steps)
                summary = store.summary(run_id)
                store.close()
            finally:
                torch.set_num_threads(before)
            partial = saved.with_suffix(".partial")
            torch.save({"summary": summary, "records": records, "weights": result.state_dict, "run_id": run_id},
                       partial)
            partial.replace(saved)  # whole or absent: a reader never loads half a file
    data = torch.load(saved, weights_only=False)
    return Trained(data["summary"], data["records"], data["weights"], home / "runs", data["run_id"])


def bundled(cfgs: list[RunConfig], dest: Path, folder: Path | str | None = None) -> str:
    """A lesson bundle (lab/engine/bundle.py) of each config's session training, one file each under `dest`:
    the value of LAB_BUNDLE that starts an app with those runs."""
    from lab.engine.bundle import write_bundle
    from lab.engine.store import RunStore

    dest.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, cfg in enumerate(cfgs):
        t = trained_once(cfg, folder)
        store = RunStore(t.runs_dir)
        write_bundle(store, [t.run_id], dest / f"run{i}.zip")
        store.close()
        paths.append(str(dest / f"run{i}.zip"))
    return os.pathsep.join(paths)
