"""Your text from a file: the Train tab's upload button under the "Your text" box (task text).

A file is read, checked and put in the box, or refused with one line that names the box by its label and
says what is allowed: binary files (NUL bytes), files over the size limit, empty files and text that is
not UTF-8, whatever its name. A refused file changes nothing: the box keeps its text and nothing is stored
(a run is stored only when Start is pressed, with the text the box then holds, validated again by the
config). Each upload's note is about that upload.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import gradio as gr

from lab.config import ConfigError, in_words
from lab.fields import shown
from lab.textdata import MAX_CHARS, MIN_CHARS, check_text, training_unigram_entropy, vocabulary
from ui.common import PRIVATE
from ui.knobs import BY_KEY

FIELD = "task.text"
MAX_BYTES = 4 * MAX_CHARS + 3  # UTF-8 takes at most 4 bytes a character; + a byte-order mark
FILE_ALLOWED = f"a UTF-8 text file of {MIN_CHARS:,} to {MAX_CHARS:,} characters"


def read_text_file(path: Optional[str], name: Optional[str] = None) -> str:
    """The text of an uploaded file, line ends made '\\n'; ConfigError naming task.text (the app says
    "Your text") for no file, an unreadable, empty, binary, oversized or non-UTF-8 file, or a text the
    task refuses (too short, control characters, too many distinct characters)."""
    if not path or not isinstance(path, str):
        raise ConfigError(FIELD, "no file was uploaded")
    what = shown(name or os.path.basename(path))
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)  # never more than the limit in memory
    except OSError as exc:
        raise ConfigError(FIELD, f"the file {what} cannot be read ({exc.strerror})") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(FIELD, f"the file {what} is {size:,} bytes (allowed: at most {MAX_BYTES:,} bytes, "
                                 f"{MAX_CHARS:,} characters)")
    if not raw.strip():
        raise ConfigError(FIELD, f"the file {what} is empty (allowed: {FILE_ALLOWED})")
    if b"\x00" in raw:
        raise ConfigError(FIELD, f"the file {what} is binary: it contains NUL bytes (allowed: {FILE_ALLOWED}; "
                                 "a UTF-16 text file must be saved as UTF-8 first)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(FIELD, f"the file {what} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                                 f"{exc.start:,}) (allowed: {FILE_ALLOWED})") from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # Windows and old Mac line ends
    try:
        check_text(text, FIELD)
    except ConfigError as exc:
        raise ConfigError(FIELD, f"the file {what} {str(exc).split(': ', 1)[1]}") from None
    return text


def load_text_file(file: Any) -> tuple[Any, str]:
    """The upload event: (the box's new value, or gr.skip() to keep it; the note under the button).
    `file` is what gradio sends with preprocess=False (a dict with `path` and `orig_name`) or a path."""
    path = file.get("path") if isinstance(file, dict) else file
    name = file.get("orig_name") if isinstance(file, dict) else None
    try:
        text = read_text_file(path, name)
    except ConfigError as exc:
        label, why = in_words(exc)
        why = " ".join(why.split()).rstrip(".")
        return gr.skip(), f"⚠️ **{label}**: {why}. Nothing was loaded: the box keeps its text."
    return text, (f"Loaded {shown(name or os.path.basename(str(path)))}: {len(text):,} characters, "
                  f"{len(vocabulary(text))} distinct; unigram baseline {training_unigram_entropy(text):.2f} nats a "
                  "character (the entropy of its training 90%'s characters: the loss of a model that ignores "
                  "context, in the loss curves' unit).")


def build_text_upload(widgets: dict[str, gr.components.Component]) -> list[gr.components.Component]:
    """The upload button and its note, right under the text box (call it just after the task's knobs).
    Returns what is shown only while Task is text: the box, the button and the note (the Train tab's one
    knob event sets their visibility with `text_box_shown`)."""
    box = widgets[FIELD]
    visible = bool(getattr(box, "visible", True))
    # no file_types: the browser would refuse another name (picture.png) with a toast of its own before this
    # handler runs, and the note would still speak of the previous file; every file is read and answered here
    upload = gr.UploadButton("Load a text file", size="sm", visible=visible, elem_id="text-upload")
    note = gr.Markdown("", visible=visible, elem_id="text-upload-note")
    # preprocess=False: gradio's own file-type check would refuse a file with a message naming no field
    upload.upload(load_text_file, inputs=upload, outputs=[box, note], api_name="upload_text", preprocess=False,
                  show_progress_on=[note], api_visibility=PRIVATE)
    return [box, upload, note]


def text_box_shown(task: Any) -> list[dict[str, Any]]:
    """Updates of the text box, its upload button and its note when `task` is chosen: shown for the text task only."""
    wanted = (BY_KEY[FIELD].when or ("task.name", "text"))[1]
    return [gr.update(visible=task == wanted)] * 3
