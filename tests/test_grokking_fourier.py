"""The grokking preset's Fourier picture (Nanda et al. 2023; lab/circuits/fourier.py `around_jump`,
lab/teach/preset_results.py `fourier_forming`): the share of the token embedding's non-constant power in its
8 strongest frequencies at the last snapshot before the held-out jump (exact-match >= 0.9), the first after it
and the end, and the preset's explanation quoting them. The slow test trains the preset's weight-decay run
once, at exactly its settings, and asserts what docs/SCIENCE.md records: spread before the jump, rising
after it. The issue's target (>= 0.8 after the jump) is not reached within the preset's steps on a CPU: it
is kept as an expected failure, strict, so a config that reaches it shows up here."""
from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from lab.circuits.fourier import Spectrum, around_jump
from lab.teach.presets import PRESETS
from lab.teach.preset_base import measured

WD, NO = "weight decay 1.0", "weight decay 0"


def spectra(*points: tuple[int, float]) -> list[Spectrum]:
    return [Spectrum(step, np.ones(48), (1, 2, 3, 4, 5, 6, 7, 8), frac) for step, frac in points]


def test_around_jump_reads_the_snapshots_either_side_of_the_first_evaluation_past_90_percent():
    sp = spectra((0, 0.19), (440, 0.20), (880, 0.23), (1320, 0.27), (1760, 0.33), (2200, 0.37))
    evals = [(1430, 0.46), (110, 0.02), (1650, 0.93), (1540, 0.87), (1870, 0.98)]  # any order
    f = around_jump(sp, evals)
    assert f["jump_step"] == 1650 and f["top"] == 8 and f["frequencies"] == (1, 2, 3, 4, 5, 6, 7, 8)
    assert (f["start"], f["before"], f["after"], f["end"]) == ((0, 0.19), (1320, 0.27), (1760, 0.33), (2200, 0.37))
    at_a_snapshot = around_jump(sp, [(1760, 0.95)])  # a snapshot at the jump's own step counts as after it
    assert at_a_snapshot["before"] == (1320, 0.27) and at_a_snapshot["after"] == (1760, 0.33)
    never = around_jump(sp, [(2200, 0.5)])
    assert never["jump_step"] is None and never["before"] is None and never["after"] is None
    assert never["end"] == (2200, 0.37) and around_jump([], evals) == {}


def grok_run(test_acc: list[float], train_acc: list[float], fourier: dict, every: int = 110) -> dict:
    evals = [{"step": every * (i + 1), "exact_match": t, "train_exact_match": a}
             for i, (t, a) in enumerate(zip(test_acc, train_acc))]
    last = evals[-1]
    return measured({"train_loss": 0.001, "steps": every * len(evals), "wall_s": 1.0, "stopped": False,
                     "eval": {"loss": 0.1, "token_acc": last["exact_match"], "exact_match": last["exact_match"]},
                     "train_set": {"loss": 0.001, "token_acc": last["train_exact_match"],
                                   "exact_match": last["train_exact_match"]}, "ood": None},
                    evals, train=[(100, 2.0), (500, 0.01)], fourier=fourier)


@pytest.mark.parametrize("after, end, verdict", [((1760, 0.33), (2200, 0.37), "still spread"),
                                                 ((1760, 0.84), (2200, 0.91), "the paper's Fourier picture")])
def test_the_explanation_quotes_the_share_before_and_after_the_jump(after, end, verdict):
    f = {"top": 8, "jump_step": 1650, "start": (0, 0.19), "before": (1320, 0.27), "after": after, "end": end}
    wd = grok_run([0.02, 0.2, 0.3, 0.4, 0.95, 1.0], [0.4, 0.97, 1.0, 1.0, 1.0, 1.0], f)
    no = grok_run([0.02, 0.05, 0.06, 0.07, 0.07, 0.08], [0.5, 1.0, 1.0, 1.0, 1.0, 1.0], {})
    text = PRESETS["grokking"].explain({WD: wd, NO: no})
    assert (f"The embedding's power in its 8 strongest frequencies (random: about 17%) was 27% at step 1320 (before "
            f"the jump), {100 * after[1]:.0f}% at step 1760 (after it), {100 * end[1]:.0f}% at step 2200: ") in text
    assert verdict in text and len(text) < 900 and "nan" not in text, (len(text), text)
    assert PRESETS["grokking"].fourier == (WD,)
    same = dict(f, after=end)  # the first snapshot after the jump is the last one: quoted once
    text = PRESETS["grokking"].explain({WD: grok_run([0.02, 0.2, 0.3, 0.4, 0.95, 1.0], [1.0] * 6, same), NO: no})
    assert text.count(f"at step {end[0]}") == 1, text
    assert "frequencies" not in PRESETS["grokking"].explain({WD: grok_run([0.5] * 6, [1.0] * 6, {}), NO: no})


# ---- slow: the preset's weight-decay run, at exactly its settings ---------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    """The grokking preset's weight-decay run trained once into a store (1 thread, the CPU), and its id."""
    from lab.cli.main import main
    from lab.engine.store import RunStore

    root = tmp_path_factory.mktemp("grok_fourier")
    cfg = next(c for c in PRESETS["grokking"].runs if c.name == WD)
    (root / "cfg.json").write_text(cfg.to_json())
    args = ["train", "--config", str(root / "cfg.json"), "--runs-dir", str(root / "runs"), "--json",
            "--threads", "1", "--device", "cpu"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    run_id = json.loads(buf.getvalue().strip().splitlines()[-1])["run_id"]
    store = RunStore(root / "runs")
    yield store, run_id
    store.close()


@pytest.mark.slow
def test_the_embedding_is_spread_before_the_jump_and_concentrates_after_it(trained):
    from lab.teach.preset_results import fourier_forming, run_result

    store, run_id = trained
    f = fourier_forming(store, run_id)
    assert f["jump_step"] is not None and f["before"] and f["after"], f  # it grokked, with snapshots either side
    assert f["start"][1] < 0.25 and f["before"][1] < 0.4, f  # spread: a random embedding holds about 0.17
    assert f["end"][1] > f["before"][1] + 0.05, f  # gathering in a few frequencies after the jump
    res = run_result(store, run_id, store.summary(run_id), ("fourier",))
    assert res["fourier"] == f


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="open: the issue's >= 0.8 after the jump; measured 0.33-0.37 within the "
                   "preset's 2200 steps (0.78 only at 12,000 steps; docs/SCIENCE.md, Grokking)")
def test_most_of_the_power_is_in_8_frequencies_after_the_jump(trained):
    from lab.teach.preset_results import fourier_forming

    f = fourier_forming(*trained)
    assert f["end"][1] >= 0.8, f
