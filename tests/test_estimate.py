"""Time estimates (lab/engine/estimate.py, lab/engine/cost.py, JobManager.estimate): the cost model, the
speed measured from step records, fixed costs, concurrency, the fair queue ahead, and the sentence.

No real training: the simulation gets hand-made server states, and the job manager a fake trainer that
reports step records as if each step took a chosen multiple of its modelled time (no sleeping on it).
"""
from __future__ import annotations

import re
import threading
from dataclasses import replace
from typing import Any, Callable

import pytest
import torch

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.engine.cost import cost, run_seconds
from lab.engine.estimate import (END_SHARE, Job, Sample, Server, SpeedLog, contention, forecast, group_jobs,
                                 probe_capacity)
from lab.engine.jobs import JobManager
from lab.engine.store import RunStore
from lab.records import EvalRecord, StepRecord
from lab.trainer import TrainResult

BASE = RunConfig(model=ModelConfig(n_layers=2, d_model=32, n_heads=2, d_ff=64),
                 task=TaskConfig(name="copy", max_len=6), train=TrainConfig(steps=200, eval_every=50))
LONG = replace(BASE, train=replace(BASE.train, steps=1000))  # a few modelled seconds: long enough to measure
WAIT = 60.0


def idle(slots: int = 2, running=(), queued=(), finished=(), capacity: float = 2.0, cores: int = 2) -> Server:
    return Server(slots, cores, tuple(running), tuple(queued), tuple(finished), capacity)


def sample(slowness: float = 1.0, fixed_s: float = 0.0, at_once: float = 1.0, capacity: float = 2.0) -> Sample:
    return Sample(slowness, fixed_s, at_once, capacity)


# ---- the cost model ----------------------------------------------------------------------------------
def test_cost_grows_with_steps_width_depth_batch_and_length():
    def with_(**kw: Any) -> RunConfig:
        sec = {k: v for k, v in kw.items()}
        return replace(BASE, model=replace(BASE.model, **sec.get("model", {})),
                       task=replace(BASE.task, **sec.get("task", {})), train=replace(BASE.train, **sec.get("train", {})))

    assert run_seconds(with_(train={"steps": 400})) > 1.8 * run_seconds(BASE)
    for key, section, values in (("d_model", "model", (16, 64, 256)), ("n_layers", "model", (1, 2, 4)),
                                 ("batch_size", "train", (8, 64, 256)), ("max_len", "task", (4, 8, 16))):
        costs = [run_seconds(with_(**{section: {key: v, **({"d_ff": 2 * v} if key == "d_model" else {})}}))
                 for v in values]
        assert costs == sorted(costs) and costs[0] < costs[-1], (key, costs)


def test_cost_schedule_matches_the_training_loop():
    from lab.trainer import snapshot_steps

    for snaps in (0, 1, 2, 6):
        cfg = replace(BASE, train=replace(BASE.train, snapshots=snaps, steps=130, eval_every=50))
        c = cost(cfg)
        assert set(c.snapshots) == snapshot_steps(cfg.train)
        # the loop: 130 steps, evaluations at 50, 100 and the last step, every snapshot
        assert c.loop_s == pytest.approx(130 * c.step_s + 3 * c.eval_s + len(c.snapshots) * c.snapshot_s)
        # a step record comes before its own step's evaluation: at 101, two evaluations are behind it
        assert c.upto(101) == pytest.approx(101 * c.step_s + 2 * c.eval_s
                                            + sum(s < 101 for s in c.snapshots) * c.snapshot_s)
        assert c.upto(0) == 0 and c.upto(130) < c.loop_s


