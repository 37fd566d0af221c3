"""The Train tab's poll does only what changed (ui/live.py): a run's curves are computed once per change
of its metrics file and shared by every page; a page is sent only what it does not already show; the
timer slows down while nothing changes and a run that ends is sent in full. In-process, a real store."""
from __future__ import annotations

import gradio as gr
import pytest

import app
from lab.config import RunConfig
from lab.engine.jobs import JobManager
from lab.engine.store import RunStore
from lab.records import EvalRecord, StepRecord
from tests.helpers import FakeTrainer
from ui import live
from ui.common import AppContext

CFG = {"task": {"name": "copy", "max_len": 4}, "model": {"d_model": 16, "n_heads": 2, "n_layers": 1},
       "train": {"steps": 50}}


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    store = RunStore(tmp_path / "runs")
    jobs = JobManager(store, max_concurrent=1, train_fn=FakeTrainer(step_s=0))
    demo = app.build_demo(store, jobs)
    reads: list[str] = []
    metrics = store.metrics
    monkeypatch.setattr(store, "metrics", lambda run_id: reads.append(run_id) or metrics(run_id))
    poll = next(fn for fn in demo.fns.values() if fn.api_name == "poll")
    yield store, poll, reads
    jobs.shutdown(wait=True)


def step(store: RunStore, run_id: str, n: int) -> None:
    store.append(run_id, StepRecord(step=n, loss=2.0 / n, lr=1e-3, grad_norm=1.0, tokens=64 * n, elapsed_s=0.01 * n,
                                    tokens_per_s=6400.0))


def skipped(value) -> bool:
    return isinstance(value, dict) and value == gr.skip()


def timer(update) -> tuple[float, bool]:
    return (update["value"], update["active"]) if isinstance(update, dict) else (update.value, update.active)


def test_the_poll_is_one_unqueued_request(setup):
    _, poll, _ = setup
    assert poll.queue is False  # never "Queue is full", no event stream: one POST per refresh


def test_a_second_poll_with_no_new_records_reads_nothing_and_sends_nothing(setup):
    store, poll, reads = setup
    run_id = store.create(RunConfig.from_dict(CFG))
    store.set_status(run_id, "running", step=1)
    step(store, run_id, 1)
    text, loss, acc, attn, tick, seen = poll.fn(run_id, {})
    assert "Running" in text and len(loss) and not skipped(loss) and reads == [run_id]
    assert timer(tick) == (live.FAST_S, True)

    text2, loss2, acc2, attn2, tick2, seen2 = poll.fn(run_id, seen)  # nothing new in the store
    assert reads == [run_id]  # the metrics file was not read again
    assert skipped(text2) and skipped(loss2) and skipped(acc2) and skipped(attn2)  # the page keeps what it shows
    assert timer(tick2) == (live.FAST_S, True)

    *_, tick3, seen3 = poll.fn(run_id, seen2)
    assert timer(tick3) == (live.SLOW_S, True)  # quiet: a slower refresh

    step(store, run_id, 2)  # a new record: read once, sent, and the refresh is fast again
    _, loss4, _, _, tick4, seen4 = poll.fn(run_id, seen3)
    assert reads == [run_id, run_id] and list(loss4[loss4["series"] == "train"]["step"]) == [1, 2]
    assert timer(tick4) == (live.FAST_S, True)


def test_pages_share_the_frames_and_each_gets_them_once(setup):
    store, poll, reads = setup
    run_id = store.create(RunConfig.from_dict(CFG))
    store.set_status(run_id, "running", step=1)
    step(store, run_id, 1)
    for _ in range(5):  # five pages open on the same run: each is sent the curves, one read in all
        _, loss, *_ = poll.fn(run_id, {})
        assert not skipped(loss)
    assert reads == [run_id]


def test_a_run_that_ends_is_sent_in_full_and_stops_the_timer(setup):
    store, poll, reads = setup
    run_id = store.create(RunConfig.from_dict(CFG))
    store.set_status(run_id, "running", step=1)
    step(store, run_id, 1)
    *_, seen = poll.fn(run_id, {})
    store.append(run_id, EvalRecord(step=1, elapsed_s=0.02, tokens=64, loss=1.0, token_acc=0.5, exact_match=0.25))
    store.set_status(run_id, "completed", step=1)
    text, loss, acc, attn, tick, _ = poll.fn(run_id, seen)
    assert "Completed" in text and not skipped(loss) and not skipped(acc)
    assert timer(tick)[1] is False
    assert 1 in list(acc["step"])  # the eval written with the end is drawn


def test_a_queued_run_draws_nothing_then_slows_down(setup):
    store, poll, reads = setup
    run_id = store.create(RunConfig.from_dict(CFG))  # queued, in no manager's queue
    text, loss, acc, attn, tick, seen = poll.fn(run_id, {})
    assert "Queued" in text and loss is None and acc is None and reads == []
    intervals = []
    for _ in range(3):
        text, loss, acc, attn, tick, seen = poll.fn(run_id, seen)
        assert skipped(text) and skipped(loss)
        intervals.append(timer(tick)[0])
    assert intervals == [live.FAST_S, live.SLOW_S, live.SLOW_S]


def test_another_run_is_always_drawn(setup):
    store, poll, _ = setup
    a, b = (store.create(RunConfig.from_dict(CFG)) for _ in range(2))
    for r in (a, b):
        store.set_status(r, "running", step=1)
        step(store, r, 1)
    *_, seen_a = poll.fn(a, {})
    *_, seen_b = poll.fn(b, seen_a)
    _, loss, *_ = poll.fn(a, seen_b)  # back to a: the page shows b's curves, so a's are sent
    assert not skipped(loss)


