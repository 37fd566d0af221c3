"""The `text` task: a character-level language model of the user's text or the built-in one (lab/textdata.py).

What is checked: the built-in text is written by the project, the same on every call; a trained model beats
the text's unigram entropy (slow); bad texts and bad uploads are refused naming the field by its label, and
nothing is stored; a run's text goes through config.json and rebuilds the same vocabulary and batches;
training and held-out windows come from their own parts of the text; configs are shown in short form.
"""
from __future__ import annotations

import math
import time
from collections import Counter

import gradio as gr
import pytest
import torch

from lab.config import ConfigError, ModelConfig, RunConfig, TaskConfig, TrainConfig, flatten, in_words
from lab.engine.jobs import JobManager
from lab.engine.store import RunStore
from lab.tasks.batches import IGNORE_INDEX, eval_batches, get_task, probe
from lab.textdata import (MAX_CHARS, MAX_DISTINCT, MIN_CHARS, builtin_text, char_label, split_at,
                          unigram_entropy_nats, vocabulary)
from ui.knobs import config_from_values, query_string
from ui.textfile import MAX_BYTES, load_text_file, read_text_file
from tests.helpers import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")  # torch at one intra-op thread (tests/conftest.py)

LABEL = "Your text"
USER_TEXT = ("Roses are red,\nviolets are blue;\tsugar is sweet, and so are you.\n" * 6)  # 6 lines x 68 chars
TEXT = tiny_config(task="text", min_len=8, max_len=16, text=USER_TEXT, n_ctx=16, steps=3, batch_size=4, eval_every=3,
                   eval_samples=8, snapshots=1)


def refused_label(exc: ConfigError) -> str:
    return in_words(exc)[0]


# ---- the built-in text and its entropy ----------------------------------------------------------
def test_builtin_text_is_the_projects_own_and_repeatable():
    text = builtin_text()
    assert text == builtin_text.__wrapped__()  # made again from the seed, not only cached
    assert 20_000 <= len(text) <= 50_000
    TaskConfig(name="text", text=text)  # a valid text for the task, as the user's would be
    assert text.endswith("\n") and all(line[:1].isupper() for line in text.splitlines())
    sentences = [s for s in text.replace("!", ".").split(".") if s.strip()]
    assert len(sentences) > 300 and len(set(sentences)) > 0.9 * len(sentences)  # varied, not a loop


def test_unigram_entropy_against_a_hand_computation():
    text = "aab"  # p = 2/3, 1/3
    hand = -(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3)
    assert unigram_entropy_nats(text) == pytest.approx(hand)
    assert unigram_entropy_nats("abcd" * 10) == pytest.approx(math.log(4))  # four equally likely characters
    big = builtin_text()
    counts = Counter(big)
    probs = torch.tensor([c / len(big) for c in counts.values()], dtype=torch.float64)
    assert unigram_entropy_nats(big) == pytest.approx(float(-(probs * probs.log()).sum()))
    assert 0 < unigram_entropy_nats(big) < math.log(len(counts))  # below uniform: letters are not equally likely


@pytest.mark.science
def test_two_layer_model_beats_the_unigram_entropy_of_the_builtin_text():
    """1,000 steps of a 2-layer, d_model 64 model on the built-in text: its held-out loss (nats per
    character) is far below the unigram entropy, the best a model that ignores the context can do."""
    from lab.trainer import train

    cfg = RunConfig(task=TaskConfig(name="text", min_len=32, max_len=32),
                    model=ModelConfig(n_layers=2, n_heads=4, d_model=64, d_ff=256, n_ctx=32),
                    train=TrainConfig(steps=1000, batch_size=16, lr=3e-3, warmup=100, eval_every=500,
                                      eval_samples=256, snapshots=0, seed=0))
    entropy = unigram_entropy_nats(builtin_text())
    t0 = time.perf_counter()
    result = train(cfg, threads=1)
    loss = result.final_eval.loss
    print(f"held-out loss {loss:.3f} nats, unigram entropy {entropy:.3f} nats, {time.perf_counter() - t0:.1f} s")
    assert result.steps_done == 1000
    assert 2.5 < entropy < 3.5  # English-like letters: about 3.0 nats
    assert loss < 0.6 * entropy, (loss, entropy)


