"""The app's events are wired so that none can re-run another for ever.

Gradio (6.x, in the browser) runs an `always_last` event that was triggered again while it ran once more
when it ends, and does so by dispatching the first trigger's event again to *every* listener of that
event. Two such listeners on one control re-run each other as long as their runs overlap: on a busy
server the Inspect page re-drew the same run for minutes (tests/test_browser_views.py saw it). The rule
that prevents it: each control's event has at most one `always_last` listener that runs on the server.
Listeners that only run in the browser (js, no server function) are never deferred and do not count.
"""
from __future__ import annotations

from collections import defaultdict

import pytest

CHAINED = {"then", "success", "failure"}  # run by the event before them, never re-dispatched by name


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    import app
    from lab.engine.jobs import JobManager
    from lab.engine.store import RunStore

    store = RunStore(tmp_path_factory.mktemp("wiring") / "runs")
    jobs = JobManager(store, max_concurrent=1)
    try:
        yield app.build_demo(store, jobs).get_config_file()
    finally:
        jobs.shutdown(wait=True)


def listeners(config: dict) -> dict[tuple[int, str], list[dict]]:
    """The server-side `always_last` dependencies of each (component id, event) of the page."""
    out: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for dep in config["dependencies"]:
        for target, event in dep["targets"]:
            if event not in CHAINED and dep["backend_fn"] and dep.get("trigger_mode") == "always_last":
                out[(target, event)].append(dep)
    return out


def test_no_event_has_two_always_last_listeners_on_the_server(config):
    names = {c["id"]: c.get("props", {}).get("elem_id") or c.get("props", {}).get("label") for c in config["components"]}
    crowded = {f"{names.get(t, t)}.{event}": [d["api_name"] for d in deps]
               for (t, event), deps in listeners(config).items() if len(deps) > 1}
    assert crowded == {}


def test_the_rule_sees_the_controls_that_redraw_views(config):
    """The check reads the real wiring: the knobs, the grid's axes and Inspect's controls each have their one
    listener, the event that answers them."""
    ids = {c.get("props", {}).get("elem_id"): c["id"] for c in config["components"]}
    found = listeners(config)
    assert [d["api_name"] for d in found[(ids["task"], "change")]] == ["knobs_changed"]
    assert [d["api_name"] for d in found[(ids["grid-axis-1"], "change")]] == ["knobs_changed"]
    assert [d["api_name"] for d in found[(ids["inspect-action"], "change")]] == ["inspect_view"]
    assert found[(ids["inspect-run"], "change")] == []  # the run picker only writes the action, in the browser
