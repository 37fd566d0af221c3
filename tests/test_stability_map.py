"""The stability map (lab/views/stability_map.py; Compare's map, ui/compare/render.py stability_view): a grid's
final metric over two numeric axes, a panel per value of its other axes, seed repeats averaged, failed,
diverged and unlearned runs marked. Stored runs with made-up metrics (no training), read back through
Compare's one render event; the preset's claim is trained in tests/test_presets.py."""
from __future__ import annotations

import itertools
import json
import math

import pandas as pd
import pytest

from lab.engine.grid import build_grid
from lab.engine.store import RunStore
from lab.engine.jobs import JobManager
from lab.records import EXACT_MATCH, LOSS, EvalRecord, StepRecord
from lab.teach.presets import stability as preset
from lab.views.stability_map import RunFinal, cell_text, run_final, stability_map, stability_plot
from ui.common import AppContext
from lab.views.compare_frames import map_measure
from ui.compare.render import Controls, render
from tests.test_compare_labels import BASE


@pytest.fixture
def ctx(tmp_path):
    store = RunStore(tmp_path / "runs")
    yield AppContext(store=store, jobs=JobManager(store, max_concurrent=1))
    store.close()


def stored(ctx: AppContext, cfg, first: float, final: float, state: str = "completed") -> str:
    """A run of `cfg` whose batch loss starts at `first` and whose held-out loss ends at `final`."""
    run_id = ctx.store.create(cfg)
    ctx.store.append(run_id, StepRecord(1, first, 1e-3, 1.0, 64, 0.1, 100.0))
    ctx.store.append(run_id, StepRecord(2, final, 1e-3, 1.0, 128, 0.2, 100.0))
    ctx.store.append(run_id, EvalRecord(step=2, elapsed_s=0.2, tokens=128, loss=final, token_acc=0.5, exact_match=0.25))
    ctx.store.set_status(run_id, state, step=2)
    return run_id


def picked_map(ctx: AppContext, ids: list[str], metric: str = "held-out loss"):
    out = render(ctx, Controls.of([], ids, [metric], "step", 0.0, True, True), {})
    return out["stability"]


def traces(plot) -> list[dict]:
    """The heatmaps a gr.Plot update carries, as the page receives them."""
    return json.loads(plot.value["plot"])["data"]


def notes(plot) -> dict[tuple[str, str, str], str]:
    """What is written on the cells without a colour: {(x axis, x, y): text}, as the page receives it."""
    fig = json.loads(plot.value["plot"])
    xs, ys = fig["data"][0]["x"], fig["data"][0]["y"]  # a category axis places a note at the category's number
    return {(a["xref"], xs[a["x"]], ys[a["y"]]): a["text"] for a in fig["layout"].get("annotations", [])
            if a.get("xref") != "paper"}


def test_a_grid_over_two_numbers_maps_its_seed_means_a_panel_per_norm_and_marks_what_did_not_train(ctx):
    cfgs = build_grid(BASE, [("norm", "pre, post"), ("lr", "1e-3, 3e-2"), ("warmup", "0, 100"), ("seed", "0, 1")],
                      max_runs=64, max_axes=4)
    finals = {}
    for c in cfgs:  # post-LN at 3e-2 without warmup learns nothing; everything else trains, seed 1 a bit worse
        stuck = c.model.norm == "post" and c.train.lr == 3e-2 and c.train.warmup == 0
        finals[c.name] = 2.3 if stuck else 0.1 * (1 + c.train.seed) * (2 if c.train.lr == 3e-2 else 1)
    ids = {c.name: stored(ctx, c, 2.4, finals[c.name]) for c in cfgs}
    shown = picked_map(ctx, list(ids.values()))
    assert shown.visible
    pre, post = traces(shown)
    assert (pre["name"], post["name"]) == ("pre-LN", "post-LN")
    assert pre["x"] == ["0.001", "0.03"] and pre["y"] == ["0", "100"]
    # z[warmup][lr]: seeds 0 and 1 averaged (0.1 and 0.2; at 3e-2 twice that)
    assert pre["z"] == [pytest.approx([0.15, 0.3]), pytest.approx([0.15, 0.3])]
    assert post["z"][0][1] is None and post["text"][0][1] == ""  # no colour, no number: its reason on grey
    assert notes(shown) == {("x2", "0.03", "0"): "✕ did not<br>learn (2)"}
    assert post["z"][1][1] == pytest.approx(0.3) and post["text"][1][1] == "0.3<br>n=2"

    # another curve: the map follows it (exact-match, higher is better); a run's batch loss is not averaged in
    em = traces(picked_map(ctx, list(ids.values()), "held-out exact-match"))
    assert em[0]["z"][0][0] == pytest.approx(0.25) and em[1]["z"][0][1] is None
    assert not json.loads(picked_map(ctx, list(ids.values()), "held-out exact-match").value["plot"])[
        "layout"]["coloraxis"]["reversescale"]


