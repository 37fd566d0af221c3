"""The note under the Share panel's "Load config JSON" button speaks of the last upload, whatever its name: a
picture.png after a good config is read and refused in the note (the browser's own .json check used to refuse
it with a toast before the app saw it, and nothing said which file the controls came from), a refusal names
the field by its label and says nothing was loaded (every control keeps its value), and a good file after a
bad one replaces the error with what was loaded.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import gradio as gr
import pytest

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from ui.knobs import KNOB_KEYS, values_from_config
from ui.share import MAX_UPLOAD_BYTES, load_config

REFUSED = "Nothing was loaded: the controls keep their values."
GOOD = RunConfig(model=ModelConfig(n_layers=3, n_heads=2, d_model=32, d_ff=64), task=TaskConfig(name="sort"),
                 train=TrainConfig(seed=7))
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64)


def files(folder: Path) -> dict[str, Path]:
    out = {"good.json": GOOD.to_json().encode(), "picture.png": PNG, "broken.json": b'{"model": {"d_model": 64',
           "bad-combo.json": b'{"model": {"d_model": 30, "n_heads": 4}}',
           "latin1.json": '{"name": "caf\xe9"}'.encode("latin-1"),
           "seed9.json": replace(GOOD, train=replace(GOOD.train, seed=9)).to_json().encode(), "empty.json": b""}
    for name, data in out.items():
        (folder / name).write_bytes(data)
    return {name: folder / name for name in out}


def load(file: Any, max_bytes: int = MAX_UPLOAD_BYTES) -> tuple[Optional[dict[str, Any]], str]:
    """What the upload event (ui.share.load_config) answers: the value it sets each knob to, by key (None when
    it sets none: every control keeps its value), and the note."""
    with gr.Blocks():
        widgets = {k: gr.Textbox() for k in KNOB_KEYS}
        note = gr.Markdown()
    out = load_config(widgets, note, max_bytes, file)
    knobs = {k: out[w]["value"] for k, w in widgets.items() if w in out}
    assert len(knobs) in (0, len(KNOB_KEYS)), knobs  # every knob or none
    return knobs or None, out[note]


def upload(path: Path, name: str | None = None) -> tuple[Optional[dict[str, Any]], str]:
    return load({"path": str(path), "orig_name": name or path.name})


def test_each_uploads_note_is_about_that_upload_whatever_its_name(tmp_path):
    paths = files(tmp_path)
    knobs, note = upload(paths["good.json"])
    assert note == ("Loaded 'good.json': task sort, decoder, 3 layers x 2 heads, seed 7. The controls now hold its "
                    "configuration; press Start to train it.")
    assert knobs == values_from_config(GOOD)
    expected = {  # the note's start for each refused file: the field by its label, the file by its name
        "picture.png": "⚠️ **config file** in 'picture.png': is not a JSON file (allowed: a .json file saved by "
                       "this app)",
        "broken.json": "⚠️ **config** in 'broken.json': is not valid JSON",
        "bad-combo.json": "⚠️ **d_model** in 'bad-combo.json': 30 is not divisible by Heads = 4",
        "latin1.json": "⚠️ **config file** in 'latin1.json': is not UTF-8 text",
        "empty.json": "⚠️ **config** in 'empty.json': is not valid JSON",
    }
    for name, start in expected.items():
        knobs, note = upload(paths[name])
        assert knobs is None, name  # every control keeps its value
        assert note.startswith(start) and note.endswith(REFUSED), note
        assert ".." not in note and "\n" not in note and "good.json" not in note
    assert upload(paths["seed9.json"])[1].startswith("Loaded 'seed9.json': task sort, decoder, 3 layers x 2 heads, "
                                                     "seed 9.")
    # a .json file by a name that is not: refused for its name before it is read
    assert upload(paths["good.json"], "config.txt")[1].startswith("⚠️ **config file** in 'config.txt': is not a "
                                                                  "JSON")


def test_no_file_and_an_oversized_file_are_refused_in_the_note(tmp_path):
    knobs, note = load(None)
    assert note == f"⚠️ **config file**: no file was uploaded. {REFUSED}"
    big = tmp_path / "big.json"
    big.write_bytes(b"{" + b" " * 2000 + b"}")
    knobs, note = load(str(big), max_bytes=1000)
    assert note.startswith("⚠️ **config file** in 'big.json': is 2,002 bytes (allowed: at most 1,000") and \
        note.endswith(REFUSED)


@pytest.mark.browser
def test_the_note_follows_each_upload_in_chromium(app_server, tmp_path):
    from playwright.sync_api import expect

    from tests.browser import assert_no_errors, chromium, open_page

    paths = files(tmp_path)
    with chromium() as browser:
        page = open_page(browser, app_server.url)
        page.get_by_text("Share this configuration").click()
        note, seed = page.locator("#config-upload-note"), page.locator("#seed input")
        for name, says, seed_after in (("good.json", "Loaded 'good.json'", "7"),
                                       ("picture.png", "'picture.png': is not a JSON file", "7"),
                                       ("broken.json", "'broken.json': is not valid JSON", "7"),
                                       ("seed9.json", "Loaded 'seed9.json'", "9")):
            with page.expect_file_chooser() as chooser:
                page.locator("#config-upload").click()
            chooser.value.set_files(str(paths[name]))
            expect(note).to_contain_text(says)
            for other in paths:
                if other != name:
                    expect(note).not_to_contain_text(f"'{other}'")  # nothing of an earlier upload
            expect(seed).to_have_value(seed_after)  # a refused file leaves the controls as they were
        assert page.locator("#task input").input_value() == "sort"
        assert_no_errors(page)  # no toast of the browser's own file-type check either
