"""Ablation grids (lab/engine/grid.py): configs, names, refusals, the cap, the time estimate; grouping of
seed repeats into mean/min/max bands on tiny real stored runs; Compare's labels and the parameter
figure's legend (both fixed with the grid work)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from lab.params import param_breakdown
from lab.config import RunConfig, flatten
from lab.engine.grid import AXES, MAX_RUNS, GridError, build_grid, parse_values
from lab.views.seed_groups import group_runs, varied_columns
from lab.engine.jobs import JobManager
from lab.engine.recorder import record_run
from lab.views.plots import bands_figure, params_figure, to_png
from lab.engine.store import RunStore
from lab.views.run_labels import short_label
from ui.common import AppContext
from ui.compare.render import LIVE_POLL_S, WATCH_POLL_S, Controls, render
from lab.views.compare_frames import band, curve_series, long_curves, read_selection, seed_groups
from ui.knobs import config_from_values
from tests.helpers import tiny_config
from lab.records import EXACT_MATCH

BASE = config_from_values({"task.name": "copy", "task.max_len": 4, "model.d_model": 16, "model.n_heads": 2,
                           "model.n_layers": 1, "model.d_ff": 32, "train.steps": 12, "train.batch_size": 8})


# ---- building a grid ----------------------------------------------------------------------------
def test_two_axes_and_seeds_make_every_combination_named_by_its_values():
    cfgs = build_grid(BASE, [("PE", "rope, alibi"), ("norm", ["pre", "post"]), ("seed", "1 2")])
    assert len(cfgs) == 8
    assert [c.name for c in cfgs[:3]] == ["pos=rope norm=pre seed=1", "pos=rope norm=pre seed=2",
                                          "pos=rope norm=post seed=1"]
    assert len({c.name for c in cfgs}) == 8
    for c in cfgs:
        values = dict(part.split("=") for part in c.name.split())
        assert (c.model.pos, c.model.norm, str(c.train.seed)) == (values["pos"], values["norm"], values["seed"])
        # everything else is the base config
        assert replace(c, name="", model=replace(c.model, pos=BASE.model.pos, norm=BASE.model.norm),
                       train=replace(c.train, seed=BASE.train.seed)) == BASE


@pytest.mark.parametrize("axis", list(AXES))
def test_every_axis_sets_its_field(axis):
    values = {"PE": "sinusoidal, none", "norm": "post, none", "heads": "1, 4", "layers": "1, 3",
              "d_model": "16, 32", "seed": "0, 5", "activation": "relu, swiglu", "d_head": "4, 16",
              "scaling": "sqrt, none", "residual": "on, off", "norm type": "layernorm, rmsnorm",
              "QK-norm": "off, on", "random positions": "0, 64", "arch": "decoder, rnn", "lr": "0.001, 0.03", "warmup": "0, 50"}[axis]
    cfgs = build_grid(BASE, [(axis, values)])
    sec, name = AXES[axis].field.split(".")
    got = [getattr(getattr(c, sec), name) for c in cfgs]
    assert [str(v) for v in got] == [v.strip() for v in values.split(",")]
    assert [c.name for c in cfgs] == [f"{AXES[axis].short}={v.strip()}" for v in values.split(",")]


@pytest.mark.parametrize(("axes", "field", "words"), [
    ([("PE", "rope, rop")], "grid.PE", ["'rop'", "sinusoidal, learned, rope, alibi, none"]),
    ([("norm", "pre, sideways")], "grid.norm", ["'sideways'", "pre, post, none"]),
    ([("heads", "3")], "grid.heads", ["heads=3", "model.d_model", "not divisible"]),
    ([("PE", "rope"), ("heads", "2, 16")], "grid", ["pos=rope heads=16", "'rope' needs an even head dimension"]),
    ([("layers", "0, 1")], "grid.layers", ["0 is out of range"]),
    ([("layers", "1, two")], "grid.layers", ["'two' is not an integer"]),
    ([("seed", "1, 1")], "grid.seed", ["listed twice"]),
    ([("lr", "0, 1e-3")], "grid.lr", ["0 is out of range", "above 0 to 10"]),
    ([("lr", "1e-3, fast")], "grid.lr", ["'fast' is not a number", "above 0 to 10"]),
    ([("lr", "nan")], "grid.lr", ["nan is out of range"]),
    ([("lr", "1e-3, 0.001")], "grid.lr", ["listed twice"]),
    ([("warmup", "0, 1.5")], "grid.warmup", ["'1.5' is not an integer", "0 or more"]),
    ([("seed", "")], "grid.seed", ["no values"]),
    ([("PE", "rope"), ("PE", "alibi")], "grid.PE", ["chosen twice"]),
    ([("width", "1")], "grid.axis", ["'width'", "arch, PE, norm, heads, layers, d_model, activation, d_head, "
                                      "scaling, residual, norm type, QK-norm, random positions, lr, warmup, seed"]),
    ([], "grid", ["at least one axis"]),
    ([("PE", "rope"), ("norm", "pre"), ("seed", "1"), ("layers", "1")], "grid", ["4 axes", "1 to 3"]),
])
def test_invalid_grids_are_refused_naming_axis_and_value(axes, field, words):
    with pytest.raises(GridError) as err:
        build_grid(BASE, axes)
    assert err.value.field == field and str(err.value).startswith(field + ": ")
    for w in words:
        assert w in str(err.value), str(err.value)


def test_the_cap_on_runs():
    assert len(build_grid(BASE, [("seed", list(range(16))), ("norm", "pre post")])) == MAX_RUNS == 32
    with pytest.raises(GridError, match=r"^grid: 11 x 3 = 33 runs is over the cap of 32"):
        build_grid(BASE, [("seed", list(range(11))), ("norm", "pre post none")])


def test_parse_values_keeps_order_and_types():
    assert parse_values("seed", "3, 1  2") == (3, 1, 2)
    assert parse_values("PE", ["alibi", " rope "]) == ("alibi", "rope")
    assert parse_values("seed", "0") == (0,)  # seeds may be 0; other integer axes start at 1
    with pytest.raises(GridError, match="heads.*out of range"):
        parse_values("heads", "0")


# ---- grouping seed repeats ----------------------------------------------------------------------
def test_group_runs_by_everything_but_the_seed():
    cfgs = build_grid(BASE, [("PE", "rope, alibi"), ("seed", "1, 2, 3")])
    flat = {f"r{i}": flatten(c) for i, c in enumerate(cfgs)}
    assert varied_columns(flat) == ["model.pos", "train.seed"]  # the name differs too but never counts
    groups = group_runs(flat)
    assert list(groups) == [(("model.pos", "rope"),), (("model.pos", "alibi"),)]
    assert groups[(("model.pos", "rope"),)] == ["r0", "r1", "r2"]  # seed repeats: a group of more than one run
    assert all(len(g) == 1 for g in group_runs({k: v for k, v in flat.items() if k in ("r0", "r3")}).values())


def test_band_is_mean_min_max_over_the_steps_every_run_reached():
    a = pd.DataFrame({"step": [1, 2, 3], "x": [1, 2, 3], "value": [3.0, 2.0, 1.0]})
    b = pd.DataFrame({"step": [1, 2], "x": [1, 2], "value": [5.0, 0.0]})  # still running: no step 3 yet
    out = band([a, b])
    assert list(out["step"]) == [1, 2] and list(out["mean"]) == [4.0, 1.0]
    assert list(out["lo"]) == [3.0, 0.0] and list(out["hi"]) == [5.0, 2.0] and set(out["n"]) == {2}
    assert band([a, b.iloc[:0]]).empty


def run_labels(ctx: AppContext, run_ids: list[str]) -> dict[str, str]:
    """The picked runs' labels, as Compare names them."""
    return read_selection(ctx.store, run_ids, metrics=False, configs=False).labels