def test_cells_average_seeds_and_say_why_a_cell_is_marked():
    rows = {f"r{i}": {"model.norm": n, "train.lr": lr, "train.warmup": w, "train.seed": s, "state": "completed"}
            for i, (n, lr, w, s) in enumerate((n, lr, w, s) for n in ("pre", "post") for lr in (1e-3, 3e-2)
                                               for w in (0, 100) for s in (0, 1))}
    finals = {r: RunFinal("completed", 0.1 + row["train.seed"] * 0.1, first_loss=2.4,
                          final_loss=0.1 + row["train.seed"] * 0.1) for r, row in rows.items()}
    for r, row in rows.items():
        if row["model.norm"] == "post" and row["train.lr"] == 3e-2 and row["train.warmup"] == 0:
            finals[r] = RunFinal("completed", 2.3, first_loss=2.4, final_loss=2.3)  # did not learn
        if row["model.norm"] == "pre" and row["train.lr"] == 3e-2 and row["train.warmup"] == 0 and row["train.seed"]:
            finals[r] = RunFinal("completed", math.nan, diverged=True, first_loss=2.4, final_loss=math.nan)
        if row["model.norm"] == "pre" and row["train.lr"] == 1e-3 and row["train.warmup"] == 100 and row["train.seed"]:
            finals[r] = RunFinal("failed", None)
    m = stability_map(rows, finals.__getitem__)
    assert (m.x, m.y) == ("train.lr", "train.warmup")
    assert m.panels == ((("model.norm", "pre"),), (("model.norm", "post"),))
    assert m.xs == (1e-3, 3e-2) and m.ys == (0, 100)
    pre, post = m.panels
    assert m.cell(pre, 1e-3, 0).mean == pytest.approx(0.15) and m.cell(pre, 1e-3, 0).runs == 2
    assert cell_text(m.cell(pre, 1e-3, 0)) == "0.15<br>n=2"
    stuck = m.cell(post, 3e-2, 0)
    assert stuck.mean is None and stuck.marks == ("did not learn", "did not learn")
    assert cell_text(stuck) == "✕ did not<br>learn (2)"
    half = m.cell(pre, 3e-2, 0)  # one seed diverged: the mean is the other seed's, the cell says so
    assert half.mean == pytest.approx(0.1) and cell_text(half) == "0.1<br>✕ 1 of 2<br>diverged"
    assert cell_text(m.cell(pre, 1e-3, 100)) == "0.1<br>✕ 1 of 2<br>failed"

    fig = stability_plot(m, "held-out loss", lower_is_better=True)
    assert [t.name for t in fig.data] == ["pre-LN", "post-LN"]
    assert list(fig.data[1].x) == ["0.001", "0.03"] and list(fig.data[1].y) == ["0", "100"]
    assert fig.data[1].z[0][1] is None and fig.data[1].text[0][1] == ""  # (warmup 0, lr 0.03): written on grey
    written = {(a.xref, fig.data[1].x[a.x], fig.data[1].y[a.y]): a.text for a in fig.layout.annotations
               if a.xref != "paper"}
    assert written == {("x2", "0.03", "0"): "✕ did not<br>learn (2)"}
    assert fig.data[0].z[1][0] == pytest.approx(0.1)  # pre, warmup 100, lr 1e-3: the seed that did not fail
    assert fig.layout.coloraxis.reversescale is True  # a loss: lower is brighter
    assert fig.layout.xaxis2.title.text == "Learning rate" and fig.layout.xaxis.title.text is None  # the bottom panel's
    assert fig.layout.yaxis.title.text == fig.layout.yaxis2.title.text == "Warmup steps"


