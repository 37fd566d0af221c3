"""A run that ends outside its training loop (its process killed, a worker lost) reports the last step its
metrics reached, not the step its status last recorded (refreshed only every few seconds)."""
from __future__ import annotations

import json

from lab.config import RunConfig
from lab.engine.store import RunStore
from lab.records import StepRecord


def killed_at(store: RunStore, status_step: int, metrics_step: int) -> str:
    """A run whose status says `running` at `status_step`, written by a process that is gone (its writer's
    lock was never taken), with train records up to `metrics_step`."""
    run_id = store.create(RunConfig())
    for step in range(1, metrics_step + 1):
        store.append(run_id, StepRecord(step, 1.0, 1e-3, 0.5, 64 * step, 0.01 * step, 1000.0))
    store.close()
    path = store.path(run_id) / "status.json"
    status = json.loads(path.read_text())
    status.update(state="running", step=status_step, writer="w999999-0123456789ab", pid=999_999_999, proc=None)
    path.write_text(json.dumps(status))
    with open(store.path(run_id) / "metrics.jsonl", "ab") as fh:
        fh.write(b'{"kind": "train", "step": 19')  # a torn last line, as a kill can leave
    return run_id


def test_a_killed_run_reads_and_is_recorded_at_the_step_its_metrics_reached(tmp_path):
    store = RunStore(tmp_path / "runs")
    run_id = killed_at(store, status_step=150, metrics_step=198)
    seen = store.status(run_id)
    assert (seen["state"], seen["step"]) == ("interrupted", 198)
    assert json.loads((store.path(run_id) / "status.json").read_text())["step"] == 150  # reading wrote nothing
    assert store.recover() == [run_id]
    saved = json.loads((store.path(run_id) / "status.json").read_text())
    assert (saved["state"], saved["step"]) == ("interrupted", 198)


def test_a_run_failed_from_outside_its_loop_keeps_its_last_step(tmp_path):
    store = RunStore(tmp_path / "runs")
    run_id = killed_at(store, status_step=40, metrics_step=57)
    assert store.set_status(run_id, "failed", error="the training process was killed")["step"] == 57
    assert store.set_status(run_id, "failed", step=12)["step"] == 12  # a step given is kept as given


def test_messages_about_missing_runs_do_not_show_the_servers_folders(tmp_path):
    """A page or an API client asking for an unknown run learns that it does not exist, not where the
    server keeps its runs."""
    import pytest

    from lab.engine.storefs import RunNotFoundError

    store = RunStore(tmp_path / "secret-place")
    with pytest.raises(RunNotFoundError) as err:
        store.config("20990101-000000-copy-rope-pre-000000")
    assert "does not exist" in str(err.value) and "secret-place" not in str(err.value)