def group_frames(ctx: AppContext, run_ids: list[str], metric: str, x: str, smoothing: float):
    """Compare's seed groups of `run_ids`: the band frame and the group table."""
    return seed_groups(read_selection(ctx.store, run_ids), metric, x, smoothing)


@pytest.fixture(scope="module")
def grid_store(tmp_path_factory):
    """2 PEs x 2 seeds of a tiny model, really trained (about a second each)."""
    store = RunStore(tmp_path_factory.mktemp("grid") / "runs")
    cfgs = build_grid(tiny_config(BASE, steps=12, eval_every=4, eval_samples=16, snapshots=0),
                      [("PE", "rope, alibi"), ("seed", "1, 2")])
    ids = [store.create(c) for c in cfgs]
    for r in ids:
        record_run(store, r, threads=1)
    return AppContext(store=store, jobs=JobManager(store, max_concurrent=1)), ids


def test_group_frames_on_real_runs(grid_store):
    ctx, ids = grid_store
    bands, table = group_frames(ctx, ids, "held-out loss", "step", 0.0)
    assert list(table["group"]) == ["rope (2 seeds)", "alibi (2 seeds)"]
    assert list(table["runs"]) == [2, 2] and list(table["seeds"]) == ["1, 2", "1, 2"]
    assert list(table["finished"]) == [2, 2]
    for group, members in zip(table["group"], (ids[:2], ids[2:])):
        got = bands[bands["group"] == group].set_index("step")
        evals = [ctx.store.metrics(r).query("kind == 'eval'").set_index("step")["loss"] for r in members]
        both = pd.concat(evals, axis=1)
        assert list(got.index) == [4, 8, 12]
        np.testing.assert_allclose(got["mean"], both.mean(axis=1))
        np.testing.assert_allclose(got["lo"], both.min(axis=1))
        np.testing.assert_allclose(got["hi"], both.max(axis=1))
        finals = [ctx.store.summary(r)["eval"][EXACT_MATCH] for r in members]
        assert table.set_index("group").loc[group, "held-out exact-match"] == (
            f"{np.mean(finals):.3f} [{min(finals):.3f}, {max(finals):.3f}]")
    # time on the x-axis: runs differ in time, so x is their mean at each step
    tb, _ = group_frames(ctx, ids[:2], "train loss (batch)", "time (s)", 0.0)
    times = [ctx.store.metrics(r).query("kind == 'train'").set_index("step")["elapsed_s"] for r in ids[:2]]
    np.testing.assert_allclose(tb["x"], pd.concat(times, axis=1, join="inner").mean(axis=1))


