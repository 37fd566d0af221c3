"""Inspect's intervention panel (ui/inspect/interventions.py, ui/inspect/intervention_views.py): its callbacks called directly against
a real run store holding small trained runs. The answer table is the model's greedy answer; Apply with a head
knocked out changes the held-out metrics; a click on an importance cell knocks that head out; a run change
clears or redraws every panel, even when its own event was dropped; bad controls are refused naming the field.
"""
from __future__ import annotations

from dataclasses import replace

import gradio as gr
import pytest

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.engine.recorder import record_run
from lab.interventions import HeadRef, Interventions
from lab.views.analysis import load_model, parse_probe, sampled_probe
from lab.views.probing import ablation_report, greedy_answer
from tests.helpers import app_context
from ui.common import errors_as_messages
from ui.inspect.tab import build_inspect_tab
from ui.inspect.interventions import panel_update
from ui.inspect.intervention_views import API, MapCache, SEE_NOTE, api_call
from lab.records import DEC_SELF

pytestmark = pytest.mark.usefixtures("one_thread")

COPY = RunConfig(model=ModelConfig(n_layers=2, n_heads=2, d_model=32, d_ff=64, pos="learned"),
                 task=TaskConfig(name="copy", max_len=4),
                 train=TrainConfig(steps=300, batch_size=32, warmup=0, eval_every=100, snapshots=2))
ENC_DEC = replace(COPY, model=replace(COPY.model, arch="encoder-decoder", n_layers=1, d_ff=0),
                  train=replace(COPY.train, steps=40))
CONTROLS = dict(heads=[], mode="zero", skip_ff=[], skip_block=[], positional="intact")


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    with app_context(tmp_path_factory.mktemp("intervene")) as context:
        yield context


@pytest.fixture(scope="module")
def runs(ctx) -> dict[str, str]:
    ids = {}
    for name, cfg in (("copy", COPY), ("enc_dec", ENC_DEC)):
        ids[name] = ctx.store.create(cfg)
        record_run(ctx.store, ids[name], threads=1)
    ids["queued"] = ctx.store.create(COPY)  # no weights yet
    return ids


def show(ctx, cache, run_id, trigger="run", shown="", source="sampled", text="", **controls) -> dict:
    return panel_update(ctx, cache, trigger, shown, run_id, source, text, **(CONTROLS | controls))


def rows(table: gr.Dataframe) -> list[list]:
    return table.value["data"]


def message(fn, *args, **kwargs) -> str:
    """The one-line message `fn` (wrapped in errors_as_messages) answers with."""
    with pytest.raises(gr.Error) as err:
        fn(*args, **kwargs)
    return str(err.value.message)


def model_of(ctx, run_id):
    cfg = ctx.store.config(run_id)
    return cfg, load_model(cfg, ctx.store.load_weights(run_id))


def test_the_answer_table_is_the_models_greedy_answer(ctx, runs):
    cache = MapCache()
    out = show(ctx, cache, runs["copy"])
    cfg, model = model_of(ctx, runs["copy"])
    answer = greedy_answer(model, cfg, sampled_probe(cfg).batch)
    assert out["answer"].visible is True
    assert [r[1:] for r in rows(out["answer"])] == [[t.predicted, t.expected, "✓" if t.right else "✗",
                                                      f"{t.probability:.2f}"] for t in answer.tokens]
    wrong = sum(not t.right for t in answer.tokens)
    assert ("answer right" if wrong == 0 else f"{wrong} of {len(answer.tokens)} tokens wrong") in out["answer_note"]
    assert "Final weights (step 300)" in out["weights_note"] and out["metrics"].visible is False

    typed = show(ctx, cache, runs["copy"], "text", out["shown"], "sampled", "3 1 2")  # Enter picks the typed input
    answer = greedy_answer(model, cfg, parse_probe(cfg, "3 1 2").batch)
    assert [r[1] for r in rows(typed["answer"])] == [t.predicted for t in answer.tokens]
    assert out["answer"].value["metadata"]["styling"][0][3].startswith("color: #")  # ✓ green, ✗ red
    assert typed["lens"].visible is True and "metrics" not in typed  # the held-out metrics do not depend on it
    api_table, _ = api_call(ctx, cache, "answer", runs["copy"], "typed", "3 1 2")
    assert api_table.value["data"] == typed["answer"].value["data"]