# ---- validation: refused texts name the field by its label, and nothing is stored ---------------
BAD_TEXTS = {
    "binary": "ab\x00cd" * 100,
    "too large": "ab " * (MAX_CHARS // 3 + 1),
    "too short": "a tiny text",
    "carriage return": "line\r" * 100,
    "too many distinct": "".join(chr(0x4E00 + i) for i in range(MAX_DISTINCT + 1)) * 2,
}


@pytest.mark.parametrize("kind", BAD_TEXTS)
def test_bad_texts_are_refused_by_the_config(kind):
    with pytest.raises(ConfigError) as err:
        TaskConfig(name="text", text=BAD_TEXTS[kind])
    assert err.value.field == "task.text" and refused_label(err.value) == LABEL
    assert "allowed" in str(err.value) and len(str(err.value)) < 400  # the text is not echoed back


@pytest.fixture
def demo(tmp_path):
    import app

    store = RunStore(tmp_path / "runs")
    jobs = JobManager(store, max_concurrent=1)
    yield app.build_demo(store, jobs)
    jobs.shutdown(wait=True)


@pytest.mark.parametrize("kind", BAD_TEXTS)
def test_start_refuses_a_bad_text_and_stores_nothing(demo, kind):
    """The Train tab's Start (the /start endpoint) answers beside the button, naming "Your text"."""
    from ui.knobs import KNOBS

    values = {"task": "text", "min_len": 8, "max_len": 16, "text": BAD_TEXTS[kind]}
    start = next(fn for fn in demo.fns.values() if fn.api_name == "start").fn
    *others, message = start(*[values.get(k.url_key, k.default()) for k in KNOBS], [], "u1", False)
    assert all(isinstance(o, type(gr.skip())) for o in others)
    assert message.startswith(f"⚠️ **{LABEL}**") and "\n" not in message, message
    root = demo.lab_context.store.root
    assert not root.exists() or not any(root.iterdir()), "a refused text created a run folder"


# ---- a run's text goes through config.json and rebuilds the same task ---------------------------
@pytest.mark.app
def test_user_text_round_trips_through_config_json_and_rebuilds_the_task(tmp_path):
    cfg = tiny_config(TEXT)
    back = RunConfig.from_json(cfg.to_json())
    assert back == cfg and back.task.text == USER_TEXT

    store = RunStore(tmp_path / "runs")
    jobs = JobManager(store, max_concurrent=1)
    try:
        run_id = jobs.submit(cfg)
        assert jobs.wait(run_id, timeout=120).state == "completed"
    finally:
        jobs.shutdown(wait=True)
    stored = store.config(run_id)  # read back from the run's config.json
    assert stored.task.text == USER_TEXT and stored == cfg
    task = get_task("text")
    assert vocabulary(stored.task.text) == vocabulary(USER_TEXT) == tuple(sorted(set(USER_TEXT)))
    assert task.vocab_size(stored.task) == len(set(USER_TEXT))
    a = task.batch(stored.task, "decoder", 8, torch.Generator().manual_seed(3))
    b = task.batch(cfg.task, "decoder", 8, torch.Generator().manual_seed(3))
    assert torch.equal(a.inp, b.inp) and torch.equal(a.tgt, b.tgt)
    for x, y in zip(eval_batches(stored.task, "decoder", "eval", 20), eval_batches(cfg.task, "decoder", "eval", 20)):
        assert torch.equal(x.inp, y.inp) and torch.equal(x.tgt, y.tgt)
    assert store.load_weights(run_id)["tok_emb.weight"].shape[0] == len(set(USER_TEXT))


# ---- batches: windows of their own part, every position scored -----------------------------------
@pytest.mark.parametrize("text", ["", USER_TEXT], ids=["builtin", "user"])
def test_windows_come_from_their_part_of_the_text(text):
    cfg = tiny_config(TEXT, text=text).task
    task, full = get_task("text"), text or builtin_text()
    cut = split_at(full)
    train_part, held_part = full[:cut], full[cut:]
    assert len(held_part) == max(1, int(len(full) * 0.1))
    for split, part in (("train", train_part), ("eval", held_part)):
        b = task.batch(cfg, "decoder", 16, torch.Generator().manual_seed(0), split=split)
        assert b.src is None and (b.tgt != IGNORE_INDEX).all()  # every position scored
        assert torch.equal(b.inp[:, 1:], b.tgt[:, :-1])  # next-character targets
        for inp, tgt in zip(b.inp.tolist(), b.tgt.tolist()):
            window = task.decode(cfg, inp + tgt[-1:])
            assert window in part, (split, window)
    lengths = {b.inp.shape[1] + 1 for b in eval_batches(cfg, "decoder", "eval", 64)}
    assert lengths == set(range(cfg.min_len, cfg.max_len + 1)) and task.lengths(cfg, "ood") == []
    p = probe(cfg, "decoder")
    assert p.inp.shape == (1, cfg.max_len - 1) and torch.equal(p.inp, probe(cfg, "decoder").inp)
    assert task.decode(cfg, p.inp[0].tolist() + p.tgt[0, -1:].tolist()) in held_part


def test_labels_and_typed_prompts():
    cfg, task = tiny_config(TEXT).task, get_task("text")
    labels = [task.label(cfg, t) for t in range(task.vocab_size(cfg))]
    assert "␣" in labels and "⏎" in labels and "⇥" in labels and " " not in labels and "\n" not in labels
    assert [char_label(c) for c in " \n\ta"] == ["␣", "⏎", "⇥", "a"]
    ids = task.encode_prompt(cfg, "Roses are\n")
    assert task.decode(cfg, ids) == "Roses are\n" and all(0 <= i < task.vocab_size(cfg) for i in ids)
    with pytest.raises(ConfigError) as err:
        task.encode_prompt(cfg, "Roses are Z")
    assert err.value.field == "probe" and "'Z'" in str(err.value)
    assert get_task("reverse").encode_prompt(tiny_config(TEXT).task, "1 2") is None  # symbols, split by the caller


def test_layout_limits_are_checked():
    for arch in ("encoder-decoder",):
        with pytest.raises(ConfigError) as err:
            RunConfig(task=TaskConfig(name="text", min_len=8, max_len=16), model=ModelConfig(arch=arch))
        assert err.value.field == "task.name"
    with pytest.raises(ConfigError) as err:
        tiny_config(TEXT, min_len=1)
    assert err.value.field == "task.min_len"
    held = len(USER_TEXT) - split_at(USER_TEXT)
    with pytest.raises(ConfigError) as err:  # a window must fit in the held-out tenth
        tiny_config(TEXT, max_len=held + 1, min_len=2)
    assert err.value.field == "task.max_len" and f"{held} characters" in str(err.value)


# ---- what the app shows: short forms, the box only for task text, links --------------------------
def test_configs_are_shown_with_a_short_form_of_the_text():
    cfg = tiny_config(TEXT, text="word " * 20_000)
    flat = flatten(cfg)["task.text"]
    assert len(flat) < 60 and "100,000 chars" in flat and flat.startswith("word word")
    other = tiny_config(TEXT, text="word " * 19_999 + "word!")
    assert flatten(other)["task.text"] != flat  # another text, another hash
    assert flatten(RunConfig())["task.text"] == ""


def test_the_text_box_counts_only_for_task_text():
    values = {"task.name": "reverse", "task.text": USER_TEXT}
    assert config_from_values(values).task.text == ""  # hidden box: nothing travels with a reverse run
    values = {"task.name": "text", "task.text": USER_TEXT, "task.min_len": 4, "task.max_len": 16}
    cfg = config_from_values(values)
    assert cfg.task.text == USER_TEXT and cfg.model.n_ctx >= 15
    assert config_from_values({**values, "task.text": None}).task.text == ""  # empty box: the built-in text


def test_share_links_carry_a_short_text_and_refuse_a_long_one():
    from urllib.parse import parse_qs

    query = query_string(tiny_config(TEXT))
    assert parse_qs(query)["text"] == [USER_TEXT]
    with pytest.raises(ConfigError) as err:
        query_string(tiny_config(TEXT, text="word " * 5_000))
    assert refused_label(err.value) == LABEL and "Download config JSON" in str(err.value)


# ---- the upload button's handler, with real files -------------------------------------------------
BAD_FILES = {
    "empty.txt": b"",
    "blank.txt": b" \n\n ",
    "binary.txt": b"PK\x03\x04" + bytes(range(256)) * 4,
    "utf16.txt": "hello world, a text in UTF-16\n".encode("utf-16") * 20,
    "latin1.txt": ("caf\xe9 au lait, " * 30).encode("latin-1"),
    "huge.txt": b"a" * (MAX_BYTES + 1),
    "short.txt": b"too short",
    "many.txt": "".join(chr(0x4E00 + i) for i in range(MAX_DISTINCT + 1)).encode("utf-8"),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_upload_refuses_bad_files(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(BAD_FILES[name])
    with pytest.raises(ConfigError) as err:
        read_text_file(str(path), name)
    assert refused_label(err.value) == LABEL and name in str(err.value) and "allowed" in str(err.value)
    box, note = load_text_file({"path": str(path), "orig_name": name})
    assert isinstance(box, type(gr.skip()))  # the box keeps its text
    assert note.startswith(f"⚠️ **{LABEL}**") and "\n" not in note and len(note) < 400, note
    if name == "huge.txt":
        assert f"{MAX_BYTES + 1:,} bytes" in note and f"{MAX_CHARS:,} characters" in note


def test_upload_fills_the_box_with_a_good_file(tmp_path):
    path = tmp_path / "poem.txt"
    path.write_bytes(b"\xef\xbb\xbf" + USER_TEXT.replace("\n", "\r\n").encode("utf-8"))  # BOM, Windows line ends
    box, note = load_text_file({"path": str(path), "orig_name": "poem.txt"})
    assert box == USER_TEXT  # line ends made '\n', the byte-order mark dropped
    assert note.startswith("Loaded 'poem.txt'") and f"{len(USER_TEXT):,} characters" in note
    assert load_text_file(None)[1].startswith(f"⚠️ **{LABEL}**")
    assert len(USER_TEXT) >= MIN_CHARS


def test_a_config_file_with_a_long_text_loads_within_the_upload_limit(tmp_path):
    """A config JSON saved with a 100,000-character text loads although the file is larger than the
    server's config upload limit (64 KB by default): the limit bounds the rest of the file."""
    from ui.share import MAX_UPLOAD_BYTES, read_config_file

    for text in ("word " * (MAX_CHARS // 5), ("é, " * (MAX_CHARS // 3))[:MAX_CHARS]):
        cfg = tiny_config(TEXT, text=text)
        path = tmp_path / "config.json"
        path.write_text(cfg.to_json(), encoding="utf-8")
        assert path.stat().st_size > MAX_UPLOAD_BYTES
        assert read_config_file(str(path), MAX_UPLOAD_BYTES).task == cfg.task  # (n_ctx is re-derived)
    path.write_bytes(b"{" + b" " * (MAX_UPLOAD_BYTES + 1) + b"}")  # padding is not a text
    with pytest.raises(ConfigError) as err:
        read_config_file(str(path), MAX_UPLOAD_BYTES)
    assert err.value.field == "config file"


def test_cli_show_prints_the_text_short(tmp_path, capsys):
    import lab.cli.main as cli

    store = RunStore(tmp_path / "runs")
    run_id = store.create(tiny_config(TEXT, text="word " * 20_000))
    assert cli.main(["show", run_id, "--runs-dir", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert len(out) < 5_000 and "100,000 chars" in out
    assert cli.main(["show", run_id, "--runs-dir", str(store.root), "--json"]) == 0
    assert '"text": "word word' in capsys.readouterr().out  # --json: the config whole, for programs


# ---- the Train tab in Chromium -------------------------------------------------------------------
@pytest.mark.browser
def test_text_box_upload_and_start_in_chromium(app_server, tmp_path):
    """Task text shows the box and the upload button; a binary file is refused beside the button and
    leaves the box empty; a good file fills it; Start trains a run whose config.json holds the text."""
    import json

    from playwright.sync_api import expect

    from tests.browser import WAIT_MS, assert_no_errors, choose, chromium, fill, open_page, wait_finished

    binary, good = tmp_path / "picture.txt", tmp_path / "poem.txt"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(512))
    good.write_text(USER_TEXT, encoding="utf-8")
    with chromium() as browser:
        page = open_page(browser, app_server.url)
        box = page.locator("#text textarea")
        expect(box).to_be_hidden()  # another task: no text box
        choose(page, "#task", "text")
        expect(box).to_be_visible()
        for path in (binary, good):
            with page.expect_file_chooser() as chooser:
                page.locator("#text-upload").click()
            chooser.value.set_files(str(path))
            if path is binary:
                expect(page.locator("#text-upload-note")).to_contain_text(f"{LABEL}: the file 'picture.txt' is binary")
                assert box.input_value() == ""
        expect(page.locator("#text-upload-note")).to_contain_text("Loaded 'poem.txt'")
        assert box.input_value() == USER_TEXT
        for sel, value in (("#min_len", "8"), ("#max_len", "16"), ("#steps", "60")):
            fill(page, sel, value)
        expect(page.locator("#config-summary")).to_contain_text("Your text")
        page.locator("#start-btn").click()
        page.wait_for_function("() => document.querySelector('#run-pick input').value", timeout=WAIT_MS)
        run_id = page.locator("#run-pick input").input_value()
        wait_finished(page, app_server, [run_id], WAIT_MS)
        config = json.loads((app_server.runs_dir / run_id / "config.json").read_text(encoding="utf-8"))
        assert config["task"]["name"] == "text" and config["task"]["text"] == USER_TEXT
        assert_no_errors(page)
