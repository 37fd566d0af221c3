"""A lesson in Debian's headless Chromium (issue 32's acceptance): a shared server (LAB_PUBLIC=1) started with a
lesson bundle of every preset answers every preset card, and a student opens Compare and Inspect (the
circuits panel included) on the bundle's runs with no training at all. Then two students start the same knobs
on the Train tab: the second watches the first's run, is told so, and trains a new seed with one click.

The bundle holds every preset's runs under their presets' configs, each trained a few steps (tests/helpers.py
preset_bundle): real weights and snapshots, made in seconds; `python -m lab bundle --all` trains them fully.
"""
from __future__ import annotations

import json

import pytest

from lab.engine.bundle import load_bundle
from lab.engine.store import RunStore
from lab.teach.presets.catalog import PRESETS
from tests.browser import assert_no_errors, chromium, fill, open_page, shoot, wait_curves
from tests.helpers import launch_app, preset_bundle

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)

WAIT_MS = 180_000


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson")
    bundle = preset_bundle(folder, list(PRESETS))
    bundled = sorted(load_bundle(RunStore(folder / "probe"), bundle).runs)  # what the bundle holds
    with launch_app(folder, {"LAB_BUNDLE": str(bundle), "LAB_PUBLIC": "1"}) as server:
        yield server, bundled


def statuses(server) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in server.runs_dir.glob("*/status.json")}


def test_a_bundle_answers_every_card_and_opens_compare_and_inspect_with_no_training(lesson, tmp_path):
    server, bundled = lesson
    every_run = sum(len(p.runs) for p in PRESETS.values())
    assert sorted(statuses(server)) == bundled and f"Lesson bundle lesson.zip: {every_run} run(s) loaded" in \
        server.log_path.read_text()
    with chromium() as browser:
        page = open_page(browser, server.url, WAIT_MS)
        page.get_by_role("tab", name="Presets").click()
        for key in PRESETS:  # every card answered, and says where the answer came from
            card = page.locator(f"#preset-card-{key}")
            card.get_by_text("Last result on this server").wait_for()
            assert "From the lesson bundle lesson.zip" in card.inner_text()
        page.locator("#preset-induction").click()  # a student clicks a preset: the bundle's runs, at once
        status = page.locator("#compare-note")  # Compare opens on them, under the preset's line
        status.get_by_text("2 of 2 runs done").wait_for()
        assert "trained for this lesson" in status.inner_text() and "so the same result" in status.inner_text()
        wait_curves(page, "#compare-curves", 2, points=1)
        assert page.locator("#compare-pick .token").count() == 2
        shoot(page, tmp_path / "compare.png", top="#compare-pick")

        page.get_by_role("tab", name="Inspect").click()
        run = next(r for r in bundled if "-induction-" in r
                   and json.loads((server.runs_dir / r / "config.json").read_text())["name"] == "2 layers")
        box = page.locator("#inspect-run input")  # the run's label, typed: the list holds every run
        box.click()
        box.fill(run[-6:])
        page.locator("#inspect-run").get_by_role("option").filter(has_text=run[-6:]).click()
        page.locator("#attn-dec_self img").wait_for()
        page.locator("#circuits-roles-note").get_by_text("At step").wait_for()
        assert "induction" in page.locator("#circuits-roles-note").inner_text()
        shoot(page, tmp_path / "inspect.png", top="#circuits-roles-note")
        assert_no_errors(page)
    after = statuses(server)
    assert sorted(after) == bundled, "a click trained something"  # no run created: 0 trainings
    assert {s["state"] for s in after.values()} == {"completed"} and all(s.get("bundle") for s in after.values())
    assert "Traceback" not in server.log_path.read_text()


def test_the_second_student_watches_the_first_run_and_can_train_a_new_seed(lesson):
    server, bundled = lesson
    with chromium() as browser:
        first, second = (open_page(browser, server.url, WAIT_MS) for _ in range(2))  # two browsers: two students
        for page in (first, second):
            fill(page, "#steps", "40")
            fill(page, "#max_len", "4")
        first.locator("#start-btn").click()
        first.locator("#progress").get_by_text("Completed").wait_for()
        second.locator("#start-btn").click()
        note = second.locator("#start-note")
        note.get_by_text("same configuration, same seed, so the same result").wait_for()
        assert "was trained on this server at" in note.inner_text()
        assert second.locator("#run-pick input").input_value() == first.locator("#run-pick input").input_value()
        second.locator("#progress").get_by_text("Completed").wait_for()
        new = [r for r in statuses(server) if r not in bundled]
        assert len(new) == 1  # two Starts, one training

        second.locator("#again-btn").click()  # a new seed: a run of the second student's own
        second.wait_for_function("() => document.querySelector('#seed input').value !== '0'", polling=250)
        seed = int(second.locator("#seed input").input_value())
        second.locator("#progress").get_by_text("Completed").wait_for()
        runs = [r for r in statuses(server) if r not in bundled]
        assert len(runs) == 2 and second.locator("#run-pick input").input_value() not in new
        cfg = json.loads((server.runs_dir / [r for r in runs if r not in new][0] / "config.json").read_text())
        assert cfg["train"]["seed"] == seed
        for page in (first, second):
            assert_no_errors(page)


