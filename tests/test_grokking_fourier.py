"""The grokking preset's Fourier picture (Nanda et al. 2023; lab/circuits/fourier.py `around_jump`,
lab/teach/presets/results.py `fourier_forming`): the share of the token embedding's non-constant power in its
8 strongest frequencies at the last snapshot of the memorising model (training accuracy first at 95%, held-out
below 50%), the first after the jump (held-out exact-match >= 0.9) and the end, and the preset's explanation quoting them. The slow test reads the preset's weight-decay run
(trained once a session, at exactly its settings), and asserts what docs/SCIENCE.md records: spread while the model memorises,
at least 0.8 in the 8 strongest frequencies after the jump, by the end of its steps."""
from __future__ import annotations

import numpy as np
import pytest

from lab.circuits.fourier import Spectrum, around_jump
from lab.teach.presets.catalog import PRESETS
from tests.test_train_metrics import grok_run as plain_grok_run
from tests.trained_once import trained_once

WD, NO = "weight decay 1.0", "weight decay 0"


def spectra(*points: tuple[int, float]) -> list[Spectrum]:
    return [Spectrum(step, np.ones(48), (1, 2, 3, 4, 5, 6, 7, 8), frac) for step, frac in points]


def test_around_jump_reads_the_memorising_snapshot_and_the_first_after_the_jump():
    sp = spectra((0, 0.19), (440, 0.20), (880, 0.23), (1320, 0.27), (1760, 0.33), (2200, 0.37))
    evals = [(1430, 0.46), (110, 0.02), (1650, 0.93), (1540, 0.87), (1870, 0.98)]  # any order
    f = around_jump(sp, evals)  # held-out first >= 0.5 at 1540, >= 0.9 at 1650
    assert f["jump_step"] == 1650 and f["top"] == 8 and f["frequencies"] == (1, 2, 3, 4, 5, 6, 7, 8)
    assert (f["start"], f["before"], f["after"], f["end"]) == ((0, 0.19), (1320, 0.27), (1760, 0.33), (2200, 0.37))
    rising = around_jump(sp, [(800, 0.3), (900, 0.6), (1760, 0.95)])  # the rise began before the 1320 snapshot
    assert rising["before"] == (880, 0.23) and rising["after"] == (1760, 0.33)  # a snapshot at the jump is after it
    memorised = around_jump(sp, evals, memorised=900)  # training accuracy at 95% by step 900: the 880 snapshot
    assert memorised["before"] == (880, 0.23) and memorised["after"] == (1760, 0.33)
    never = around_jump(sp, [(2200, 0.5)])
    assert never["jump_step"] is None and never["before"] is None and never["after"] is None
    assert never["end"] == (2200, 0.37) and around_jump([], evals) == {}


def grok_run(test_acc: list[float], train_acc: list[float], fourier: dict) -> dict:
    """A grokking run's result as the explanation reads it (tests/test_train_metrics.py), with its Fourier measure."""
    return {**plain_grok_run(test_acc, train_acc), "fourier": fourier}


@pytest.mark.parametrize("after, end, verdict", [((1760, 0.33), (2200, 0.37), "still spread"),
                                                 ((1760, 0.84), (2200, 0.91), "the paper's Fourier picture")])
def test_the_explanation_quotes_the_share_before_and_after_the_jump(after, end, verdict):
    f = {"top": 8, "jump_step": 1650, "start": (0, 0.19), "before": (1320, 0.27), "after": after, "end": end}
    wd = grok_run([0.02, 0.2, 0.3, 0.4, 0.95, 1.0], [0.4, 0.97, 1.0, 1.0, 1.0, 1.0], f)
    no = grok_run([0.02, 0.05, 0.06, 0.07, 0.07, 0.08], [0.5, 1.0, 1.0, 1.0, 1.0, 1.0], {})
    text = PRESETS["grokking"].explain({WD: wd, NO: no})
    assert (f"The embedding's power in its 8 strongest frequencies (random: about 17%) was 27% at step 1320 "
            f"(memorised), {100 * after[1]:.0f}% at step 1760 (after the jump), {100 * end[1]:.0f}% at step 2200: ") in text
    assert verdict in text and len(text) < 900 and "nan" not in text, (len(text), text)
    assert PRESETS["grokking"].fourier == (WD,)
    same = dict(f, after=end)  # the first snapshot after the jump is the last one: quoted once
    text = PRESETS["grokking"].explain({WD: grok_run([0.02, 0.2, 0.3, 0.4, 0.95, 1.0], [1.0] * 6, same), NO: no})
    assert text.count(f"at step {end[0]}") == 1, text
    assert "frequencies" not in PRESETS["grokking"].explain({WD: grok_run([0.5] * 6, [1.0] * 6, {}), NO: no})


# ---- slow: the preset's weight-decay run, at exactly its settings ---------------------------------------
@pytest.fixture(scope="module")
def trained(trained_folder):
    """The grokking preset's weight-decay run (1 thread, the CPU) in a store, and its id: the session's one
    training of it (tests/trained_once.py), which test_presets' grokking test reads too."""
    from lab.engine.store import RunStore

    t = trained_once(next(c for c in PRESETS["grokking"].runs if c.name == WD), trained_folder)
    store = RunStore(t.runs_dir)
    yield store, t.run_id
    store.close()


@pytest.mark.science
@pytest.mark.shares_training("grokking weight decay")
def test_the_embedding_is_spread_while_memorising_and_in_8_frequencies_after_the_jump(trained):
    """Issue 25's acceptance: at least 80% of the embedding's non-constant power in its 8 strongest frequencies
    after the held-out jump (by the end of the preset's steps; the first snapshot after the jump has less, the
    concentration goes on), and a spread spectrum before it, when the model has memorised its training pairs
    (a random embedding holds about 0.17)."""
    from lab.teach.presets.results import fourier_forming, run_result

    store, run_id = trained
    f = fourier_forming(store, run_id)
    print(f"\n[fourier] {f}")
    assert f["jump_step"] is not None and f["before"] and f["after"], f  # it grokked, with snapshots either side
    assert f["start"][1] < 0.25 and f["before"][1] < 0.35, f  # spread while it memorises
    assert f["before"][1] < f["after"][1] < f["end"][1] and f["end"][1] >= 0.8, f  # after the jump: a few key ones
    res = run_result(store, run_id, store.summary(run_id), ("fourier",))
    assert res["fourier"] == f