def test_no_map_without_two_numeric_settings_or_with_too_many_panels():
    def rows(**cols):
        keys = list(cols)
        n = len(cols[keys[0]])
        return {f"r{i}": {k: cols[k][i] for k in keys} | {"state": "completed"} for i in range(n)}
    final = lambda r: RunFinal("completed", 0.1)  # noqa: E731
    assert stability_map(rows(**{"train.lr": [1e-3, 3e-3, 1e-2, 3e-2], "model.norm": ["pre", "post"] * 2}), final) is None
    assert stability_map(rows(**{"train.lr": [1e-3, 3e-3] * 2, "train.seed": [0, 0, 1, 1]}), final) is None
    assert stability_map(rows(**{"train.lr": [1e-3, 3e-3] * 2, "model.n_layers": [1, 1, 2, 2]}), final) is not None
    combos = list(itertools.product(("pre", "post"), (1e-3, 3e-3), (2, 4), (1, 2), (16, 32)))
    many = {f"r{i}": {"model.norm": n, "train.lr": lr, "model.n_heads": h, "model.n_layers": nl, "model.d_model": d,
                      "state": "completed"} for i, (n, lr, h, nl, d) in enumerate(combos)}
    assert stability_map({r: v for r, v in many.items() if v["model.n_heads"] == 2}, final).panels == tuple(
        ((("model.norm", n), ("train.lr", lr)) for n in ("pre", "post") for lr in (1e-3, 3e-3)))  # 4 panels
    assert stability_map(many, final) is None  # 2 norms x 2 heads x 2 rates = 8 panels: past MAX_PANELS


def test_a_final_loss_that_went_nan_is_the_runs_final_value_not_the_last_finite_one():
    metrics = pd.DataFrame([
        {"kind": "train", "step": 1, LOSS: 2.4}, {"kind": "eval", "step": 50, LOSS: 1.2, EXACT_MATCH: 0.1},
        {"kind": "train", "step": 60, "loss": math.inf}, {"kind": "eval", "step": 100, "loss": math.nan,
                                                           EXACT_MATCH: 0.0}])
    f = run_final(metrics, "eval", "loss", "completed")
    assert math.isnan(f.value) and f.diverged and f.mark == "diverged"
    ok = run_final(metrics.iloc[:2], "eval", EXACT_MATCH, "completed")
    assert ok.value == 0.1 and not ok.diverged and ok.mark == "" and ok.first_loss == 2.4 and ok.final_loss == 1.2
    assert run_final(pd.DataFrame(), "eval", "loss", "queued") == RunFinal("queued", None)


def test_compare_draws_the_map_for_a_grid_and_hides_it_for_other_runs(ctx):
    cfgs = build_grid(BASE, [("lr", "1e-3, 3e-2"), ("warmup", "0, 100")])
    ids = [stored(ctx, c, 2.4, 2.3 if c.train.lr == 3e-2 and not c.train.warmup else 0.2) for c in cfgs]
    shown = picked_map(ctx, ids)
    assert shown.visible
    (only,) = traces(shown)
    assert only["name"] == "all runs" and notes(shown) == {("x", "0.03", "0"): "✕ did not<br>learn"}
    assert not picked_map(ctx, ids[:2]).visible  # two runs: one numeric setting varies