def test_two_students_with_their_own_seed_make_one_class_band_in_compare(lesson):
    """"My own seed" set by a click in one browser and by the keyboard (Tab to it, Space) in another: each
    student's preset run trains a seed of their own, and Compare draws the class's runs as one band."""
    server, bundled = lesson
    with chromium() as browser:
        first, second = (open_page(browser, server.url, WAIT_MS) for _ in range(2))
        for page in (first, second):
            page.get_by_role("tab", name="Presets").click()
        first.locator("#preset-own-seed input").click()
        box = second.locator("#preset-own-seed input")
        box.focus()
        second.keyboard.press("Space")
        for page in (first, second):
            assert page.locator("#preset-own-seed input").is_checked()
        first.locator("#preset-hello_sort").click()
        first.locator("#compare-note").get_by_text("1 of 1 runs done").wait_for()
        second.locator("#preset-hello_sort").click()
        second.locator("#compare-note").get_by_text("1 of 1 runs done").wait_for()
        second.locator("#compare-groups").get_by_text("sort (class: 2 students)").first.wait_for(state="attached")  # the groups table, drawn for the band
        assert second.locator("#compare-pick .token").count() == 2
        new = [r for r in statuses(server) if r not in bundled]
        mine = [json.loads((server.runs_dir / r / "config.json").read_text()) for r in new
                if statuses(server)[r].get("seed_from") == "class"]
        assert len(mine) == 2 and len({c["train"]["seed"] for c in mine}) == 2
        assert all(c["name"] == "sort" for c in mine)
        for page in (first, second):
            assert_no_errors(page)


# every 100 ms, until the note has named `until` for 2 s without a break (at most `ms`): Compare's note (its text, not the
# progress shown over it) and the names of the picked runs
SAMPLE_NOTE_AND_PICKS = """([until, ms]) => new Promise((done) => {
  const seen = [], start = performance.now();
  let named = null;
  const tick = () => {
    const note = [...document.querySelectorAll('#compare-note .prose')].map((p) => p.innerText).join('\\n');
    const picks = [...document.querySelectorAll('#compare-pick .token')]
      .map((t) => t.innerText.trim().replace(/ \\(\\w+\\)$/, ''));
    seen.push([note, picks]);
    const now = performance.now();
    named = note.includes(until) ? (named ?? now) : null;  // named without a break since then
    if (now - start < ms && (named === null || now - named < 2000)) setTimeout(tick, 100); else done(seen);
  };
  tick();
})"""


def test_a_second_preset_clicked_at_once_never_shows_the_first_ones_name_above_its_runs(lesson):
    """Issue 34 item 9: two presets clicked a second apart. At every moment Compare's note names the preset
    whose runs are picked, or no preset: never the first's title above the second's runs."""
    server, _ = lesson
    titles = {key: PRESETS[key].title for key in ("hello_sort", "induction")}
    names = {key: {c.name for c in PRESETS[key].runs} for key in titles}
    with chromium() as browser:
        page = open_page(browser, server.url, WAIT_MS)
        page.get_by_role("tab", name="Presets").click()
        page.locator("#preset-hello_sort").click()
        page.wait_for_timeout(1000)
        page.get_by_role("tab", name="Presets").click()
        page.locator("#preset-induction").click()
        seen = page.evaluate(SAMPLE_NOTE_AND_PICKS, [titles["induction"], WAIT_MS])
        for note, picks in seen:
            for key, title in titles.items():
                if title in note:
                    assert picks and set(picks) <= names[key], (note, picks)
        changes = [x for i, x in enumerate(seen) if i == 0 or x != seen[i - 1]]
        assert titles["induction"] in seen[-1][0] and set(seen[-1][1]) == names["induction"], changes
        assert_no_errors(page)
