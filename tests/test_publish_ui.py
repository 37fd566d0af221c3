"""Compare's "Publish to a class board" (ui/compare/class_board.py): the launched app publishes the runs picked in
Compare to a local Trackio project (its own TRACKIO_DIR), read back through Trackio; a live run is skipped
with its reason; a bad project name is one line naming the field; a public server offers no such button."""
from __future__ import annotations

import pytest

from lab.engine.limits import Limits
from lab.engine.store import RunStore
from lab.engine.trackio_board import PublishReport
from tests.helpers import PUBLISHED as BASE, app_context, expected_points, launch_app, needs_trackio, read_back, \
    sort_key, trained_run
from ui.compare.class_board import publish_available, report_text

pytestmark = needs_trackio


def test_the_report_says_where_how_to_open_it_and_why_runs_were_skipped():
    report = PublishReport("class-2026", None, published=["a", "b"], already=["c"], skipped=[("d", "still running")])
    text = report_text(report)
    assert "Published **2** run(s) to project **class-2026** on the local Trackio board; 1 already there." in text
    assert "trackio show --project class-2026" in text and "- skipped d: still running" in text
    assert "the Space **me/board**" in report_text(PublishReport("p", "me/board", published=["a"]))


def test_a_public_server_offers_no_publish_button(tmp_path):
    with app_context(tmp_path / "public", limits=Limits.public_defaults()) as ctx:
        assert not publish_available(ctx)
    with app_context(tmp_path / "teacher") as ctx:
        assert publish_available(ctx)


@pytest.mark.app  # launches the app
def test_the_app_publishes_the_selection_and_it_reads_back(tmp_path):
    from gradio_client import Client

    store = RunStore(tmp_path / "runs")
    good = [trained_run(store, BASE)]
    live = store.create(BASE)  # queued: not publishable yet
    store.close()
    board = tmp_path / "trackio"
    with launch_app(tmp_path, {"TRACKIO_DIR": str(board), "LAB_TRACKIO_SPACE": ""}) as server:
        client = Client(server.url, verbose=False)
        with pytest.raises(Exception, match="Board project"):
            client.predict([good[0]], "no spaces please", api_name="/publish")
        text = client.predict([*good, live], "class-2026", api_name="/publish")
        assert "Published **1** run(s) to project **class-2026**" in text and f"skipped {live}: still queued" in text
        assert "Traceback" not in server.log_text()
    got = read_back("class-2026", board)
    assert len(got) == 1
    (name, run), = got.items()
    assert good[0] in name and sorted(run["logs"], key=sort_key) == sorted(
        expected_points(RunStore(tmp_path / "runs"), good[0]), key=sort_key)
