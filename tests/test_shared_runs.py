"""A class shares one training per configuration (lab/engine/sharing.py, JobManager.claim_many): the same
config, seed and code attach to the run that answers them; ownership stays right; nothing else is reused."""
from __future__ import annotations

import dataclasses
import hashlib
import threading
from pathlib import Path

import pytest

from lab.engine.identity import class_seed, code_version, identity
from lab.engine.jobs import JobManager
from lab.config import ConfigError
from lab.engine.limits import Limits, LimitError
from lab.engine.recorder import record_run
from lab.engine.sharing import SharedRuns, describe_claim
from lab.engine.store import RunStore
from tests.helpers import WAIT, FakeTrainer, named, tiny_config

ADA, BOB, CY = "ada-token-0001", "bob-token-0002", "cy-token-00003"
PUBLIC = Limits(public=True, max_runs_per_user=2, max_queue=3)


@pytest.fixture()
def store(tmp_path: Path) -> RunStore:
    s = RunStore(tmp_path / "runs")
    yield s
    s.close()


def manager(store: RunStore, gate: threading.Event | None = None, limits: Limits = PUBLIC, **kw) -> JobManager:
    return JobManager(store, max_concurrent=1, train_fn=FakeTrainer(gate=gate), limits=limits, **kw)


def test_identity_covers_the_whole_config_and_the_code():
    cfg = tiny_config(steps=20)
    assert identity(cfg) == identity(dataclasses.replace(cfg))
    changed = [tiny_config(steps=21), tiny_config(steps=20, seed=1), tiny_config(steps=20, lr=2e-3),
               tiny_config(steps=20, name="other"), tiny_config(steps=20, task="reverse"),
               tiny_config(steps=20, task="text", min_len=2, text="abc " * 60),
               tiny_config(steps=20, task="text", min_len=2, text="abd " * 60)]
    assert len({identity(c) for c in changed} | {identity(cfg)}) == len(changed) + 1
    assert identity(cfg, "0.0.1+0000000000") != identity(cfg)
    assert code_version().startswith("0.") and len(code_version().split("+")[1]) == 10
    assert class_seed(ADA) == class_seed(ADA) != class_seed(BOB) and 1 <= class_seed(CY) <= 1_000_000


def test_thirty_clicks_on_one_preset_train_it_once(store):
    gate = threading.Event()
    jm = manager(store, gate, limits=Limits(public=True, max_runs_per_user=10, max_queue=3))
    cfgs = [named("1 layer"), named("2 layers")]
    students = [f"student-{i:04d}" for i in range(30)]
    claims: dict[str, list] = {}

    def click(who: str) -> None:
        claims[who] = jm.claim_many(cfgs, owner=who)

    threads = [threading.Thread(target=click, args=(s,)) for s in students]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    ids = {c.run_id for cs in claims.values() for c in cs}
    assert len(ids) == 2 and len(store.run_ids()) == 2  # a queue of 3 admitted the class: two trainings
    assert sum(not c.attached for cs in claims.values() for c in cs) == 2
    assert all([c.run_id for c in cs] == [c.run_id for c in claims[students[0]]] for cs in claims.values())
    gate.set()
    for run_id in ids:
        assert jm.wait(run_id, WAIT).state == "completed"
        assert sorted(jm.holders(run_id)) == sorted(students)
    late = jm.claim_many(cfgs, owner="late-student-1")  # after the runs completed: attached to them
    assert [c.run_id for c in late] == [c.run_id for c in claims[students[0]]] and all(c.attached for c in late)
    assert late[0].state == "completed" and late[0].device == "cpu" and late[0].same_result
    assert "same configuration, same seed, so the same result" in describe_claim(late[0])
    assert len(jm.train_fn.calls) == 2
    jm.shutdown(wait=True)


def test_a_changed_knob_or_seed_starts_a_new_run(store):
    jm = manager(store)
    first = jm.claim_many([named("r")], owner=ADA)[0]
    jm.wait(first.run_id, WAIT)
    for cfg in (dataclasses.replace(named("r"), train=dataclasses.replace(named("r").train, seed=7)),
                dataclasses.replace(named("r"), train=dataclasses.replace(named("r").train, lr=5e-3)),
                named("r", steps=21)):
        claim = jm.claim_many([cfg], owner=BOB)[0]
        assert not claim.attached and claim.run_id != first.run_id
        jm.wait(claim.run_id, WAIT)
    assert len(store.run_ids()) == 4
    jm.shutdown(wait=True)


