"""A store with damaged runs: truncated or garbage config, status, metrics, weights, summary and
snapshot files (and a weights file that is really a malicious pickle). Listing still works and
flags each damaged run with its reason; every endpoint of the launched app answers for each of
them without a traceback; the healthy runs are untouched, byte for byte, and still display.
"""
from __future__ import annotations

import hashlib
import pickle
import shutil
from pathlib import Path
from typing import Callable

import pytest

from lab.config import RunConfig, TrainConfig
from lab.engine.recorder import record_run
from lab.engine.store import DamagedRunError, RunStore
from tests.helpers import call_with, compare_api, run_id_endpoints, tiny_config

CFG = tiny_config(pos="learned", steps=20, eval_every=10, snapshots=2)

MARKER = Path("/tmp/lab-damaged-store-pickle-ran")


class Exploit:
    """Unpickling this would create MARKER: a loader that executes code would show it."""

    def __reduce__(self):
        return (open, (str(MARKER), "w"))


def _cut(name: str, keep: float) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: int(len(data) * keep)])
    return damage


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_bytes(data)


def _remove(name: str) -> Callable[[Path], None]:
    return lambda folder: (folder / name).unlink()


def _cut_snapshot(folder: Path) -> None:
    snap = sorted((folder / "attention").iterdir())[-1]
    snap.write_bytes(snap.read_bytes()[:100])


GARBAGE = bytes(range(256)) * 8
# damage name -> (what is done to a copy of a healthy run, the reason listing gives; "" = not flagged)
DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "config-truncated": (_cut("config.json", 0.5), "config.json: not valid JSON"),
    "config-garbage": (_write("config.json", GARBAGE), "config.json: not valid JSON"),
    "config-invalid": (_write("config.json", b'{"model": {"d_model": 15, "n_heads": 2}}'),
                       "config.json: model.d_model"),
    "status-truncated": (_cut("status.json", 0.3), "status.json: not valid JSON"),
    "status-garbage": (_write("status.json", GARBAGE), "status.json: not valid JSON"),
    "status-missing": (_remove("status.json"), "status.json: missing"),
    "metrics-garbage": (_write("metrics.jsonl", GARBAGE), "metrics.jsonl: unreadable lines"),
    "metrics-truncated": (_cut("metrics.jsonl", 0.55), ""),  # a cut-off last line is skipped, the rest is read
    "weights-truncated": (_cut("weights.safetensors", 0.5), "weights.safetensors: truncated"),
    "weights-garbage": (_write("weights.safetensors", GARBAGE), "weights.safetensors: not a safetensors file"),
    "weights-pickle": (_write("weights.safetensors", pickle.dumps(Exploit())),
                       "weights.safetensors: not a safetensors"),
    "weights-missing": (_remove("weights.safetensors"), "weights.safetensors: missing"),
    "summary-garbage": (_write("summary.json", b"\x00\x01{{"), "summary.json: not valid JSON"),
    "snapshot-truncated": (_cut_snapshot, ""),  # found when that step is shown
}


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def build_store(root: Path) -> tuple[RunStore, list[str]]:
    """Two healthy real runs, then one damaged copy of the first per entry of DAMAGES."""
    store = RunStore(root)
    healthy = []
    for seed in (0, 1):
        run_id = store.create(RunConfig(model=CFG.model, task=CFG.task, train=TrainConfig(**{
            **CFG.train.__dict__, "seed": seed})), owner="teacher")
        record_run(store, run_id, threads=1)
        healthy.append(run_id)
    store.close()
    for name, (damage, _) in DAMAGES.items():
        shutil.copytree(store.path(healthy[0]), root / name)
        damage(root / name)
    return store, healthy


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    folder = tmp_path_factory.mktemp("damaged")
    store, healthy = build_store(folder / "runs")
    MARKER.unlink(missing_ok=True)
    return folder, store, healthy, {r: digest(store.path(r)) for r in healthy}


