"""Train on GPU (ui/gpu.py), in-process with the real `spaces` package: off ZeroGPU its decorator leaves the
chunk function as it is, so the chunks train here, on the CPU, and the run equals one trained in one go; a
ZeroGPU error that means "no GPU now" hands the run to the CPU queue from its checkpoint, with one sentence
saying so; a page closed between chunks hands it over too; Stop reaches a run between chunks. The real
package under ZeroGPU's environment, against a stub of its device API, is in tests/test_zerogpu_app.py."""
from __future__ import annotations

from typing import Iterator

import gradio as gr
import pytest

import ui.gpu as gpu
from lab.engine.jobs import JobManager
from lab.engine.recorder import record_run
from lab.engine.store import RunStore
from tests.helpers import RESUMABLE, same_run, tiny_config
from ui.common import AppContext

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture()
def ctx(tmp_path, monkeypatch) -> Iterator[AppContext]:
    monkeypatch.setattr(gpu, "CHUNK_S", 0.001)  # one step a chunk: many chunks in a tiny run
    store = RunStore(tmp_path / "runs")
    jobs = JobManager(store, max_concurrent=1, mode="thread")
    yield AppContext(store, jobs)
    jobs.shutdown(wait=True)


def test_the_spaces_decorator_leaves_the_chunk_as_it_is_off_zerogpu():
    import spaces

    assert spaces.GPU(duration=gpu.GPU_DURATION_S)(gpu._chunk) is gpu._chunk and gpu.gpu_chunk is gpu._chunk
    assert not gpu.gpu_available()  # no Train on GPU button off ZeroGPU


def test_off_zerogpu_the_chunks_train_here_and_equal_one_go(ctx):
    cfg = tiny_config(RESUMABLE, steps=5)
    said = list(gpu.train_on_gpu(ctx, cfg, "u1"))
    run = said[0][0]
    assert said[0][1].startswith("⚡ Waiting for a GPU")
    assert [t for _, t in said[1:-1]] == [f"⚡ Training on the CPU, in chunks of 0 s: step {s} of 5; waiting for "
                                          "the next GPU slot…" for s in range(1, 5)]
    assert said[-1][1] == "⚡ Trained on the CPU in chunks of 0 s: completed at step 5."
    whole = ctx.store.create(cfg)
    record_run(ctx.store, whole, threads=1)
    same_run(ctx.store, whole, run)


def test_no_gpu_now_hands_the_run_to_the_cpu_queue_from_its_checkpoint(ctx, monkeypatch):
    calls = []

    def quota(runs_dir: str, run_id: str, seconds: float):
        calls.append(run_id)
        if len(calls) == 3:  # the error the spaces package raises when the user's daily quota is spent
            raise gr.Error("You have exceeded your free ZeroGPU quota (60s requested vs. 12s left). Try again in "
                           "20:14:03.", title="ZeroGPU quota exceeded")
        return gpu._chunk(runs_dir, run_id, seconds)

    monkeypatch.setattr(gpu, "gpu_chunk", quota)
    cfg = tiny_config(RESUMABLE, steps=9)
    said = list(gpu.train_on_gpu(ctx, cfg, "u1"))
    run = said[0][0]
    assert said[-1][1] == ("🐢 No GPU now (ZeroGPU quota exceeded: You have exceeded your free ZeroGPU quota (60s "
                           "requested vs. 12s left). Try again in 20:14:03.). The run goes on in the CPU queue from "
                           "step 2.")
    assert ctx.jobs.wait(run, timeout=120).state == "completed"
    whole = ctx.store.create(cfg)
    record_run(ctx.store, whole, threads=1)
    same_run(ctx.store, whole, run)


def test_a_gpu_queue_timeout_on_the_first_chunk_trains_the_new_run_on_the_cpu(ctx, monkeypatch):
    def timeout(runs_dir: str, run_id: str, seconds: float):
        raise gr.Error("No GPU was available after 60s", title="ZeroGPU queue timeout")

    monkeypatch.setattr(gpu, "gpu_chunk", timeout)
    said = list(gpu.train_on_gpu(ctx, tiny_config(RESUMABLE, steps=4), "u1"))
    assert said[-1][1].startswith("🐢 No GPU now (ZeroGPU queue timeout: No GPU was available after 60s)")
    assert said[-1][1].endswith("The run goes on in the CPU queue from step 0.")
    assert ctx.jobs.wait(said[0][0], timeout=120).state == "completed"