def test_the_map_is_coloured_by_a_whole_set_measure_never_one_training_batch(ctx):
    """Issue 34 item 2: with Compare's default curve (the batch loss) a post-LN grid was coloured by its last
    batch, 0.0098, while its held-out loss was 0.81. The map reads the first picked curve measured on a whole
    set at the evaluations, else the held-out loss, and its title says which set."""
    cfgs = build_grid(BASE, [("lr", "1e-3, 3e-2"), ("warmup", "0, 100")])
    ids = [stored(ctx, c, 2.4, 0.8 if c.train.lr == 3e-2 else 0.2) for c in cfgs]
    for run_id in ids:  # the last batch, after the last evaluation: far below the held-out loss
        ctx.store.append(run_id, StepRecord(3, 0.0098, 1e-3, 1.0, 192, 0.3, 100.0))
    assert traces(picked_map(ctx, ids, "held-out loss"))[0]["z"] == [pytest.approx([0.2, 0.8])] * 2
    batch = picked_map(ctx, ids, "train loss (batch)")
    layout = json.loads(batch.value["plot"])["layout"]
    assert layout["title"]["text"].startswith("Stability map: final held-out loss<br>")
    assert "on the whole held-out set at the last evaluation" in layout["title"]["text"]
    assert traces(batch)[0]["z"] == [pytest.approx([0.2, 0.8])] * 2  # the held-out losses, not the batch's
    out = render(ctx, Controls.of([], ids, ["train loss (batch)", "train exact-match"], "step", 0.0, True, True), {})
    title = json.loads(out["stability"].value["plot"])["layout"]["title"]["text"]
    assert title.startswith("Stability map: final train exact-match<br>") and "whole training set" in title
    assert map_measure(["train loss (batch)"]) == "held-out loss"
    assert map_measure(["held-out exact-match (longer lengths)", "held-out loss"]) == \
        "held-out exact-match (longer lengths)"


def test_the_preset_is_the_grid_and_its_explanation_quotes_the_region():
    runs = preset.configs()
    assert len(runs) == 24 and len({c.name for c in runs}) == 24
    assert {c.model.norm for c in runs} == {"pre", "post"} and {c.train.warmup for c in runs} == {0, 50, 150}
    results = {c.name: {"eval": {"loss": 0.1}} for c in runs}
    results[preset.name("post", 0, 3e-2)] = {"eval": {"loss": 2.29}}
    results[preset.name("post", 0, 1e-1)] = {"eval": {"loss": 2.29}}
    results[preset.name("pre", 0, 1e-1)] = {"eval": {"loss": 0.9}}  # pre-LN too fails at 0.1: not in the region
    results[preset.name("post", 50, 3e-2)] = {"eval": {"loss": 2.0}}
    results[preset.name("post", 150, 3e-2)] = {"eval": {"loss": 0.5}}
    assert preset.failing_region(results) == [3e-2]
    text = preset.explain(results)
    assert text.startswith("Without warmup, post-LN learned nothing at learning rate 0.03 (held-out loss 2.29) where "
                           "pre-LN trained (0.10): that is the map's failing region. ")  # the finding first: the
    # headline projector mode shows
    assert "at 0.03, post-LN ended at 0 warmup steps 2.29, 50 warmup steps 2.00, 150 warmup steps 0.50" in text
    results[preset.name("post", 0, 3e-2)] = {"eval": {"loss": 0.2}}
    results[preset.name("post", 0, 1e-1)] = {"eval": {"loss": 0.3}}
    assert preset.failing_region(results) == []
    text = preset.explain(results)
    assert text.startswith("This time no learning rate had both post-LN learning nothing without warmup (held-out "
                           "loss at least 2.07)"), text
    assert "The widest gap was at 0.03: pre-LN 0.10, post-LN 0.20." in text and "not the preset's" not in text, text
    short = {n: v | {"steps": 60} for n, v in results.items()}
    assert "after 60 steps" in preset.explain(short) and "trained 60 steps, not the preset's 200" in preset.explain(short)