def test_an_evaluation_costs_its_held_out_sets_and_the_training_set():
    from lab.engine.cost import TYPICAL, eval_sets, set_seconds, train_samples
    from lab.evaluation import train_samples as measured_samples

    sizes = (1, 2, 7, 512)
    assert [train_samples(n) for n in sizes] == [measured_samples(n) for n in sizes] == [1, 1, 4, 256]
    for task in ("copy", "text", "modular_addition"):
        cfg = replace(BASE, task=TaskConfig(name=task, min_len=4, max_len=6))
        held, ood, train = (set_seconds(cfg, split, n) for split, n in eval_sets(cfg))
        assert eval_sets(cfg)[2] == ("train", cfg.train.eval_samples // 2)
        assert cost(cfg).eval_s == pytest.approx(TYPICAL * (held + ood + train))
        # the training set is the held-out set's lengths with half the samples: cheaper, but not free
        assert 0.3 * held < train < held, (task, held, train)
        assert (ood == 0) == (task != "copy")  # text and modular addition have no longer lengths
        fewer = replace(cfg, train=replace(cfg.train, eval_samples=cfg.train.eval_samples // 2))
        assert set_seconds(fewer, "eval", fewer.train.eval_samples) == pytest.approx(train)


# ---- the simulation ----------------------------------------------------------------------------------
def test_concurrency_slows_each_job_and_a_busy_machine_shares_what_is_left():
    assert contention(1, 2.0, 2) == 1.0
    assert 1.0 < contention(2, 2.0, 2) < 1.2  # two jobs on two free cores: a little memory contention
    assert contention(4, 2.0, 2) == pytest.approx(2 * contention(2, 2.0, 2))  # four on two cores: half each
    assert contention(1, 0.5, 2) == pytest.approx(2.0)  # other work leaves half a core: one job at half speed
    assert contention(2, 0.5, 2) == pytest.approx(4.0 * contention(2, 2.0, 2))  # ...and two share that half


def test_the_capacity_probe_sees_a_free_machine_and_counts_our_running_jobs():
    assert 0 < probe_capacity(0, 2, seconds=0.01) <= 2.0
    assert probe_capacity(3, 1, seconds=0.01) <= 1.0  # never more than the cores


def test_runs_share_the_slots_and_each_is_slowed_by_the_others():
    w = 10.0
    one = forecast(idle(slots=1), [Job("", w)])
    assert one.wall_s == pytest.approx(w + one.speed.fixed_s)
    two_slots = forecast(idle(slots=2), [Job("", w), Job("", w)])
    assert two_slots.wall_s == pytest.approx((w + two_slots.speed.fixed_s) * contention(2, 2.0, 2))
    one_slot = forecast(idle(slots=1), [Job("", w), Job("", w)])
    assert one_slot.wall_s == pytest.approx(2 * (w + one_slot.speed.fixed_s))
    assert two_slots.wall_s < one_slot.wall_s


def test_the_queue_ahead_and_the_running_jobs_remaining_work_come_first():
    w, fixed, slow = 10.0, 0.5, contention(2, 2.0, 2)
    done = [sample(slowness=1.0, fixed_s=fixed)]
    running = [Job("", 4.0, slowness=2.0 * slow, fixed_left=END_SHARE)] * 2  # measured now: 2x, two at once
    queued = [Job("", w)] * 3
    # the two running jobs end together; then, alone, mine at the speed measured now (2x an idle core)
    ends = 2.0 * slow * (4.0 + END_SHARE * fixed)
    empty = forecast(idle(running=running, finished=done), [Job("", w)])
    assert empty.wall_s == pytest.approx(ends + 2.0 * (w + fixed)) and empty.ahead == 2
    # with three queued ahead: two of them, then the third beside mine, two at a time
    full = forecast(idle(running=running, queued=queued, finished=done), [Job("", w)])
    assert full.wall_s == pytest.approx(ends + 2 * 2.0 * slow * (w + fixed))
    assert full.ahead == 5 and "5 runs ahead of it (2 training, 3 queued)" in full.text()
    assert "2 runs ahead of it (training now)" in empty.text()


def test_the_queue_is_fair_a_new_owner_goes_before_a_big_preset():
    running = [Job("teacher", 5.0, slowness=1.0)] * 2
    preset = [Job("teacher", 10.0)] * 10
    mine = forecast(idle(running=running, queued=preset), [Job("student", 10.0)], owner="student")
    theirs = forecast(idle(running=running, queued=preset), [Job("teacher", 10.0)], owner="teacher")
    assert mine.ahead == 2 and theirs.ahead == 12  # only the running jobs are ahead of a new owner
    assert mine.wall_s < theirs.wall_s / 3


def test_speed_comes_from_the_runs_training_now_then_the_last_finished_then_a_first_guess():
    guess = forecast(idle(), [Job("", 10.0)])
    assert guess.speed.basis == "guess" and guess.speed.factor == 1.0
    assert "first guess" in guess.text() and "idle core" in guess.text()

    recent = forecast(idle(finished=[sample(3.0), sample(3.0), sample(1.0)]), [Job("", 10.0)])
    assert recent.speed.basis == "recent" and recent.speed.factor == pytest.approx(3.0)  # the median
    assert "measured on this server over its last 3 runs: 3.0x the time of an idle core" in recent.text()
    # a finished job that trained beside another was slowed by it: its speed alone is faster
    paired = forecast(idle(finished=[sample(3.0, at_once=2)]), [Job("", 10.0)])
    assert paired.speed.factor == pytest.approx(3.0 / contention(2, 2.0, 2))

    slow_now = [Job("", 5.0, slowness=4.0)]
    now = forecast(idle(running=slow_now, finished=[sample(1.0)]), [Job("", 10.0)])
    assert now.speed.basis == "now" and now.speed.factor == pytest.approx(4.0)  # one job training: no contention
    assert "measured on this server now, from the run training: 4.0x the time of an idle core" in now.text()


def test_fixed_costs_are_the_median_measured_and_count_once_per_run():
    done = [sample(1.0, fixed_s=f) for f in (1.0, 2.0, 9.0)]
    est = forecast(idle(slots=1, finished=done), [Job("", 10.0), Job("", 10.0)])
    assert est.speed.fixed_s == 2.0 and est.wall_s == pytest.approx(2 * (10.0 + 2.0))
    batched = forecast(idle(slots=1, finished=done), [Job("", 20.0, runs=2)])  # one job of two runs
    assert batched.runs == 2 and batched.wall_s == pytest.approx(20.0 + 2 * 2.0)


def test_a_busy_machine_slows_the_estimate_and_is_said():
    quiet = forecast(idle(), [Job("", 10.0)])
    busy = forecast(idle(capacity=0.5), [Job("", 10.0)])
    assert busy.wall_s == pytest.approx(quiet.wall_s * 2.0)
    assert "other work" not in quiet.text()
    assert "other work leaves training about 0.5 of the machine's 2 cores" in busy.text()
    # two runs at once on what is left: each at a quarter of a core
    pair = forecast(idle(capacity=0.5), [Job("", 10.0), Job("", 10.0)])
    assert pair.wall_s == pytest.approx(quiet.wall_s * 4.0 * contention(2, 2.0, 2))


def test_a_batched_group_counts_as_one_job():
    cfgs = [replace(BASE, train=replace(BASE.train, seed=s)) for s in (1, 2, 3)]
    jobs = group_jobs([("", c, "g") for c in cfgs] + [("", BASE, None)])
    assert [j.runs for j in jobs] == [3, 1]
    assert jobs[0].work_s == pytest.approx(3 * run_seconds(BASE))


# ---- what the job manager measures ---------------------------------------------------------------------
def test_speed_log_measures_slowness_and_the_fixed_cost_of_a_finished_job():
    log, c = SpeedLog(), cost(BASE)
    log.start("r1", "", [c], now=100.0)
    for step in range(1, BASE.train.steps + 1):  # 3x the modelled time per step
        log.step("r1", step, 3.0 * c.upto(step))
    live = log.running("r1")
    assert live.slowness == pytest.approx(3.0) and live.work_s == pytest.approx(c.loop_s - c.upto(200))
    loop_wall = 3.0 * c.loop_s
    log.end("r1", completed=True, now=100.0 + loop_wall + 3.0 * 0.7)  # 0.7 idle-core seconds outside the loop
    (s,) = log.samples
    assert s.slowness == pytest.approx(3.0) and s.fixed_s == pytest.approx(0.7) and s.at_once == pytest.approx(1.0)
    assert s.capacity == 2.0 or s.capacity == log.n_cores  # no probe taken: all cores


class PacedTrainer:
    """Reports step records as if each step took `slowness` times its modelled time, up to `stop_at` of the
    steps, then waits for `gate` (a run training now); then finishes."""

    def __init__(self, slowness: float, stop_at: float, gate: threading.Event) -> None:
        self.slowness, self.stop_at, self.gate = slowness, stop_at, gate
        self.reported = threading.Semaphore(0)

    def __call__(self, cfg: RunConfig, on_record: Callable | None = None,
                 should_stop: Callable[[], bool] | None = None, threads: int | None = None, **_: Any) -> TrainResult:
        emit, c = on_record or (lambda r: None), cost(cfg)
        upto = int(cfg.train.steps * self.stop_at)
        for step in range(1, upto + 1):
            emit(StepRecord(step, 1.0, 1e-3, 0.5, step, self.slowness * c.upto(step), 100.0))
        self.reported.release()
        while not self.gate.wait(0.01):
            if should_stop and should_stop():
                break
        ev = EvalRecord(upto, 1.0, upto, 0.5, 0.9, 0.8)
        return TrainResult(upto, False, 1.0, "cpu", 1, 1.0, 1.0, ev, {"w": torch.zeros(2)})


@pytest.fixture()
def busy(tmp_path):
    """A 2-slot job manager with two runs training (half done, measured 3x their modelled time) and four
    queued."""
    gate = threading.Event()
    trainer = PacedTrainer(3.0, 0.5, gate)
    store = RunStore(tmp_path / "runs")
    jobs = JobManager(store, max_concurrent=2, train_fn=trainer)
    jobs.submit_many([LONG] * 6, owner="")
    for _ in range(2):
        assert trainer.reported.acquire(timeout=WAIT)
    yield jobs
    gate.set()
    jobs.shutdown(wait=True)
    store.close()


def test_the_job_manager_estimates_from_its_running_jobs_and_queue(busy):
    est = busy.estimate([LONG])
    assert est.speed.basis == "now" and est.ahead == 6 and est.runs == 1
    w = run_seconds(LONG)
    # the two running halves, then two pairs from the queue, at 3x, two at a time; then mine
    assert est.wall_s > 3.0 * (0.5 * w + 2 * w) + w
    assert "6 runs ahead of it (2 training, 4 queued)" in est.text()
    assert "speed measured on this server now, from the 2 runs training: 3.0x the time of an idle core" in est.text()


def test_the_grid_preview_counts_the_queue_ahead_on_a_busy_server(busy, tmp_path):
    """Fails on the estimate that only modelled an idle core (it ignored the jobs ahead)."""
    from ui.common import AppContext
    from ui.grid import preview_text
    from ui.knobs import KNOBS

    values = {"task": "copy", "max_len": 6, "d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64,
              "eval_every": 50, "steps": 1000}
    knobs = tuple(values.get(k.url_key, k.default()) for k in KNOBS)
    text = preview_text(AppContext(busy.store, busy), knobs, ("seed", "1, 2", "", "", "", ""))
    m = re.search(r"about ([\d.]+) (s|min)", text, re.I)
    shown = float(m.group(1)) * (60 if m.group(2) == "min" else 1)
    w = run_seconds(LONG)
    assert shown >= 3.0 * (0.5 * w + 3 * w) * 0.9, text  # two runs behind two running and four queued
    assert "6 runs ahead of them (2 training, 4 queued)" in text and "until all are done" in text


def test_the_estimate_reads_nothing_from_the_store(busy, monkeypatch):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the estimate read the store")

    for name in ("list", "status", "config", "summary", "metrics"):
        monkeypatch.setattr(busy.store, name, refuse)
    assert busy.estimate([LONG] * 10).runs == 10


def test_the_train_summary_says_the_cost_of_every_run_before_start(busy, tmp_path):
    """Item 5 of the walkthrough: a single run had no estimate, and a run the server refuses looked fine.
    The summary under the knobs says how long the run would take if started now, on this server (a long
    run in hours), or that Start will refuse it and why."""
    from lab.engine.limits import Limits
    from ui.common import AppContext
    from ui.train import validate

    ctx = AppContext(busy.store, busy)
    values = {"task": "copy", "max_len": 6, "d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64,
              "eval_every": 50, "steps": 1000}

    def summary(**changes: Any) -> str:
        from ui.knobs import KNOBS

        v = {**values, **changes}
        return validate(*(v.get(k.url_key, k.default()) for k in KNOBS), ctx=ctx)

    text = summary()
    assert "⏱ About" in text and "until it is done" in text and "6 runs ahead of it" in text, text
    assert re.search(r"About [\d.]+ h until", summary(steps=1_000_000)), summary(steps=1_000_000)
    # a 35.7M-parameter model on a server whose limit is 2M: refused before anyone clicks, no estimate
    public = AppContext(busy.store, JobManager(busy.store, limits=Limits.public_defaults(), max_concurrent=1))
    try:
        from ui.knobs import KNOBS

        big = {**values, "d_model": 256, "n_heads": 4, "n_layers": 8, "d_ff": 8192}
        text = validate(*(big.get(k.url_key, k.default()) for k in KNOBS), ctx=public)
        assert "Start will refuse this run" in text and "Model size" in text and "⏱" not in text, text
        assert "⏱" not in validate(*(big.get(k.url_key, k.default()) for k in KNOBS), ctx=None)
    finally:
        public.jobs.shutdown(wait=True)