def test_failed_stopped_and_interrupted_runs_are_never_reused(store, tmp_path):
    gate = threading.Event()
    jm = JobManager(store, max_concurrent=1, train_fn=FakeTrainer(gate=gate, fail_on="bad"), limits=PUBLIC)
    bad = jm.claim_many([named("bad")], owner=ADA)[0]
    gate.set()
    assert jm.wait(bad.run_id, WAIT).state == "failed"
    again = jm.claim_many([named("bad")], owner=BOB)[0]
    assert not again.attached and again.run_id != bad.run_id
    jm.wait(again.run_id, WAIT)

    gate.clear()
    stopped = jm.claim_many([named("s", steps=500)], owner=ADA)[0]
    assert jm.stop(stopped.run_id, owner=ADA)  # its only holder: it stops
    gate.set()
    assert jm.wait(stopped.run_id, WAIT).state == "stopped"
    fresh = jm.claim_many([named("s", steps=500)], owner=ADA)[0]
    assert not fresh.attached and fresh.run_id != stopped.run_id
    jm.wait(fresh.run_id, WAIT)
    jm.shutdown(wait=True)

    # a run interrupted by a dead server, found in the store by the next one
    lost = store.create(named("lost"), owner=ADA, identity=identity(named("lost")), code_version=code_version())
    store.set_status(lost, "interrupted", error="process died while running")
    later = manager(store).claim_many([named("lost")], owner=BOB)[0]
    assert not later.attached and later.run_id != lost


def test_a_completed_run_of_another_server_or_code_version(store):
    done = store.create(named("kept"), identity=identity(named("kept")), code_version=code_version())
    record_run(store, done, train_fn=FakeTrainer(step_s=0))
    old = store.create(named("old"), identity=identity(named("old"), "0.0.1+abcdefabcd"), code_version="0.0.1+abcdefabcd")
    record_run(store, old, train_fn=FakeTrainer(step_s=0))
    jm = manager(store)  # a restarted server: its index is read from the store
    kept, fresh = jm.claim_many([named("kept"), named("old")], owner=ADA)
    assert kept.attached and kept.run_id == done and kept.state == "completed"
    assert not fresh.attached and fresh.run_id != old  # another code version's run is not this code's result
    jm.wait(fresh.run_id, WAIT)
    jm.shutdown(wait=True)


def test_an_attached_students_stop_and_delete_leave_the_run_for_the_others(store):
    gate = threading.Event()
    jm = manager(store, gate)
    run_id = jm.claim_many([named("shared", steps=40)], owner=ADA)[0].run_id
    assert jm.claim_many([named("shared", steps=40)], owner=BOB)[0].run_id == run_id
    assert jm.claim_many([named("shared", steps=40)], owner=CY)[0].run_id == run_id
    assert jm.stop(run_id, owner=BOB)  # Bob leaves; the run goes on for Ada and Cy
    assert jm.status(run_id).state in ("queued", "running") and jm.holders(run_id) == [ADA, CY]
    with pytest.raises(PermissionError):
        jm.stop(run_id, owner=BOB)  # no longer his
    assert jm.delete(run_id, owner=ADA) == [CY]  # the first starter leaves too: still Cy's
    gate.set()
    assert jm.wait(run_id, WAIT).state == "completed" and store.exists(run_id)
    with pytest.raises(PermissionError):
        jm.delete(run_id, owner=ADA)
    assert jm.delete(run_id, owner=CY) == [] and not store.exists(run_id)  # its last holder: gone
    again = jm.claim_many([named("shared", steps=40)], owner=ADA)[0]
    assert not again.attached  # a deleted run answers nothing
    jm.wait(again.run_id, WAIT)
    jm.shutdown(wait=True)


