"""The app's public API lists what a user would call from a script, and nothing of the page's own wiring.

Gradio 6 lists every event listener whose api_visibility is "public" (the default) in the page's "Use via API"
view and in /gradio_api/info. A listener that only wires the page (clearing a note, refreshing a label or the
preset cards, a load hook, the action boxes and cell clicks of Inspect, a typed-input check) is
marked private (ui/common.py PRIVATE): a script could call it only to get a component update it has no use
for, and every such listing is one more name for a user to read past and for the app to keep stable.
"""
from __future__ import annotations

import json
import urllib.request

import pytest

from lab.teach.presets.catalog import PRESETS

pytestmark = pytest.mark.app

PUBLIC = {  # endpoint -> why a script calls it
    # Train
    "start": "trains a configuration (the knobs by name, as a share link spells them)",
    "start_new_seed": "trains the shown configuration again with a fresh seed",
    "start_gpu": "trains a configuration on the GPU where the server has one",
    "validate": "describes a configuration, or names the field that makes it invalid, without training",
    "poll": "a run's progress, curves and result",
    "show_run": "shows a stored run (its progress, curves and result)",
    "continue_run": "trains a finished run for more steps",
    "stop": "stops a run",
    "delete_ask": "says what deleting a run would remove, and whether this owner may",
    "delete": "deletes a run",
    "load": "the page's state on opening: the runs this browser remembers and the config a share link sets",
    # Share
    "share_query": "the share link's query for a configuration",
    "download_config": "a configuration as a JSON file",
    "upload_config": "a configuration JSON file read into the knobs (or the field it gets wrong)",
    # Grid
    "grid_preview": "how many runs a grid of config values makes, and how long they take",
    "grid_launch": "trains every combination of a grid of config values",
    # Presets
    **{f"preset_{key}": f"runs the {key} preset's experiment" for key in PRESETS},
    "preset_again": "runs the last preset again with fresh seeds",
    "preset_cards": "every preset card's estimate and last result",
    # Compare
    "compare": "the curves, final metrics and configs of chosen runs",
    "select_all": "the ids of the stored runs that pass Compare's filters",
    "export": "chosen runs' curves and metrics as files",
    "publish": "publishes chosen runs to the class's board",
    # Inspect
    "inspect_runs": "the runs Inspect can open",
    "snapshot_steps": "the steps at which a run kept its attention and weights",
    "attention": "a run's attention patterns on a probe",
    "attention_for_run": "a run's attention patterns on its sampled probe",
    "attention_view": "Inspect's attention figures for a run and probe, with their caption and notes",
    "positional_a": "a run's positional encoding figures (side A)",
    "positional_b": "a second run's positional encoding figures (side B)",
    "intervene": "a run's attention and metrics with heads, sublayers or the positional encoding knocked out",
    "importance": "how much knocking out each head raises the held-out loss",
    "answer": "the model's answer to a probe",
    "logit_lens": "what each layer's residual stream predicts for a probe",
    "generate": "what a decoder run writes after a prompt",
    # Learn
    "learn_text": "a lesson page's text",
    "learn_figure": "a lesson page's figure for a run and probe",
}

NEVER = {  # listeners of the page's own wiring, by kind: none of them may be listed
    "clear_start_note", "clear_continue_note", "delete_cancel", "knobs_changed", "task_lengths", "share_link",
    "upload_text", "grid_axis1_examples", "load_presets", "preset_poll", "preset_show", "preset_cards_poll",
    "preset_cards_done", "learn_runs", "learn_open", "learn_redraw", "learn_prev", "learn_next",
    "run_label", "check_typed_input", "inspect_run", "inspect_view", "inspect_typed_note",
    "action_run", "action_apply", "importance_cell", "intervene_view", "circuits_view", "circuits_cell",
}


def listed(url: str) -> set[str]:
    with urllib.request.urlopen(f"{url}/gradio_api/info", timeout=60) as resp:
        info = json.load(resp)
    return {name.lstrip("/") for name in info["named_endpoints"]}


def test_the_public_api_is_exactly_what_a_script_calls(app_server):
    names = listed(app_server.url)
    assert not names & NEVER, f"the page's own wiring is listed: {sorted(names & NEVER)}"
    assert names - set(PUBLIC) == set(), f"listed, not expected: {sorted(names - set(PUBLIC))}"
    assert set(PUBLIC) - names == set(), f"expected, not listed: {sorted(set(PUBLIC) - names)}"
