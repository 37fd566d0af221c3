"""The closed sets of names the records key their values by (lab/records.py): each declared once, as a Literal
type and its constants, and still the names stored runs were written with."""
from __future__ import annotations

from dataclasses import fields
from typing import get_args

from lab.records import ATTENTION_KINDS, EXACT_MATCH, LOSS, PREDICTABLE_ACC, TOKEN_ACC, AttentionKind, EvalRecord, Metric

METRICS = (LOSS, TOKEN_ACC, EXACT_MATCH, PREDICTABLE_ACC)


def test_each_set_of_constants_is_its_literal_type():
    assert ATTENTION_KINDS == get_args(AttentionKind)
    assert METRICS == get_args(Metric)  # a constant for every name of the type


def test_the_names_stored_runs_were_written_with():
    # summary.json, metrics.csv and the snapshot files key by these: renaming one would orphan every stored run
    assert METRICS == ("loss", "token_acc", "exact_match", "predictable_acc")
    assert ATTENTION_KINDS == ("enc_self", "dec_self", "cross")


def test_every_metric_is_an_evaluation_record_column():
    columns = {f.name for f in fields(EvalRecord)}
    assert set(METRICS) <= columns and {f"train_{m}" for m in METRICS} <= columns