def test_the_live_timer_stays_on_when_a_run_finishes_while_a_tick_reads_it(grid_store, monkeypatch):
    """A run that ends between a tick's reads: the tick drew its curve cut short, so the timer must
    stay on for one more tick (which reads the whole curve and then turns it off)."""
    ctx, ids = grid_store
    ctx.store.set_status(ids[0], "running")  # live, stamped with this (alive) process
    read = ctx.store.metrics

    def finishing(run_id: str) -> pd.DataFrame:
        if ctx.store.status(run_id)["state"] == "running":
            ctx.store.set_status(run_id, "completed")  # it ends just as the tick reads its metrics
        return read(run_id)

    monkeypatch.setattr(ctx.store, "metrics", finishing)
    c = Controls.of([None] * 4, ids, "held-out loss", "step", 0.0, True, True)
    out = render(ctx, c, {})
    assert out["timer"]["value"] == LIVE_POLL_S and ctx.store.status(ids[0])["state"] == "completed"
    assert {t.name for t in out["curves"].data} == set(run_labels(ctx, ids).values()) and len(out["finals"].data) == 4
    assert set(out["table"]["run"]) == set(ids)  # the stored-runs table, refreshed by the same tick
    out = render(ctx, c, out["shown"])
    assert out["timer"]["value"] == WATCH_POLL_S  # the next tick read every run finished: back to watching
    assert out["groups"].visible and out["bands"].visible


