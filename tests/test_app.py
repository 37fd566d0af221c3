"""The app builds without launching, names every event explicitly, and turns every invalid knob
combination into a one-line message that names the field (in-process: no server needed).

The same combinations go through a launched server in test_app_client.py.
"""
from __future__ import annotations

import inspect
import re
import threading
from typing import Any

import gradio as gr
import pytest
from gradio.blocks import BlocksConfig

import app
from lab.engine.jobs import JobManager
from lab.engine.store import RunStore
from ui.knobs import KNOBS
from ui.train import validate
from tests.helpers import INVALID, INVALID_IDS, LABELS

# Invalid knob combinations (API parameter names, as the /start and /validate endpoints take them)
# and the config fields an error message may name for each.
AUTO_NAMES = re.compile(r"^(lambda|unnamed|js_fn|false|fn_?\d+|.*_\d+)$")
ENDPOINTS = ("start", "poll", "stop", "validate", "show_run", "select_all", "compare",
             "export", "inspect_runs", "snapshot_steps", "attention_for_run", "attention", "positional_a",
             "positional_b", "load", "share_query", "download_config", "upload_config")


def knob_args(**overrides: Any) -> list[Any]:
    """Every knob's value in widget order: the defaults, with `overrides` by API name."""
    return [overrides.get(k.url_key, k.default()) for k in KNOBS]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    store = RunStore(tmp_path_factory.mktemp("app") / "runs")
    jobs = JobManager(store, max_concurrent=1)
    before = set(threading.enumerate())  # another module's job threads may still be ending in this process
    demo = app.build_demo(store, jobs)
    demo.threads_before = before
    yield demo
    jobs.shutdown(wait=True)


def test_build_demo_builds_without_launching(demo):
    assert isinstance(demo, gr.Blocks)
    assert not demo.is_running and getattr(demo, "server", None) is None
    assert not demo.lab_context.store.root.exists()  # building writes nothing to the store
    assert not [t for t in set(threading.enumerate()) - demo.threads_before
                if t.name.startswith("lab-job-")]  # and trains nothing


def test_every_event_has_an_explicit_unique_api_name(tmp_path, monkeypatch):
    passed: list[tuple[str, Any]] = []  # (function name, api_name as the app passed it)
    original = BlocksConfig.set_event_trigger
    signature = inspect.signature(original)

    def recording(self, *args: Any, **kwargs: Any):
        bound = signature.bind(self, *args, **kwargs)
        fn = bound.arguments.get("fn")
        passed.append((getattr(fn, "__name__", repr(fn)), bound.arguments.get("api_name")))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BlocksConfig, "set_event_trigger", recording)
    store = RunStore(tmp_path / "runs")
    demo = app.build_demo(store, JobManager(store, max_concurrent=1))

    assert len(passed) == len(demo.fns) > 0
    implicit = [name for name, api_name in passed if not (isinstance(api_name, str) and api_name.strip())]
    assert not implicit, f"events without an explicit api_name: {implicit}"
    names = [fn.api_name for fn in demo.fns.values()]
    assert len(names) == len(set(names)), f"duplicate api_names: {sorted(names)}"
    assert [n for n, (_, given) in zip(names, passed) if n != given] == []  # none renamed by Gradio
    auto = [n for n in names if AUTO_NAMES.match(n)]
    assert not auto, f"auto-looking api_names: {auto}"


def test_the_api_lists_the_endpoints_clients_use(demo):
    named = demo.get_api_info()["named_endpoints"]
    missing = [e for e in ENDPOINTS if f"/{e}" not in named]
    assert not missing, f"missing endpoints: {missing}"
    start = [p["parameter_name"] for p in named["/start"]["parameters"]]
    assert start == [k.url_key for k in KNOBS] + ["my_runs", "owner", "own_seed"]  # gr.BrowserState shows, gr.State would not


def test_defaults_validate_to_a_description(demo):
    text = validate(*knob_args())
    assert not text.startswith("⚠️") and "parameters" in text


@pytest.mark.parametrize(("case", "fields"), INVALID, ids=INVALID_IDS)
def test_invalid_knobs_give_one_line_naming_the_field(demo, case, fields):
    """The summary and a refused Start name the knob by its label (as the widget shows it), not by its
    config key, in one line; Start answers in its note and changes nothing else on the page."""
    text = validate(*knob_args(**case))
    assert text.startswith("⚠️") and "\n" not in text and "Traceback" not in text, text
    assert any(f"**{LABELS[f]}**" in text for f in fields), text
    assert not any(f in text for f in fields), text  # no config keys ("model.d_model") left

    start = next(fn for fn in demo.fns.values() if fn.api_name == "start").fn
    *others, message = start(*knob_args(**case), [], "u1", False)
    assert all(isinstance(o, type(gr.skip())) for o in others), others  # the page stays as it was
    assert message.startswith("⚠️") and "\n" not in message and "Traceback" not in message, message
    assert any(message.startswith(f"⚠️ **{LABELS[f]}**") for f in fields), message
    root = demo.lab_context.store.root
    assert not root.exists() or not any(root.iterdir()), "an invalid config created a run folder"


def test_every_child_of_the_tab_bar_is_a_tab(demo):
    """A component made directly under gr.Tabs (a gr.State, a timer) is taken for a tab: the headers after
    it show the wrong labels (clicking Compare relabelled Inspect "Compare", and the browser tests timed out)."""
    tabs = next(b for b in demo.blocks.values() if isinstance(b, gr.Tabs) and b.elem_id == "tabs")
    kinds = [type(child).__name__ for child in tabs.children]
    assert kinds and all(k == "Tab" for k in kinds), kinds
