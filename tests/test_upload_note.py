"""The note under the Train tab's text upload speaks of the last upload, whatever its name: a picture.png
after a good file is read and refused in the note (the browser's own file-type check used to refuse it with a
toast before the app saw it, and the note kept the previous file's "Loaded ..." or its error), and a good file
after a bad one replaces the error.
"""
from __future__ import annotations

from pathlib import Path

import gradio as gr
import pytest

from ui.textfile import load_text_file

LABEL = "Your text"
POEM = "The sea is calm tonight, the tide is full, the moon lies fair upon the straits. " * 4
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(500)  # a PNG's length fields hold NUL bytes


def files(folder: Path) -> dict[str, Path]:
    out = {"poem.txt": POEM.encode("utf-8"), "picture.png": PNG, "notes.md": ("# Notes\n" + POEM).encode("utf-8"),
           "empty.txt": b""}
    for name, data in out.items():
        (folder / name).write_bytes(data)
    return {name: folder / name for name in out}


def test_each_uploads_note_is_about_that_upload_whatever_its_name(tmp_path):
    paths = files(tmp_path)
    notes = {name: load_text_file({"path": str(p), "orig_name": name}) for name, p in paths.items()}
    box, note = notes["picture.png"]
    assert isinstance(box, type(gr.skip()))  # the box keeps its text
    assert note.startswith(f"⚠️ **{LABEL}**: the file 'picture.png' is binary"), note
    assert note.endswith("Nothing was loaded: the box keeps its text.") and ".." not in note
    assert notes["empty.txt"][1].startswith(f"⚠️ **{LABEL}**: the file 'empty.txt' is empty"), notes["empty.txt"]
    assert notes["notes.md"][0].startswith("# Notes") and notes["notes.md"][1].startswith("Loaded 'notes.md'")
    assert notes["poem.txt"][1].startswith("Loaded 'poem.txt'")


@pytest.mark.browser
def test_the_note_follows_each_upload_in_chromium(app_server, tmp_path):
    from playwright.sync_api import expect

    from tests.browser import assert_no_errors, choose, chromium, open_page

    paths = files(tmp_path)
    with chromium() as browser:
        page = open_page(browser, app_server.url)
        choose(page, "#task", "text")
        box, note = page.locator("#text textarea"), page.locator("#text-upload-note")
        for name, says in (("poem.txt", "Loaded 'poem.txt'"), ("picture.png", "the file 'picture.png' is binary"),
                           ("empty.txt", "the file 'empty.txt' is empty"), ("notes.md", "Loaded 'notes.md'")):
            with page.expect_file_chooser() as chooser:
                page.locator("#text-upload").click()
            chooser.value.set_files(str(paths[name]))
            expect(note).to_contain_text(says)
            for other in paths:
                if other != name:
                    expect(note).not_to_contain_text(f"'{other}'")  # nothing of an earlier upload
            if name in ("picture.png", "empty.txt"):
                assert box.input_value() == POEM  # the box kept the poem
        assert box.input_value().startswith("# Notes")
        assert_no_errors(page)  # no toast of the browser's own file-type check either
