"""Table 3 at toy scale (lab/teach/table3.py): the paper's rows, the runs that measure them, and the marks that
say whether each measured band goes the paper's way."""
from __future__ import annotations

from dataclasses import replace

import pytest

from lab.config import RunConfig
from lab.teach.table3 import (BASE, BASE_ROW, OPPOSITE, ROWS, SAME, SEEDS, SPREAD, Band, configs, mark,
                              perplexity, table)
from tests.helpers import REPO


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