def test_listing_flags_each_damaged_run_with_its_reason(damaged):
    _, store, healthy, digests = damaged
    df = store.list().set_index("run_id")
    assert set(df.index) == set(healthy) | set(DAMAGES)
    for name, (_, reason) in DAMAGES.items():
        flagged = df.loc[name, "damaged"]
        assert (flagged.startswith(reason) if reason else flagged == ""), (name, flagged)
    for run_id in healthy:
        assert df.loc[run_id, "damaged"] == "" and df.loc[run_id, "state"] == "completed"
        assert df.loc[run_id, "final.steps"] == 20
    assert df.loc["config-garbage", "state"] == "completed" and df.loc["status-garbage", "model.pos"] == "learned"
    assert {r: digest(store.path(r)) for r in healthy} == digests  # listing wrote nothing to healthy runs


def test_damaged_files_raise_one_named_error_and_nothing_executes(damaged):
    _, store, healthy, _ = damaged
    for name in ("weights-truncated", "weights-garbage", "weights-pickle"):
        with pytest.raises(DamagedRunError, match=r"^weights\.safetensors: "):
            store.load_weights(name)
    assert not MARKER.exists(), "loading weights executed code from a pickle"
    with pytest.raises(DamagedRunError, match=r"^step_\d+\.safetensors: "):
        store.load_snapshot("snapshot-truncated", store.snapshot_steps("snapshot-truncated")[-1])
    full = store.metrics(healthy[0])
    cut = store.metrics("metrics-truncated")
    assert 0 < len(cut) < len(full) and cut.equals(full.iloc[: len(cut)])  # the readable part, exactly
    assert store.metrics("metrics-garbage").empty
    assert len(store.load_weights(healthy[0])) > 0


@pytest.mark.app  # a launched server on the damaged store
def test_every_endpoint_answers_for_damaged_runs(damaged):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    from tests.helpers import launch_app

    folder, store, healthy, digests = damaged
    with launch_app(folder) as server:
        client = Client(server.url, verbose=False)
        endpoints = run_id_endpoints(client)
        answers, refusals = 0, []
        for name in DAMAGES:
            for api_name, params in sorted(endpoints.items()):
                if api_name in ("/stop", "/delete", "/delete_ask"):
                    continue  # commands, not pages (deleting damaged runs is tested in test_runs.py)
                try:
                    call_with(client, api_name, params, name)
                    answers += 1
                except AppError as exc:
                    message = str(exc)
                    assert "\n" not in message and "Traceback" not in message, (api_name, name, message)
                    assert not message.startswith("The upstream Gradio app has raised"), (api_name, name)
                    refusals.append((api_name, name, message))
        assert answers > len(DAMAGES) * 3, refusals  # most pages render something for a damaged run
        for api_name, name, message in refusals:  # and a refusal says what is wrong with that run
            assert any(w in message for w in ("json", "safetensors", "damaged", "weights", "snapshot", "run_id")), \
                (api_name, name, message)

        text, *_ = client.predict("status-garbage", api_name="/poll")
        assert "damaged" in text and "status.json" in text
        text, *_ = client.predict("metrics-truncated", api_name="/poll")
        assert "Completed" in text
        table = compare_api(client)["table"]
        listed = {row[0] for row in table["data"]}
        assert set(DAMAGES) | set(healthy) <= listed
        run_a, _, _ = client.predict(api_name="/inspect_runs")
        assert set(healthy) <= {r for _, r in run_a["choices"]}

        # the healthy runs still display, and are byte for byte what they were
        for run_id in healthy:
            text, loss, *_ = client.predict(run_id, api_name="/poll")
            assert "**Completed** after 20 steps" in text
            *_, caption = client.predict(run_id, "typed", "1 2 3", 20, api_name="/attention")
            assert caption.startswith("Typed input")
        assert "Traceback" not in server.log_text(), server.log_text()[-3000:]
    assert {r: digest(store.path(r)) for r in healthy} == digests
    assert not MARKER.exists(), "a page executed code from a pickled weights file"
