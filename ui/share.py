"""Share panel: the whole configuration (seed included) as a page URL and as a JSON file.

A classroom link can hide chosen controls (`?hide=pos,norm`); the page applies the link on load
(see ui/train.py). Uploaded JSON is size-limited and validated like any other config. Every uploaded file,
whatever its name, is read and answered in the note under the button, as the Train tab's text upload does
(ui/textfile.py): loaded, or refused with the field by its label and "Nothing was loaded" (the controls keep
their values). The button names no file types: the browser would refuse another name (picture.png) with a
toast of its own before the app saw it, and the note would still speak of the previous file.
"""
from __future__ import annotations

import difflib

import json
import os
import tempfile
from functools import partial
from typing import Any, Optional

import gradio as gr

from lab.config import ConfigError, RunConfig, in_words
from lab.fields import shown
from lab.textdata import MAX_CHARS
from ui.common import PRIVATE, errors_as_messages, with_api_params
from ui.knobs import KNOB_KEYS, KNOBS, config_from_values, query_string, values_from_config

MAX_UPLOAD_BYTES = 64 * 1024  # the default; a server passes its own (LAB_MAX_UPLOAD_KB, lab/engine/limits.py)
TEXT_BYTES = 6 * MAX_CHARS + 2  # task.text as json.dumps writes it (\uXXXX a character), on top of the limit
LINK_JS = "(q) => q ? window.location.origin + window.location.pathname + '?' + q : ''"


def build_share_panel(widgets: dict[str, gr.components.Component], max_bytes: int = MAX_UPLOAD_BYTES) -> None:
    inputs = [widgets[k] for k in KNOB_KEYS]
    with gr.Accordion("Share this configuration", open=False):
        hide = gr.CheckboxGroup([(k.label, k.url_key) for k in KNOBS], label="Lock these controls in the link "
                                "(classroom)", info="Students who open the link see your values in these controls "
                                "but cannot change them.", elem_id="share-hide")
        link_btn = gr.Button("Make link", size="sm", elem_id="share-link-btn")
        query = gr.Textbox(visible=False)
        link = gr.Textbox(label="Link (copy it)", buttons=["copy"], elem_id="share-link", interactive=False)
        with gr.Row():
            json_btn = gr.Button("Download config JSON", size="sm")
            upload = gr.UploadButton("Load config JSON", size="sm", elem_id="config-upload")  # no file_types
        note = gr.Markdown("", elem_id="config-upload-note")
        json_file = gr.File(label="Config file", visible=False, interactive=False)

    names = [k.url_key for k in KNOBS]
    link_btn.click(with_api_params(make_query, names + ["hide"]), inputs=inputs + [hide], outputs=query,
                   api_name="share_query", preprocess=False).then(  # raw values: config_from_values names a bad field
        None, inputs=query, outputs=link, js=LINK_JS, api_name="share_link", api_visibility=PRIVATE)
    json_btn.click(with_api_params(download, names), inputs=inputs, outputs=json_file, api_name="download_config",
                   preprocess=False)
    # preprocess=False: gradio's own file-type check refused a .png with a message naming no field (and logged a
    # traceback); config_upload names the control and says what is allowed
    upload.upload(partial(load_config, widgets, note, max_bytes), inputs=upload, outputs=inputs + [note],
                  api_name="upload_config", preprocess=False, show_progress_on=[note])


@errors_as_messages
def make_query(*args: Any) -> str:
    """The share link's query for the knobs' values (KNOB_KEYS order) and the controls to lock."""
    *vals, hidden = args
    cfg = config_from_values(dict(zip(KNOB_KEYS, vals)))
    names = [k.url_key for k in KNOBS]
    hidden = [hidden] if isinstance(hidden, str) else list(hidden or ())
    bad = [h for h in hidden if h not in names]
    if bad:
        # the API's parameter and the url keys it takes, as the caller wrote them (not renamed to labels)
        close = difflib.get_close_matches(str(bad[0]), names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"hide: {bad[0]!r} is not a control{hint} (allowed: the {len(names)} controls' url keys, "
                         f"{', '.join(names[:10])}, ... {names[-1]})")
    return query_string(cfg, tuple(hidden))


@errors_as_messages
def download(*vals: Any) -> gr.File:
    """The knobs' configuration as a JSON file to download."""
    cfg = config_from_values(dict(zip(KNOB_KEYS, vals)))
    folder = tempfile.mkdtemp(prefix="lab-config-")
    path = os.path.join(folder, "transformer-lab-config.json")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(cfg.to_json())
    return gr.File(value=path, visible=True)


@errors_as_messages  # only the unexpected: a refused file is answered in the note
def load_config(widgets: dict[str, gr.components.Component], note: gr.Markdown, max_bytes: int, file: Any) -> dict:
    """The upload event: the note about this file and, when it loaded, every knob set from it (a refused
    file leaves the controls as they are)."""
    values, said = config_upload(file, max_bytes)
    return {note: said} | {widgets[k]: gr.update(value=v) for k, v in (values or {}).items()}


def config_upload(file: Any, max_bytes: int = MAX_UPLOAD_BYTES) -> tuple[Optional[dict[str, Any]], str]:
    """(the knobs' values by key from an uploaded config, or None when it is refused; the note under the button,
    about this file). `file` is what gradio sends with preprocess=False (a dict with `path` and `orig_name`) or a
    path."""
    path = file.get("path") if isinstance(file, dict) else file
    raw_name = (file.get("orig_name") if isinstance(file, dict) else None) or os.path.basename(str(path or ""))
    name = shown(raw_name)
    try:
        if path and not str(raw_name).lower().endswith(".json"):
            raise ConfigError("config file", "is not a JSON file (allowed: a .json file saved by this app)")
        cfg = read_config_file(path, max_bytes)
        values = values_from_config(cfg)
    except ConfigError as exc:
        label, why = in_words(exc)
        where = f" in {name}" if path else ""
        return None, (f"⚠️ **{label}**{where}: {' '.join(why.split()).rstrip('.')}. "
                      "Nothing was loaded: the controls keep their values.")
    m = cfg.model
    return values, (f"Loaded {name}: task {cfg.task.name}, {m.arch}, {m.n_layers} layers x {m.n_heads} heads, seed "
                    f"{cfg.train.seed}. The controls now hold its configuration; press Start to train it.")


def read_config_file(path: Optional[str], max_bytes: int = MAX_UPLOAD_BYTES) -> RunConfig:
    """An uploaded config JSON (at most `max_bytes`, UTF-8, besides the text of task text: up to
    TEXT_BYTES more), validated like any config."""
    if not path or not isinstance(path, str):
        raise ConfigError("config file", "no file was uploaded")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + TEXT_BYTES + 1)  # never more than the limits in memory
    except OSError as exc:
        raise ConfigError("config file", f"cannot be read ({exc.strerror})") from None
    too_big = ConfigError("config file", f"is {os.path.getsize(path):,} bytes (allowed: at most {max_bytes:,}, "
                          "besides the task's text)")
    if len(raw) > max_bytes + TEXT_BYTES:
        raise too_big
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("config file", "is not UTF-8 text (allowed: a JSON file saved by this app)") from None
    try:
        cfg = RunConfig.from_json(text)
    except RecursionError:
        raise ConfigError("config file", "is nested too deeply (allowed: a JSON file saved by this app)") from None
    if len(raw) - len(json.dumps(cfg.task.text)) > max_bytes:
        raise too_big
    return config_from_values(values_from_config(cfg), base=cfg)  # n_ctx re-derived like any UI config
