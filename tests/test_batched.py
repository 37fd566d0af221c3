"""Batched seed repeats (lab/batched.py): k runs trained as one stacked model give each run the
metrics, weights and attention it gets when trained alone; the job manager groups them."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from lab.batched import batch_key, train_batched
from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.engine.jobs import JobManager
from lab.records import EvalRecord, SnapshotRecord, StepRecord
from lab.engine.store import RunStore
from lab.trainer import train

WAIT = 120.0
BASE = RunConfig(
    model=ModelConfig(n_layers=2, n_heads=2, d_model=16, d_ff=32, n_ctx=32),
    task=TaskConfig(name="reverse", min_len=1, max_len=6, n_symbols=5),  # lengths differ per seed and step
    train=TrainConfig(steps=30, batch_size=16, warmup=5, eval_every=10, eval_samples=64, snapshots=3, device="cpu",
                      weight_decay=0.1, grad_clip=0.5),
)


pytestmark = pytest.mark.usefixtures("one_thread")  # torch at one intra-op thread (tests/conftest.py)


def variants(pos: str = "learned") -> list[RunConfig]:
    base = replace(BASE, model=replace(BASE.model, pos=pos))
    return [replace(base, train=replace(base.train, seed=s, lr=lr)) for s, lr in ((0, 3e-3), (1, 3e-3), (2, 1e-2))]


def of(records: list, kind: type) -> list:
    return [r for r in records if isinstance(r, kind)]


def assert_same_run(solo, solo_recs, got, got_recs, wtol: float = 2e-3) -> None:
    """Equal to float32 round-off: the stacked matmuls sum in another order than the solo ones."""
    assert (got.steps_done, got.stopped, got.params) == (solo.steps_done, solo.stopped, solo.params)
    a, b = of(solo_recs, StepRecord), of(got_recs, StepRecord)
    assert [r.step for r in a] == [r.step for r in b] and [r.tokens for r in a] == [r.tokens for r in b]
    assert [r.lr for r in a] == [r.lr for r in b]
    np.testing.assert_allclose([r.loss for r in b], [r.loss for r in a], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose([r.grad_norm for r in b], [r.grad_norm for r in a], rtol=1e-3, atol=1e-5)
    ea, eb = of(solo_recs, EvalRecord), of(got_recs, EvalRecord)
    assert [r.step for r in ea] == [r.step for r in eb]
    for x, y in zip(ea, eb):
        assert y.loss == pytest.approx(x.loss, rel=1e-4, abs=1e-5)
        assert y.exact_match == pytest.approx(x.exact_match, abs=1 / 64 + 1e-9)  # at most one sample flips
        assert y.ood_loss == pytest.approx(x.ood_loss, rel=1e-4, abs=1e-5)
    sa, sb = of(solo_recs, SnapshotRecord), of(got_recs, SnapshotRecord)
    assert [s.step for s in sa] == [s.step for s in sb]
    for x, y in zip(sa, sb):
        for kind in x.patterns:
            np.testing.assert_allclose(y.patterns[kind], x.patterns[kind], atol=1e-4)
    assert got.state_dict.keys() == solo.state_dict.keys()
    for k in solo.state_dict:
        torch.testing.assert_close(got.state_dict[k], solo.state_dict[k], atol=wtol, rtol=0)


@pytest.mark.parametrize("pos", ["learned", "rope", "alibi"])
def test_batched_runs_equal_runs_trained_alone(pos):
    cfgs = variants(pos)
    recs = [[] for _ in cfgs]
    results = train_batched(cfgs, [r.append for r in recs], threads=1)
    assert len(results) == 3
    for cfg, got, got_recs in zip(cfgs, results, recs):
        solo_recs: list = []
        solo = train(cfg, on_record=solo_recs.append, threads=1)
        assert_same_run(solo, solo_recs, got, got_recs)
    # the seeds really are different runs
    assert of(recs[0], StepRecord)[-1].loss != of(recs[1], StepRecord)[-1].loss


def test_one_batched_run_stops_and_the_others_go_on():
    cfgs = variants()
    calls = [0]

    def stop_second() -> bool:
        calls[0] += 1
        return calls[0] > 12  # checked before every step: stops after 12 steps

    recs = [[] for _ in cfgs]
    results = train_batched(cfgs, [r.append for r in recs], [lambda: False, stop_second, lambda: False], threads=1)
    assert [r.steps_done for r in results] == [30, 12, 30] and [r.stopped for r in results] == [False, True, False]
    seen = []
    solo_stop = train(cfgs[1], on_record=seen.append, should_stop=lambda: len(of(seen, StepRecord)) >= 12, threads=1)
    assert_same_run(solo_stop, seen, results[1], recs[1])
    for i in (0, 2):  # dropping a slice from the stack leaves the others' training untouched
        solo_recs: list = []
        assert_same_run(train(cfgs[i], on_record=solo_recs.append, threads=1), solo_recs, results[i], recs[i])


def test_batch_key():
    cfgs = variants()
    assert len({batch_key(c) for c in cfgs + [replace(cfgs[0], name="x")]}) == 1
    assert batch_key(replace(BASE, model=replace(BASE.model, d_model=32))) != batch_key(BASE)
    assert batch_key(replace(BASE, train=replace(BASE.train, steps=31))) != batch_key(BASE)
    assert batch_key(replace(BASE, model=replace(BASE.model, arch="encoder-decoder"))) is None
    assert batch_key(replace(BASE, model=replace(BASE.model, dropout=0.1))) is None
    with pytest.raises(ValueError, match="differ only in train.seed"):
        train_batched([BASE, replace(BASE, model=replace(BASE.model, pos="rope"))])


@pytest.mark.parametrize("mode", ["thread", pytest.param("process", marks=pytest.mark.app)])
def test_submit_many_stores_batched_runs_like_solo_runs(tmp_path: Path, monkeypatch, mode):
    monkeypatch.setenv("LAB_BATCH_SEEDS", "on")
    store = RunStore(tmp_path / "runs")
    jm = JobManager(store, max_concurrent=1, mode=mode)
    cfgs = variants()[:2] + [replace(BASE, model=replace(BASE.model, pos="rope"))]  # 2 batchable + 1 other
    ids = jm.submit_many(cfgs, owner="ada")
    assert len(ids) == 3
    for r in ids:
        final = jm.wait(r, timeout=WAIT)
        assert final.state == "completed" and final.owner == "ada" and final.step == 30, final
    jm.shutdown(wait=True)
    for cfg, r in zip(cfgs, ids):
        assert store.config(r) == cfg and store.status(r)["state"] == "completed"
        solo_recs: list = []
        solo = train(cfg, on_record=solo_recs.append, threads=1)
        df = store.metrics(r)
        train_rows = df[df["kind"] == "train"]
        np.testing.assert_allclose(train_rows["loss"], [x.loss for x in of(solo_recs, StepRecord)], rtol=1e-4, atol=1e-5)
        summary = store.summary(r)
        assert summary["steps"] == 30 and summary["params"] == solo.params
        assert summary["eval"]["loss"] == pytest.approx(solo.final_eval.loss, rel=1e-4)
        assert store.snapshot_steps(r) == [0, 15, 30]
        weights = store.load_weights(r)
        for k in solo.state_dict:
            torch.testing.assert_close(weights[k], solo.state_dict[k], atol=2e-3, rtol=0)
    store.close()


@pytest.mark.parametrize("setting", ["on", "off"])
def test_grouped_runs_start_together_only_when_batching_is_on(tmp_path: Path, monkeypatch, setting):
    monkeypatch.setenv("LAB_BATCH_SEEDS", setting)
    store = RunStore(tmp_path / "runs")
    jm = JobManager(store, max_concurrent=1, mode="thread")
    long = [replace(c, train=replace(c.train, steps=20_000, eval_every=10_000)) for c in variants()[:2]]
    ids = jm.submit_many(long)
    deadline = time.monotonic() + WAIT
    while jm.status(ids[0]).state != "running":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    states = [jm.status(r).state for r in ids]
    jm.shutdown(wait=True)
    assert states == (["running", "running"] if setting == "on" else ["running", "queued"])
    store.close()


def test_the_vmapped_step_keeps_cuda_off_the_memory_efficient_attention_kernel():
    """Its backward under vmap failed on an H200 for the text task's 31 positions (three seeds of a text run
    stopped at step 0): the batched step allows flash and math only, on CUDA, and restores the choice after."""
    from lab.batched import vmap_attention

    before = torch.backends.cuda.mem_efficient_sdp_enabled()
    with vmap_attention(torch.device("cuda")):
        assert not torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.mem_efficient_sdp_enabled() == before
    with vmap_attention(torch.device("cpu")):  # the CPU's own fused kernel stays
        assert torch.backends.cuda.mem_efficient_sdp_enabled() == before