def test_a_page_closed_between_chunks_leaves_the_run_to_the_cpu_queue(ctx):
    steps = gpu.train_on_gpu(ctx, tiny_config(RESUMABLE, steps=8), "u1")
    run, _ = next(steps)
    next(steps)  # one chunk trained
    steps.close()  # the browser went away: gradio closes the generator
    assert ctx.jobs.wait(run, timeout=120).state == "completed"
    assert ctx.store.status(run)["step"] == 8


def test_stop_reaches_a_run_between_chunks(ctx):
    steps = gpu.train_on_gpu(ctx, tiny_config(RESUMABLE, steps=30), "u1")
    run, _ = next(steps)
    next(steps)
    assert gpu.stop_gpu_run(ctx, run) is True
    said = [t for _, t in steps]
    assert said == ["⚡ Trained on the CPU in chunks of 0 s: stopped at step 1."]
    assert ctx.store.status(run)["state"] == "stopped" and gpu.stop_gpu_run(ctx, run) is False


def test_other_failures_are_not_taken_for_no_gpu():
    assert gpu.no_gpu_reason(ValueError("d_model: 3 is not divisible")) is None
    assert gpu.no_gpu_reason(gr.Error("GPU task aborted", title="ZeroGPU worker error")).startswith("ZeroGPU worker")


def test_the_start_gpu_event_streams_its_updates(tmp_path, monkeypatch):
    """Gradio streams a generator's updates only when the registered function is one (a plain wrapper
    returning a generator failed every click on a ZeroGPU Space)."""
    import inspect

    import app
    from ui.knobs import KNOBS

    monkeypatch.setattr(gpu, "CHUNK_S", 0.05)
    store = RunStore(tmp_path / "runs")
    jobs = JobManager(store, max_concurrent=1, mode="thread")
    try:
        demo = app.build_demo(store, jobs)
        fn = next(f.fn for f in demo.fns.values() if f.api_name == "start_gpu")
        assert inspect.isgeneratorfunction(fn)
        values = {"task": "copy", "max_len": 4, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "steps": 20,
                  "eval_every": 10}
        updates = list(fn(*(values.get(k.url_key, k.default()) for k in KNOBS), [], "u1"))
        run_id = updates[0][0].value
        assert updates[0][1] == [run_id] and updates[0][3].startswith("⚡ Waiting for a GPU")
        assert updates[-1][3] == "⚡ Trained on the CPU in chunks of 0 s: completed at step 20."
        assert store.status(run_id)["state"] == "completed"
    finally:
        jobs.shutdown(wait=True)


def test_train_on_gpu_is_admitted_as_start_is_and_refused_before_any_run_exists(tmp_path):
    """The server's limits apply to Train on GPU as to Start (a class could otherwise bypass the per-user
    limit): a user at the limit is refused with the limit named, and no run folder is made."""
    import threading

    from lab.config import ConfigError
    from lab.engine.limits import Limits
    from tests.helpers import FakeTrainer

    gate = threading.Event()
    store = RunStore(tmp_path / "runs")
    limits = Limits(public=True, max_runs_per_user=1)
    jobs = JobManager(store, max_concurrent=1, train_fn=FakeTrainer(gate=gate), limits=limits)
    owner = "u" * 32
    try:
        jobs.submit(tiny_config(RESUMABLE, steps=5), owner=owner)  # the user's one live run
        before = sorted(p.name for p in store.root.iterdir())
        with pytest.raises(ConfigError, match="runs per user|Runs per user"):
            next(gpu.train_on_gpu(AppContext(store, jobs), tiny_config(RESUMABLE, steps=6), owner))
        assert sorted(p.name for p in store.root.iterdir()) == before
    finally:
        gate.set()
        jobs.shutdown(wait=True)


def test_train_on_gpu_watches_a_configuration_already_trained_or_training(ctx):
    """A class clicking Train on GPU with one configuration trains it once (lab/engine/sharing.py)."""
    cfg = tiny_config(RESUMABLE, steps=5)
    steps = gpu.train_on_gpu(ctx, cfg, "student-0001")
    run_id, _ = next(steps)  # created, training in chunks
    watching = list(gpu.train_on_gpu(ctx, cfg, "student-0002"))  # while the first trains: that run
    assert [r for r, _ in watching] == [run_id] and "on this server (started at" in watching[0][1]
    list(steps)
    assert ctx.store.status(run_id)["state"] == "completed"
    later = list(gpu.train_on_gpu(ctx, cfg, "student-0003"))
    assert [r for r, _ in later] == [run_id] and "same configuration, same seed" in later[0][1]
    assert ctx.store.run_ids() == [run_id] and ctx.jobs.holders(run_id) == ["student-0001", "student-0002",
                                                                            "student-0003"]