def test_the_last_holders_stop_stops_it(store):
    gate = threading.Event()
    jm = manager(store, gate)
    run_id = jm.claim_many([named("r", steps=400)], owner=ADA)[0].run_id
    jm.claim_many([named("r", steps=400)], owner=BOB)
    assert jm.stop(run_id, owner=ADA) and jm.stop(run_id, owner=BOB)
    gate.set()
    assert jm.wait(run_id, WAIT).state == "stopped"
    jm.shutdown(wait=True)


def test_limits_count_distinct_trainings_not_clicks(store):
    gate = threading.Event()
    jm = manager(store, gate, limits=Limits(public=True, max_runs_per_user=2, max_queue=2))
    jm.claim_many([named("a"), named("b")], owner=ADA)  # Ada's limit reached
    for who in (BOB, CY, "dee-token-004"):  # the same two runs: nothing queued, nothing counted
        assert all(c.attached for c in jm.claim_many([named("a"), named("b")], owner=who))
    assert all(c.attached for c in jm.claim_many([named("a"), named("b")], owner=ADA))  # Ada's own runs again
    with pytest.raises(LimitError, match="queue"):  # two new ones for Bob: the queue holds 2
        jm.claim_many([named("c"), named("d")], owner=BOB)
    assert len(store.run_ids()) == 2  # refused whole: nothing half-started
    gate.set()
    jm.shutdown(wait=True)


def test_a_continued_run_answers_no_more(store):
    done = store.create(named("c"), identity=identity(named("c")), code_version=code_version())
    record_run(store, done, train_fn=FakeTrainer(step_s=0))
    shared = SharedRuns(store)
    assert shared.find(identity(named("c")), set()) == done
    cfg = named("c")
    (store.path(done) / "config.json").write_text(
        dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=40)).to_json())  # as a continuation
    assert SharedRuns(store).find(identity(named("c")), set()) is None


@pytest.mark.app
def test_one_configuration_trained_twice_on_cpu_gives_bit_identical_weights(tmp_path):
    """The reason a second training is waste: the same config, seed and code give the same weights, byte for
    byte (the app's worker processes, one thread each)."""
    cfg = tiny_config(task="reverse", steps=60, dropout=0.1, seed=5, eval_every=30, device="cpu", threads=1)
    digests = []
    for i in range(2):
        store = RunStore(tmp_path / f"store{i}")
        jm = JobManager(store, max_concurrent=1, mode="process")
        run_id = jm.submit(cfg)
        assert jm.wait(run_id, 300).state == "completed"
        digests.append(hashlib.sha256((store.path(run_id) / "weights.safetensors").read_bytes()).hexdigest())
        jm.shutdown(wait=True)
        store.close()
    assert digests[0] == digests[1]


def test_with_sharing_off_every_request_trains(store):
    jm = manager(store, limits=Limits(public=True, max_runs_per_user=5, max_queue=5, share_runs=False))
    a, b = (jm.claim_many([named("r")], owner=who)[0] for who in (ADA, BOB))
    assert not a.attached and not b.attached and a.run_id != b.run_id
    for claim in (a, b):
        jm.wait(claim.run_id, WAIT)
    jm.shutdown(wait=True)
    assert Limits.from_env({"LAB_SHARE_RUNS": "0"}).share_runs is False and Limits.from_env({}).share_runs
    with pytest.raises(ConfigError, match="LAB_SHARE_RUNS"):
        Limits.from_env({"LAB_SHARE_RUNS": "sometimes"})


def test_a_gpu_run_is_the_same_configuration_not_the_same_result():
    from lab.engine.sharing import Claim

    gpu = Claim("r1", attached=True, state="completed", trained_at="2026-11-27T10:42:00.000+00:00", device="cuda:0",
                code_version=code_version())
    text = describe_claim(gpu, now_date="2026-11-27")
    assert not gpu.same_result and "at 10:42 UTC" in text and "the same configuration and seed" in text
    assert "same result" not in text and "on a GPU (cuda:0)" in text
    cpu = dataclasses.replace(gpu, device="cpu")
    assert cpu.same_result and "same configuration, same seed, so the same result" in describe_claim(cpu)
    live = dataclasses.replace(cpu, state="running", device="")
    assert "is training on this server (started at 10:42 UTC on 2026-11-27)" in describe_claim(live)