def test_apply_with_a_head_knocked_out_changes_the_metrics(ctx, runs):
    cache = MapCache()
    shown = show(ctx, cache, runs["copy"])["shown"]
    out = show(ctx, cache, runs["copy"], "apply", shown, heads=["0.0", "0.1"])
    table = {r[0]: r[1:] for r in rows(out["metrics"])}
    cfg, model = model_of(ctx, runs["copy"])
    report = ablation_report(model, cfg, Interventions(heads=(HeadRef(DEC_SELF, 0, 0), HeadRef(DEC_SELF, 0, 1))))
    intact, ablated = report["intact"]["eval"], report["ablated"]["eval"]
    assert table["loss (training lengths)"] == [f"{intact['loss']:.3f}", f"{ablated['loss']:.3f}"]
    assert ablated["loss"] > intact["loss"] and table["loss (training lengths)"][0] != table["loss (training lengths)"][1]
    assert "exact-match (longer lengths)" in table  # copy has longer lengths
    assert "knock out head 0.0 (zero)" in out["applied_note"] and out["ablated"].visible is True
    assert out["attn_dec_self"].visible is True and out["attn_enc_self"].visible is False

    reset = show(ctx, cache, runs["copy"], "reset", out["shown"], heads=["0.0"])
    assert reset["metrics"].visible is False and reset["ablated"].visible is False and reset["heads"].value == []


def test_a_click_on_an_importance_cell_knocks_that_head_out(ctx, runs):
    cache = MapCache()
    shown = show(ctx, cache, runs["copy"])["shown"]
    out = show(ctx, cache, runs["copy"], "importance", shown)
    grid = rows(out["grid"])
    assert [r[0] for r in grid] == ["layer 0", "layer 1"] and out["grid"].value["metadata"]["styling"][0][1]
    assert out["grid_note"].startswith("**Knocking out layer ")
    assert cache.get((runs["copy"], 300, "zero")) is not None  # computed once per run
    clicked = show(ctx, cache, runs["copy"], "cell", shown, cell=("layer 1", "head 0"))
    assert clicked["heads"] == ["1.0"] and clicked["applied_note"] == "Interventions applied: knock out head 1.0 (zero)."
    assert "metrics" not in show(ctx, cache, runs["copy"], "cell", shown, cell=("layer 1", "head -1"))  # label column


def test_changing_the_run_clears_every_panel(ctx, runs):
    cache = MapCache()
    shown = show(ctx, cache, runs["copy"])["shown"]
    show(ctx, cache, runs["copy"], "importance", shown)
    out = show(ctx, cache, runs["enc_dec"], "run", shown)
    assert all(out[k].visible is False for k in ("metrics", "ablated", "grid", "attn_dec_self"))
    assert out["applied_note"] == "" and out["grid_note"] == "" and out["gen_out"] == ""
    assert out["answer"].visible is True and out["gen_col"].visible is False  # no free generation for enc-dec
    assert {"enc.0.1", "cross.0.0", "0.1"} <= {c[1] for c in out["heads"].choices} and out["heads"].value == []
    assert out["skip_ff"].interactive is False and "d_ff = 0" in out["skip_ff"].label

    back = show(ctx, cache, runs["copy"], "run", out["shown"])  # the map cached for this run comes back
    assert back["grid"].visible is True and back["gen_col"].visible is True

    # the run change's own event dropped: an Apply that finds another run shown redraws, applies nothing
    stale = show(ctx, cache, runs["enc_dec"], "apply", back["shown"], heads=["1.1"])
    assert stale["metrics"].visible is False and stale["heads"].value == [] and stale["answer"].visible is True
    assert stale["shown"].startswith(runs["enc_dec"])

    queued = show(ctx, cache, runs["queued"], "run", stale["shown"])
    assert queued["answer"].visible is False and "no final weights yet" in queued["weights_note"]


