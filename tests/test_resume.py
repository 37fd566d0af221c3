"""Checkpoint and resume, bit for bit on the CPU: a run trained k steps, checkpointed and continued in a fresh
process equals the same run trained in one go (weights, train and eval records, attention snapshots), for
decoder-only and encoder-decoder models with dropout and a warmup/decay schedule; five chunks equal one go;
a batched seed group leaves each member a checkpoint that continues alone."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lab import checkpoint as ckpt
from lab.engine import continuation
from lab.engine.recorder import record_run, record_runs
from lab.engine.store import RunStore
from lab.records import EvalRecord, SnapshotRecord, StepRecord
from lab.trainer import lr_at, train
from tests.helpers import CLOCK, RESUMABLE, continue_run, metrics_rows, same_run, tiny_config

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")  # torch at one intra-op thread (tests/conftest.py)
def comparable(records: list) -> list:
    """Records as plain tuples without wall-clock fields (snapshots as their arrays' bytes)."""
    out = []
    for r in records:
        if isinstance(r, SnapshotRecord):
            out.append(("snap", r.step, sorted((k, v.tobytes()) for k, v in r.patterns.items())))
        else:
            out.append((type(r).__name__, *(v for k, v in dataclasses.asdict(r).items() if k not in CLOCK)))
    return out


CHILD = r"""
import json, sys, dataclasses
import torch
from safetensors.torch import save_file
from lab import checkpoint
from lab.config import RunConfig
from lab.records import SnapshotRecord
from lab.trainer import train

torch.set_num_threads(1)
for job in json.loads(sys.argv[1]):
    cfg = RunConfig.from_json(job["cfg"])
    records, tensors = [], {}
    def keep(r):
        if isinstance(r, SnapshotRecord):
            records.append({"kind": "snap", "step": r.step})
            tensors.update({f"snap.{r.step}.{k}": torch.from_numpy(v) for k, v in r.patterns.items()})
        else:
            records.append({"kind": type(r).__name__, **dataclasses.asdict(r)})
    result = train(cfg, on_record=keep, threads=1, resume=checkpoint.load(job["checkpoint"]))
    tensors.update({f"weights.{k}": v for k, v in result.state_dict.items()})
    save_file(tensors, job["out"] + ".safetensors")
    with open(job["out"] + ".json", "w") as fh:
        json.dump(records, fh)
"""


def child_records(out: str) -> tuple[list, dict[str, torch.Tensor]]:
    """What the fresh process recorded, in `comparable`'s form, and its final weights."""
    tensors = load_file(out + ".safetensors")
    rows = []
    for row in json.loads(Path(out + ".json").read_text()):
        if row["kind"] == "snap":
            prefix = f"snap.{row['step']}."
            pats = {k[len(prefix):]: v.numpy() for k, v in tensors.items() if k.startswith(prefix)}
            rows.append(SnapshotRecord(row["step"], pats))
        else:
            cls = {"StepRecord": StepRecord, "EvalRecord": EvalRecord}[row.pop("kind")]
            rows.append(cls(**row))
    weights = {k[8:]: v for k, v in tensors.items() if k.startswith("weights.")}
    return comparable(rows), weights


@pytest.mark.app
def test_resume_in_a_fresh_process_equals_training_in_one_go(tmp_path):
    """Stopped at a step that is not an eval point (so the stop adds an eval and a snapshot), checkpointed to
    a file, continued by another process: the same weights and records as one uninterrupted run."""
    cases = {"decoder": tiny_config(RESUMABLE, arch="decoder", schedule="cosine"), "encdec": tiny_config(RESUMABLE, arch="encoder-decoder", schedule="linear")}
    jobs, expected = [], {}
    for name, cfg in cases.items():
        whole: list = []
        one_go = train(cfg, on_record=whole.append, threads=1)
        first: list = []
        points: list[ckpt.Checkpoint] = []
        part = train(cfg, on_record=first.append, threads=1, on_checkpoint=points.append, stop_at=13)
        assert part.stopped and part.steps_done == 13
        assert [(c.step, c.stop_eval, c.stop_snapshot) for c in points] == [(10, False, False), (13, True, True)]
        last = points[-1]
        assert last.state.rng_torch is not None and len(last.state.data) == 1  # dropout's stream and the data's
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(ckpt.to_bytes(last))
        # the stop's extra eval and snapshot at step 13 are what a continuation drops
        kept = [r for r in first if not (r.step == 13 and isinstance(r, (EvalRecord, SnapshotRecord)))]
        expected[name] = (comparable(whole), comparable(kept), one_go.state_dict)
        jobs.append({"cfg": cfg.to_json(), "checkpoint": str(path), "out": str(tmp_path / name)})
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(jobs)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, (whole, kept, weights) in expected.items():
        rest, resumed = child_records(str(tmp_path / name))
        assert kept + rest == whole, name
        assert weights.keys() == resumed.keys()
        assert all(torch.equal(weights[k], resumed[k]) for k in weights), name


def test_five_chunks_equal_one_go(tmp_path):
    """Stopped and continued four times (at eval points and between them), through the store: the same run."""
    store = RunStore(tmp_path / "runs")
    cfg = tiny_config(RESUMABLE, arch="decoder", dropout=0.1, steps=40)
    whole = store.create(cfg)
    record_run(store, whole, threads=1)
    chunked = store.create(cfg)
    record_run(store, chunked, threads=1, stop_at=7)
    for stop in (16, 20, 33, None):
        continue_run(store, chunked, stop_at=stop)
        assert store.status(chunked)["state"] == ("completed" if stop is None else "stopped")
    same_run(store, whole, chunked)
    assert store.summary(chunked)["steps"] == 40 and store.config(chunked) == cfg
    assert sorted(p.name for p in tmp_path.joinpath("runs").iterdir() if not p.name.startswith(".")) == sorted(
        [whole, chunked])  # no second folder


def test_a_completed_run_continues_to_a_larger_total_on_the_new_schedule(tmp_path):
    store = RunStore(tmp_path / "runs")
    cfg = tiny_config(RESUMABLE, arch="decoder", dropout=0.0, steps=20)
    run_id = store.create(cfg)
    record_run(store, run_id, threads=1)
    continue_run(store, run_id, steps=50)
    new_cfg = store.config(run_id)
    assert new_cfg.train.steps == 50 and store.status(run_id)["state"] == "completed"
    assert store.summary(run_id)["steps"] == 50
    rows = metrics_rows(store, run_id)
    train_steps = [r["step"] for r in rows if r["kind"] == "train"]
    assert train_steps == list(range(1, 51))  # the curve continues, no step twice
    for r in rows:  # before the continuation, the old total's schedule; after it, the new one's
        if r["kind"] == "train":
            assert r["lr"] == lr_at(r["step"] - 1, (cfg if r["step"] <= 20 else new_cfg).train)
    evals = [r["step"] for r in rows if r["kind"] == "eval"]
    assert evals == [10, 20, 30, 40, 50]
    # the old total (20) snapshots at 0, 7, 13, 20; the new one (50) at 0, 17, 33, 50: those after 20 are added
    assert store.snapshot_steps(run_id) == [0, 7, 13, 20, 33, 50]


def test_a_batched_member_continues_alone(tmp_path):
    """Two seeds trained as one batched model and stopped: each keeps a solo checkpoint; one is continued alone
    and ends close to its solo twin trained in one go (batched training matches solo to round-off only)."""
    store = RunStore(tmp_path / "runs")
    cfgs = [tiny_config(RESUMABLE, arch="decoder", dropout=0.0, steps=40, seed=s) for s in (1, 2)]
    ids = [store.create(c) for c in cfgs]
    record_runs(store, ids, threads=1, stop_at=15)
    for rid in ids:
        point = continuation.load_checkpoint(store, rid)
        assert point.step == 15 and point.stop_eval and set(point.state.exp_avg) == set(point.state.adam_step)
        assert store.status(rid)["state"] == "stopped"
    continue_run(store, ids[1])
    assert store.status(ids[1])["state"] == "completed" and store.summary(ids[1])["steps"] == 40
    solo = store.create(cfgs[1])
    record_run(store, solo, threads=1)
    a, b = metrics_rows(store, ids[1]), metrics_rows(store, solo)
    assert [(r["kind"], r["step"]) for r in a] == [(r["kind"], r["step"]) for r in b]
    assert all(abs(x["loss"] - y["loss"]) < 1e-3 for x, y in zip(a, b))
    wa, wb = store.load_weights(ids[1]), store.load_weights(solo)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-4) for k in wa)