def test_a_continued_run_whose_file_is_replaced_is_recomputed(setup):
    store, poll, reads = setup
    run_id = store.create(RunConfig.from_dict(CFG))
    store.set_status(run_id, "running", step=2)
    step(store, run_id, 1)
    step(store, run_id, 2)
    *_, seen = poll.fn(run_id, {})
    store.release(run_id)
    path = store.path(run_id) / "metrics.jsonl"
    first = path.read_bytes().splitlines(keepends=True)[0]
    tmp = path.with_name("metrics.tmp")
    tmp.write_bytes(first)  # cut back to step 1, as a continuation does (a new file renamed in)
    tmp.replace(path)
    _, loss, *_ = poll.fn(run_id, seen)
    assert len(reads) == 2 and list(loss[loss["series"] == "train"]["step"]) == [1]


def test_the_latest_attention_snapshot_is_drawn_once_and_again_when_a_new_one_is_written(setup):
    """The Train tab's live attention: the run's newest snapshot, read from what the training writes (no extra
    training), sent when a newer one appears and not at the polls between; none before the first."""
    import time

    import numpy as np

    from lab.config import RunConfig
    from lab.records import DEC_SELF, SnapshotRecord

    store, poll, _ = setup
    cfg = RunConfig.from_dict(CFG)
    run_id = store.create(cfg)
    store.set_status(run_id, "running", step=1)
    step(store, run_id, 1)
    *_, attn, _, seen = poll.fn(run_id, {})
    assert attn.visible is False  # no snapshot yet

    from lab.views.analysis import sampled_probe

    t = len(sampled_probe(cfg).axes(DEC_SELF)[0])  # the probe's length, as a training's snapshot has it

    def snapshot(at: int) -> None:
        p = np.full((cfg.model.n_layers, cfg.model.n_heads, t, t), 1.0 / t, dtype=np.float32)
        store.save_snapshot(run_id, SnapshotRecord(step=at, patterns={DEC_SELF: p}))

    snapshot(10)
    step(store, run_id, 10)
    start = time.perf_counter()
    *_, attn, _, seen = poll.fn(run_id, seen)
    drawn_s = time.perf_counter() - start
    assert attn.visible is True and str(attn.value["path"]).endswith(f"{run_id}-10.png")
    step(store, run_id, 11)  # a new record, no new snapshot: the picture is not sent again
    *_, attn2, _, seen = poll.fn(run_id, seen)
    assert skipped(attn2)
    snapshot(20)
    step(store, run_id, 20)
    *_, attn3, _, seen = poll.fn(run_id, seen)
    assert not skipped(attn3) and seen["snapshot"] == 20
    print(f"\n[live attention] one poll with a new snapshot: {1000 * drawn_s:.0f} ms of the server's time")

    pictures = live.SnapshotPictures(size=2)  # every page that shows the run gets the one picture drawn
    ctx = AppContext(store=store, jobs=None)
    paths = [pictures.get(ctx, run_id, 10) for _ in range(30)]
    assert pictures.drawn == 1 and len(set(paths)) == 1 and paths[0].endswith(".png")
    pictures.get(ctx, run_id, 20)
    assert pictures.get(ctx, run_id, 10) == paths[0] and pictures.drawn == 2


def test_a_tick_for_the_run_shown_before_sends_nothing_once_the_page_shows_another(tmp_path, monkeypatch):
    """The timer's tick is unqueued and "Run shown"'s change is queued: a tick asked for run a can finish after
    the page changed to run b. Its answer (a's progress, picture, a stopped timer) is dropped; another page
    still gets a's answer, and so does a caller that asks for a after b in turn (the API)."""
    from types import SimpleNamespace

    import ui.train

    store = RunStore(tmp_path / "runs")
    jobs = JobManager(store, max_concurrent=1, train_fn=FakeTrainer(step_s=0))
    during = []  # what happens on the page while the next tick reads the store
    real_poll = ui.train.on_poll

    def poll_with_a_change_meanwhile(*args):
        out = real_poll(*args)
        while during:
            during.pop(0)()
        return out

    monkeypatch.setattr(ui.train, "on_poll", poll_with_a_change_meanwhile)
    fns = {fn.api_name: fn for fn in app.build_demo(store, jobs).fns.values()}
    try:
        a, b = (store.create(RunConfig.from_dict(CFG)) for _ in range(2))
        for r in (a, b):
            store.set_status(r, "completed", step=1)
            step(store, r, 1)
        page, other = SimpleNamespace(session_hash="page"), SimpleNamespace(session_hash="other")
        fns["show_run"].fn(a, {}, page)
        assert "Completed" in fns["poll"].fn(a, {}, page)[0]  # the run it shows
        during.append(lambda: fns["show_run"].fn(b, {}, page))  # the page moves on to b while a tick for a reads
        assert all(skipped(v) for v in fns["poll"].fn(a, {}, page))  # that late tick for a: nothing
        assert "Completed" in fns["poll"].fn(b, {}, page)[0]
        during.append(lambda: fns["show_run"].fn(b, {}, other))  # another page's change is not this one's
        assert "Completed" in fns["poll"].fn(a, {}, page)[0]  # asked for a after b, in turn: a's answer
        during.append(lambda: fns["show_run"].fn(a, {}, page))  # a change back to the run the tick asks for
        assert "Completed" in fns["poll"].fn(a, {}, page)[0]
    finally:
        jobs.shutdown(wait=True)