def test_bad_controls_are_refused_naming_the_field(ctx, runs):
    cache = MapCache()
    shown = show(ctx, cache, runs["copy"])["shown"]
    page = errors_as_messages(lambda **kw: show(ctx, cache, runs["copy"], "apply", shown, **kw))
    for controls, label in ((dict(heads=["5.0"]), "Heads"), (dict(heads=["x"]), "Heads"), (dict(heads=[3]), "Heads"),
                            (dict(skip_block=["7"]), "Skip block"), (dict(mode="half"), "Knockout"),
                            (dict(positional="gone"), "Positional encoding")):
        assert message(page, **controls).startswith(f"{label}: "), controls
    api = errors_as_messages(lambda *a: api_call(ctx, cache, "intervene", *a))
    assert message(api, runs["copy"], "sampled", "", ["9.9"], "zero", [], [], "intact").startswith(
        "Heads: 9.9 is not a head of this model")
    assert message(api, runs["copy"], "typed", "z", [], "zero", [], [], "intact").startswith("Typed input: ")
    bad_typed = show(ctx, cache, runs["copy"], "text", shown, "typed", "z z")  # the page: the note beside the box
    assert bad_typed["answer_note"] == SEE_NOTE and bad_typed["lens"].visible is False


def test_free_generation_from_a_typed_prompt(ctx, runs):
    cache = MapCache()
    shown = show(ctx, cache, runs["copy"])["shown"]
    out = panel_update(ctx, cache, "generate", shown, runs["copy"], "sampled", "", prompt="3 1 2", temperature=0,
                       n_tokens=3, **CONTROLS)
    assert out["gen_out"] == api_call(ctx, cache, "generate", runs["copy"], "3 1 2", 0, 3)
    assert len(out["gen_out"].split()) == 3
    gen = errors_as_messages(lambda *a: api_call(ctx, cache, "generate", *a))
    assert message(gen, runs["copy"], "3 1", 0, 500).startswith("Tokens to generate: ")
    assert message(gen, runs["enc_dec"], "3 1", 0, 5).startswith("Generate: free generation needs a decoder run")


def test_the_panel_mounts_in_inspect_with_its_endpoints(ctx):
    with gr.Blocks() as demo:
        tab = build_inspect_tab(ctx)
    names = {d.api_name for d in demo.fns.values()}
    assert {"intervene_view", *API} <= names
    ids = {getattr(b, "elem_id", None) for b in _walk(tab)}
    assert {"answer-table", "intervene-heads", "intervene-apply", "intervene-reset", "intervene-metrics",
            "importance-btn", "importance-grid", "logit-lens", "generate-btn"} <= ids
    assert [p.elem_id for p in _walk(tab) if isinstance(p, gr.Plot) and p.show_label is not False] == []


def _walk(block):
    for child in getattr(block, "children", []):
        yield child
        yield from _walk(child)


def test_the_panel_follows_the_step_slider_to_the_weights_kept_then(ctx, runs):
    cache = MapCache()
    run_id = runs["copy"]
    cfg = ctx.store.config(run_id)
    shown = show(ctx, cache, run_id)["shown"]  # a new run: its final weights, whatever the slider holds
    at0 = show(ctx, cache, run_id, "drawn", shown, step=0)
    assert at0["weights_note"].startswith("Weights at step 0")
    init = load_model(cfg, {k: v.half().float() for k, v in load_model(cfg).state_dict().items()})
    answer = greedy_answer(init, cfg, sampled_probe(cfg).batch)
    assert [r[1] for r in rows(at0["answer"])] == [t.predicted for t in answer.tokens]  # the untrained model's
    applied_at0 = show(ctx, cache, run_id, "apply", at0["shown"], heads=["0.0"], step=0)
    intact_at0 = ablation_report(init, cfg, Interventions(heads=(HeadRef(DEC_SELF, 0, 0),)))["intact"]["eval"]
    assert rows(applied_at0["metrics"])[0][1] == f"{intact_at0['loss']:.3f}"
    back = show(ctx, cache, run_id, "drawn", at0["shown"], step=300)
    assert "Final weights (step 300)" in back["weights_note"]
    near = ctx.store.snapshot_near(run_id, 17)
    between = show(ctx, cache, run_id, "drawn", back["shown"], step=17)  # no snapshot there: the nearest one's,
    assert near != 17 and between["weights_note"].startswith(f"Weights at step {near}")  # as the heatmaps draw
    again = show(ctx, cache, run_id, "drawn", between["shown"], step=near)
    assert again["shown"] == between["shown"] and "answer" not in again  # the same weights: nothing redrawn
    typed = show(ctx, cache, run_id, "drawn", again["shown"], source="typed", text="3 1 2", step=0)
    assert "Final weights (step 300)" in typed["weights_note"]  # a typed input uses the final weights
