"""Tasks text and induction work with the default knobs: their training lengths come from the task when
nobody stated any (lab/derived.py), on the command line and when the user picks the task in the app; an
explicit bad length is still refused naming the field; task knobs a task does not read are hidden for it."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from lab.cli.main import build_parser, config_from_args, main
from lab.derived import default_lengths, lengths_for, lengths_on_choosing
from lab.records import StepRecord
from lab.trainer import train
from ui.knobs import ARCH_BOUND, BY_KEY, KNOBS, TASK_SHOWN, config_from_values, lengths_for_task, shown_for_task
from tests.browser import assert_no_errors, choose, chromium, fill, open_page, wait_finished
from tests.helpers import REPO, lab_env, one_json

pytestmark = pytest.mark.usefixtures("one_thread")  # torch at one intra-op thread (tests/conftest.py)


def from_cli(*argv: str):
    return config_from_args(build_parser().parse_args(["train", *argv]))


# ---- the rule --------------------------------------------------------------------------------------
def test_each_task_starts_from_lengths_it_accepts():
    assert default_lengths("reverse") == (1, 8) and default_lengths("induction") == (8, 16)
    assert default_lengths("text") == (16, 16)
    assert lengths_for("induction") == (8, 16)
    assert lengths_for("induction", max_len=6) == (6, 6)  # the default moves only as far as it must
    assert lengths_for("induction", min_len=20) == (20, 20)
    assert lengths_for("text", min_len=4) == (4, 16) and lengths_for("reverse", 3, 5) == (3, 5)


# ---- the command line --------------------------------------------------------------------------------
@pytest.mark.parametrize("task", ["text", "induction"])
def test_the_cli_builds_a_valid_config_from_the_task_alone(task):
    cfg = from_cli("--task", task, "--steps", "50")
    assert (cfg.task.min_len, cfg.task.max_len) == default_lengths(task)
    assert cfg.model == replace(from_cli().model, n_ctx=cfg.model.n_ctx)  # every other knob at its default
    assert from_cli("--task", task, "--max-len", "12").task.max_len == 12


@pytest.mark.parametrize("argv,names", [
    ("--task text --min-len 1", ["task.min_len", "--min-len", "Shortest training length", "allowed: >= 2"]),
    ("--task induction --min-len 3", ["task.min_len", "--min-len", "Shortest training length", "allowed: >= 4"]),
    ("--task induction --min-len 9 --max-len 8", ["task.max_len", "--max-len", "Longest training length",
                                                  "allowed: >= min_len"]),
])
def test_an_explicit_bad_length_is_still_refused(tmp_path, capsys, argv, names):
    runs = tmp_path / "runs"
    rc = main(["train", *argv.split(), "--runs-dir", str(runs)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1 and all(n in err for n in names), err
    assert not runs.exists()


@pytest.mark.app
def test_text_and_induction_train_from_the_command_line_with_default_flags(tmp_path):
    """`python -m lab train --task text --steps 50` (and induction): status 0, a completed run."""
    def run(task: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "lab", "train", "--task", task, "--steps", "50", "--json"],
                              cwd=REPO, env=lab_env(tmp_path / f"runs-{task}"), capture_output=True, text=True,
                              timeout=600)

    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(("text", "induction"), pool.map(run, ("text", "induction"))))
    for task, res in results.items():
        assert res.returncode == 0, res.stderr[-2000:]
        out = one_json(res.stdout)
        assert out["status"] == "completed" and out["steps"] == 50 and task in out["run_id"]
        assert math.isfinite(out["eval"]["loss"])
        stored = json.loads((tmp_path / f"runs-{task}" / out["run_id"] / "config.json").read_text())
        assert (stored["task"]["min_len"], stored["task"]["max_len"]) == default_lengths(task)


# ---- the app -----------------------------------------------------------------------------------------
DEFAULTS = {k.key: k.default() for k in KNOBS}


def pick(task: str, values: dict) -> dict:
    """The knob values after the user picks `task` (the task dropdown's `.input` handler)."""
    lo, hi = lengths_for_task(task, values["task.min_len"], values["task.max_len"], values["task.text"])
    return {**values, "task.name": task, "task.min_len": lo, "task.max_len": hi}


@pytest.mark.parametrize("task", ["text", "induction"])
def test_picking_the_task_in_the_app_gives_a_config_that_trains(task):
    values = pick(task, DEFAULTS)
    assert (values["task.min_len"], values["task.max_len"]) == default_lengths(task)
    cfg = config_from_values({**values, "train.steps": 4, "train.eval_every": 4, "train.eval_samples": 16})
    steps = []
    result = train(cfg, on_record=lambda r: steps.append(r) if isinstance(r, StepRecord) else None, threads=1)
    assert result.steps_done == 4 and len(steps) == 4 and math.isfinite(result.final_eval.loss)


def test_picking_a_task_keeps_the_users_lengths_where_they_work():
    assert lengths_for_task("sort", 3, 12) == (3, 12)  # chosen by the user, and fine for sort
    assert lengths_for_task("text", 4, 12) == (4, 12)
    assert lengths_for_task("induction", 2, 12) == (8, 16)  # 2 is too short for induction
    assert lengths_for_task("reverse", 16, 16) == (1, 8)  # text's defaults do not stay for reverse
    assert lengths_for_task("sort", 3.0, 12.0) == (3, 12)  # a slider's numbers may come as floats
    assert lengths_for_task("text", 8.0, 600.0) == (16, 16)  # 600 is over the allowed 512
    assert lengths_for_task("copy", None, "") == (1, 8)  # empty sliders (an API call): the defaults
    assert lengths_on_choosing("no-such-task", 1, 8) == (1, 8)
    text = "abcdefghij" * 25  # 250 characters: 25 held out
    assert lengths_for_task("text", 20, 30, text) == (16, 16) and lengths_for_task("text", 20, 24, text) == (20, 24)


def visible(task: str) -> dict[str, bool]:
    return {k.key: u["visible"] for k, u in zip(TASK_SHOWN, shown_for_task(task))}


def test_task_knobs_a_task_does_not_read_are_hidden_for_it():
    assert {k.key for k in TASK_SHOWN} >= {"task.min_len", "task.max_len", "task.n_symbols", "task.modulus"}
    text = visible("text")
    assert text["task.n_symbols"] is False and text["task.ood_len"] is False and text["task.modulus"] is False
    assert text["task.min_len"] and text["task.max_len"]  # a text's windows: they matter
    reverse = visible("reverse")
    assert reverse["task.n_symbols"] and reverse["task.min_len"] and not reverse["task.train_fraction"]
    grok = visible("modular_addition")
    assert grok["task.modulus"] and grok["task.train_fraction"] and not grok["task.max_len"]
    assert all(visible("no-such-task").values())  # an unknown task hides nothing (its error says what is wrong)
    assert BY_KEY["task.n_symbols"].means_something("induction") and not BY_KEY["task.n_symbols"].means_something("text")


def test_the_app_wires_the_task_choice(tmp_path):
    import app
    from lab.engine.jobs import JobManager
    from lab.engine.store import RunStore

    store = RunStore(tmp_path / "runs")
    jobs = JobManager(store, max_concurrent=1)
    try:
        demo = app.build_demo(store, jobs)
        fns = {fn.api_name: fn for fn in demo.fns.values()}
        lengths, shown = fns["task_lengths"], fns["knobs_changed"]
        assert [c.elem_id for c in lengths.outputs] == ["min_len", "max_len"]
        assert [e for _, e in lengths.targets] == ["input"]  # the user's pick only: a link's lengths stay
        task = lengths.inputs[0]
        assert task.elem_id == "task" and (task._id, "change") in shown.targets  # every change, a link's too
        out = [c.elem_id for c in shown.outputs]
        assert out[2:] == [k.url_key for k in TASK_SHOWN] + ["text", "text-upload", "text-upload-note"] + [
            k.url_key for k in ARCH_BOUND]  # and the knobs a recurrent model does not read (greyed out for it)
        blocks = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
        assert blocks["n_symbols"].visible and not blocks["modulus"].visible  # the default task, reverse
    finally:
        jobs.shutdown(wait=True)


# ---- the real app in Chromium -----------------------------------------------------------------------------
@pytest.mark.browser
def test_picking_text_then_induction_in_chromium_and_starting(app_server):
    from playwright.sync_api import expect

    with chromium() as browser:
        page = open_page(browser, app_server.url)
        fill(page, "#steps", "30")
        previous = ""
        for task, lengths, hidden in (("text", ("16", "16"), True), ("induction", ("8", "16"), False)):
            choose(page, "#task", task)
            for sel, value in zip(("#min_len", "#max_len"), lengths):
                expect(page.locator(f"{sel} input[type=number]")).to_have_value(value)
            n_symbols = page.locator("#n_symbols")
            (expect(n_symbols).to_be_hidden() if hidden else expect(n_symbols).to_be_visible())
            expect(page.locator("#min_len")).to_be_visible()
            page.locator("#start-btn").click()
            page.wait_for_function("([sel, prev]) => { const v = document.querySelector(sel).value; "
                                   "return v && v !== prev; }", arg=["#run-pick input", previous], polling=250)
            previous = page.locator("#run-pick input").input_value()
            assert task in previous
            wait_finished(page, app_server, [previous], 180_000)
            assert page.locator("#start-note").inner_text().strip() == ""
            assert_no_errors(page)