def test_curves_list_their_runs_in_the_selection_order_even_before_a_run_has_points(grid_store, monkeypatch):
    """The curves' colours follow the selection's order, as the tables' colour bars do: a run with no
    points yet keeps its place, its colour and its name in the legend."""
    ctx, ids = grid_store
    read = ctx.store.metrics
    monkeypatch.setattr(ctx.store, "metrics", lambda r: read(r).iloc[:0] if r == ids[0] else read(r))
    fig = render(ctx, Controls.of([None] * 4, ids, "held-out loss", "step", 0.0, True, True), {})["curves"]
    assert [t.name for t in fig.data] == list(run_labels(ctx, ids).values())
    assert len(fig.data[0].x) == 0 and all(len(t.x) for t in fig.data[1:])  # drawn as nothing, still named
    assert [t.line.color for t in fig.data] == ["#4c78a8", "#f58518", "#e45756", "#72b7b2"]


def test_compare_labels_lead_with_what_differs(grid_store):
    ctx, ids = grid_store
    labels = run_labels(ctx, ids)
    assert [labels[r] for r in ids] == [f"{pe} s{s} ({r[-6:]})" for (pe, s), r in
                                       zip([("rope", 1), ("rope", 2), ("alibi", 1), ("alibi", 2)], ids)]
    assert all(len(v) <= 25 for v in labels.values())  # vega cuts legend labels at ~160 px
    curves = long_curves(curve_series(read_selection(ctx.store, ids), ["held-out loss"], "step",
                                      0.0)[0])
    assert set(curves["run"]) == set(labels.values())
    one = run_labels(ctx, ids[:1])[ids[0]]  # alone: what it is (the grid's name only restates values)
    assert one == f"rope pre-LN L1 s1 copy ({ids[0][-6:]})"
    row = {"run_id": "x-abcdef", **flatten(RunConfig())}
    assert short_label(row) == "learned pre-LN L2 s0 reverse (abcdef)"


def test_params_legend_stays_inside_the_figure():
    cfg = RunConfig()
    long = {f"reverse dec sinusoidal pre-LN L2 s0 with a long name ({i:06d})": param_breakdown(cfg) for i in range(3)}
    fig = params_figure(long)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # lays the figure out, as saving it does
    legend = fig.axes[0].get_legend().get_window_extent(canvas.get_renderer())
    width, height = fig.bbox.width, fig.bbox.height
    assert 0 <= legend.x0 and legend.x1 <= width and legend.y1 <= height, (legend, width, height)


def test_bands_figure_draws_a_mean_line_and_a_band_per_group():
    df = pd.DataFrame({"group": ["a"] * 3 + ["b"] * 3, "x": [1, 2, 3] * 2, "mean": [3.0, 2.0, 1.0, 2.0, 1.5, 1.0],
                       "lo": [2.5, 1.5, 0.5, 1.8, 1.2, 0.9], "hi": [3.5, 2.5, 1.5, 2.2, 1.8, 1.1]})
    fig = bands_figure(df, "step", "eval loss")
    ax = fig.axes[0]
    assert len(ax.lines) == 2 and len(ax.collections) == 2  # 2 mean lines, 2 fill_between bands
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), [2.0, 1.5, 1.0])
    band_path = ax.collections[0].get_paths()[0].vertices
    assert band_path[:, 1].min() == 0.5 and band_path[:, 1].max() == 3.5
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"]
    empty = bands_figure(df.iloc[:0], "step", "eval loss")
    assert "No points yet" in empty.axes[0].texts[0].get_text() and to_png(empty).startswith(b"\x89PNG")
