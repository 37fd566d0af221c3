"""Table 3 at toy scale (lab/teach/presets/table3.py): the paper's rows, the runs that measure them, and the marks that
say whether each measured band goes the paper's way."""
from __future__ import annotations

from dataclasses import replace

import pytest

from lab.config import RunConfig
from lab.teach.presets.table3 import (BASE, BASE_ROW, OPPOSITE, ROWS, SAME, SEEDS, SPREAD, Band, configs, mark,
                              perplexity, table)
from tests.helpers import REPO
from lab.records import EXACT_MATCH, LOSS


@pytest.mark.parametrize("base, row, expected", [
    (Band(2.0, 1.9, 2.1), Band(2.3, 2.2, 2.4), SAME),  # the row worse, as the paper's
    (Band(2.0, 1.9, 2.1), Band(1.7, 1.6, 1.8), OPPOSITE),  # the row better, the paper's worse
    (Band(2.0, 1.9, 2.1), Band(2.15, 2.05, 2.3), SPREAD),  # the bands overlap
    (Band(2.0, 1.9, 2.1), Band(2.2, 2.1, 2.3), SPREAD),  # touching counts as overlapping
])
def test_a_row_is_marked_from_the_measured_bands(base, row, expected):
    assert mark(+1, base, row) == expected
    flipped = {SAME: OPPOSITE, OPPOSITE: SAME, SPREAD: SPREAD}[expected]
    assert mark(-1, base, row) == flipped  # a row the paper found better reads the other way


def test_the_papers_direction_is_its_perplexity_then_its_bleu():
    signs = {r.key: r.paper_sign for r in ROWS}
    assert signs == {"A h=1": 1, "A h=32": 1, "B d_k/4": 1, "C N/3": 1, "D dropout 0": 1, "E learned": 1}
    assert next(r for r in ROWS if r.key == "E learned").ppl == BASE_ROW.ppl  # a tie, broken by BLEU 25.7 < 25.8


def test_every_run_changes_only_what_its_row_changes():
    cfgs = configs()
    assert len(cfgs) == (1 + len(ROWS)) * len(SEEDS) and len({c.name for c in cfgs}) == len(cfgs)
    for c in cfgs:
        assert RunConfig.from_json(c.to_json()) == c  # valid, shareable
        key, seed = c.name.rsplit(" seed ", 1)
        row = BASE_ROW if key == "base" else next(r for r in ROWS if r.key == key)
        expected = replace(BASE, name=c.name, model=replace(BASE.model, **row.model),
                           train=replace(BASE.train, seed=int(seed), **row.train))
        assert c == expected
    base = BASE.model
    assert base.d_model // base.n_heads == 8 and next(r for r in ROWS if r.key == "B d_k/4").model["head_dim"] == 2


def test_the_table_shows_bands_and_marks_and_what_has_not_run():
    def summary(loss):
        return {"eval": {"loss": loss}}

    losses = {"base": (1.0, 1.02, 1.04), "A h=1": (1.2, 1.25, 1.22), "D dropout 0": (0.9, 0.92, 0.91)}
    results = {f"{k} seed {s}": summary(v[i]) for k, v in losses.items() for i, s in enumerate(SEEDS)}
    results.pop("D dropout 0 seed 2")
    rows = {r["row"]: r for r in table(results)}
    assert rows["base"]["mark"] == "" and rows["base"]["paper PPL"] == 4.92
    assert rows["A h=1"]["mark"] == SAME and rows["A h=1"]["measured PPL (mean [min, max])"] == \
        Band.of([perplexity(summary(v)) for v in losses["A h=1"]]).text()
    assert rows["D dropout 0"]["measured PPL (mean [min, max])"] == "not run yet" and rows["D dropout 0"]["mark"] == ""
    assert rows["C N/3"]["mark"] == ""


def test_the_docs_carry_the_reference_values():
    science = (REPO / "docs" / "SCIENCE.md").read_text(encoding="utf-8")
    for row in (BASE_ROW, *ROWS):
        assert f"{row.ppl:.2f} / {row.bleu:.1f}" in science, row


def test_the_presets_explanation_is_the_table_with_a_count_of_its_marks():
    from lab.teach.presets.catalog import PRESETS

    losses = {"base": (1.0, 1.02, 1.04), "A h=1": (1.2, 1.25, 1.22), "A h=32": (1.0, 1.3, 1.1),
              "B d_k/4": (1.3, 1.31, 1.32), "C N/3": (1.5, 1.6, 1.55), "D dropout 0": (0.9, 0.92, 0.91),
              "E learned": (1.01, 1.03, 1.02)}
    results = {f"{k} seed {s}": {"eval": {LOSS: v[i], EXACT_MATCH: 0.0}, "stopped": False}
               for k, v in losses.items() for i, s in enumerate(SEEDS)}
    text = PRESETS["table3"].explain(results)
    assert text.startswith("Of the paper's 6 variations, 3 moved this toy model the paper's way, 1 the opposite way "
                           "and 2 stayed within the seeds' spread"), text
    assert "| A h=1 | 1 head of d_k = d_model (constant compute) | 5.29 / 24.9 | 3.40 [3.32, 3.49] | " \
           "same direction as the paper |" in text
    assert "| D dropout 0 | no dropout | 5.77 / 24.6 |" in text and "| opposite |" in text
    missing = PRESETS["table3"].explain({k: v for k, v in results.items() if k != "C N/3 seed 1"})
    assert missing.startswith("No final results yet for: C N/3 seed 1.")


@pytest.mark.app
def test_the_command_line_refuses_a_bad_preset_or_step_count(tmp_path):
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-m", "lab", "preset", *args, "--runs-dir", str(tmp_path / "runs")],
                              cwd=REPO, capture_output=True, text=True, timeout=120)

    bad = run("table4")
    assert bad.returncode == 2 and "invalid choice: 'table4'" in bad.stderr and "table3" in bad.stderr
    zero = run("table3", "--steps", "0")
    assert zero.returncode == 2 and "--steps" in zero.stderr and "allowed: 1 to 1000000" in zero.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing half-written


@pytest.mark.science
def test_the_whole_experiment_runs_from_the_command_line(tmp_path):
    """21 runs at 6 steps each (the claim is made at the preset's settings; this checks the path): every run
    completes, the cost is said before it starts, and the explanation is the table of all six rows."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "lab", "preset", "table3", "--steps", "6", "--json",
                          "--runs-dir", str(tmp_path / "runs")], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.startswith("preset table3 (Table 3 at toy scale): 21 runs") and "until all 21 runs are done" in out.stderr
    got = json.loads(out.stdout)
    assert len(got["runs"]) == 21 and all(r["state"] == "completed" and r["steps"] == 6 for r in got["runs"])
    assert got["explanation"].startswith("Of the paper's 6 variations")
    assert all(f"| {row.key} |" in got["explanation"] for row in ROWS) and "not run yet" not in got["explanation"]
