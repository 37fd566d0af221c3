"""The launched app, driven through its API with gradio_client: start, poll, stop, compare, inspect,
the poll latency while a run trains, and invalid knobs answered without a traceback.

The server (`python app.py`, its own run store) comes from the session fixture in conftest.py.
Waits are generous and nothing asserts timing except a lenient bound on the poll latency.
"""
from __future__ import annotations


import time

import pytest

from tests.helpers import INVALID, INVALID_IDS, LABELS, WAIT_S, compare, compare_api, poll, \
    poll_until_done, start

pytestmark = pytest.mark.app  # launches the app in a subprocess
def test_start_poll_then_compare_and_inspect(client, app_server):
    run_id = start(client)
    assert run_id in app_server.run_folders()

    text, loss, acc = poll_until_done(client, run_id)
    assert "Completed" in text and "150 steps" in text, text
    assert set(loss["series"]) == {"train", "held-out"}  # every series, even before it has points
    drawn = loss.dropna(subset=["value"])
    assert set(drawn["series"]) == {"train", "held-out"} and drawn["step"].max() == 150
    assert set(acc["series"]) == {"held-out", "train", "held-out, longer lengths"}  # reverse: exact-match
    assert acc["value"].dropna().between(0, 1).all() and acc["value"].notna().any()
    assert "Held-out exact-match" in text and "whole answers right" in text and "On longer inputs" in text

    curves, finals, _, params = compare(client, [run_id])
    assert len(curves) > 10 and curves["run"].nunique() == 1 and run_id[-6:] in curves["run"][0]
    assert finals.loc[0, "state"] == "completed" and finals.loc[0, "steps"] == 150
    assert params["visible"] is True  # hidden until runs are picked
    assert params["value"]["type"] == "matplotlib" and params["value"]["plot"].startswith("data:image")

    slider = client.predict(run_id, api_name="/snapshot_steps")
    assert slider["maximum"] == 150 and slider["interactive"] is True
    enc_self, dec_self, cross, caption = client.predict(run_id=run_id, source="sampled", text="",
                                                        step=slider["maximum"], api_name="/attention_for_run")
    assert dec_self["visible"] is True and dec_self["value"]["plot"].startswith("data:image")
    assert enc_self["visible"] is False and cross["visible"] is False  # a decoder-only run
    assert "step 150" in caption
    *_, typed_caption = client.predict(run_id=run_id, source="typed", text="1 2 3", step=150, api_name="/attention")
    assert typed_caption.startswith("Typed input")

    # the page's own event: a typed input it cannot draw leaves every figure as it is and says why beside the box
    *kept, note, slider, probe = client.predict(run_id, "typed", "z z", 150, api_name="/attention_view")
    assert all(update == {"__type__": "update"} for update in [*kept, slider, probe])
    assert note.startswith("⚠️ **Typed input**") and "'z'" in note
    *figures, caption, note, slider, probe = client.predict(run_id, "typed", "1 2 3", 150, api_name="/attention_view")
    assert caption.startswith("Typed input") and note == "" and figures[1]["visible"] is True
    assert slider["interactive"] is False and slider["value"] == 150 and "final weights" in slider["label"]

    pca, figure, note = client.predict(run_id, api_name="/positional_a")  # figures, whole pictures of this run
    assert pca["visible"] is True and pca["value"]["type"] == "matplotlib"
    assert pca["value"]["plot"].startswith("data:image")
    assert figure["type"] == "matplotlib" and note.startswith("PCA of")

    run_a, run_b, slider = client.predict(api_name="/inspect_runs")
    assert [label_id[1] for label_id in run_a["choices"]].count(run_id) == 1
    # the newest run is picked with its own slider: at its last snapshot, never a placeholder
    assert slider["value"] == client.predict(run_a["value"], api_name="/snapshot_steps")["value"] > 0


def test_poll_follows_a_run_that_trains_then_stops(client):
    run_id = start(client, steps=5000)
    deadline = time.monotonic() + WAIT_S
    while True:  # wait until it really trains
        text, loss, _, _ = poll(client, run_id)
        if "Running" in text and loss["value"].notna().any():
            break
        assert time.monotonic() < deadline, f"run never started training: {text}"
        time.sleep(0.5)

    rows = []  # how fast a poll answers is a benchmark's figure (benchmarks/classroom_load.py), not a test's
    for _ in range(20):
        text, loss, _, active = poll(client, run_id)
        assert active and "Running" in text, f"the run should still be training: {text}"
        rows.append(int(loss["value"].notna().sum()))
        time.sleep(0.5)
    assert rows[-1] > rows[0], "the live curve did not grow while the run trained"

    assert client.predict(run_id, "u1", api_name="/stop")
    text, loss, _ = poll_until_done(client, run_id)
    assert "Stopped" in text, text
    assert loss.dropna(subset=["value"])["step"].max() < 5000
    for _ in range(3):  # a stopped run's poll keeps answering, and says so
        text, _, _, active = poll(client, run_id)
        assert "Stopped" in text and not active, text


def test_two_runs_back_to_back_both_finish_and_overlay_in_compare(client):
    run_a = start(client, pos="learned")
    run_b = start(client, pos="rope")
    done = {r: poll_until_done(client, r)[0] for r in (run_a, run_b)}
    assert all("Completed" in text for text in done.values()), done

    listed = [run_id for _, run_id in compare_api(client)["pick"]["choices"]]
    assert run_a in listed and run_b in listed

    curves, finals, configs, _ = compare(client, [run_a, run_b])
    assert curves["run"].nunique() == 2
    assert all(len(group) > 10 for _, group in curves.groupby("run"))
    assert list(finals["state"]) == ["completed", "completed"]
    # "differences only" keeps the differing column, headed by its label in the UI
    assert set(configs["Positional encoding"]) == {"learned", "rope"}
    assert "d_model" not in configs.columns and not any(c.startswith("model.") for c in configs.columns)
    assert set(configs["run"]) == set(finals["run"]) == set(curves["run"])  # one name per run everywhere


@pytest.mark.parametrize(("case", "fields"), INVALID, ids=INVALID_IDS)
def test_invalid_knobs_answer_one_line_naming_the_field(client, app_server, case, fields):
    before, log_start = app_server.run_folders(), app_server.log_size()

    text = client.predict(**case, api_name="/validate")
    assert text.startswith("⚠️") and "\n" not in text, text
    assert any(f"**{LABELS[f]}**" in text for f in fields), text

    *_, message = client.predict(**case, my_runs=[], owner="u1", api_name="/start")  # answered in Start's note
    assert "\n" not in message and len(message) < 300, message
    assert any(message.startswith(f"⚠️ **{LABELS[f]}**") for f in fields), message

    assert app_server.run_folders() == before, "an invalid config created a run folder"
    shown = text + message + app_server.log_text(log_start)
    assert "Traceback" not in shown, shown
