"""Compare's names and views (lab/views/run_labels.py label_runs, ui/compare/tab.py, lab/views/compare_frames.py), on stored runs
that are not trained (configs and states only; curves from made-up metrics where needed).

A run is named by what tells it from the runs shown with it: its own name if it has one (presets name
their runs; the grid's names only restate values, so they read as values), else the config fields that
differ, labelled as the UI labels them, the same in the picker, the legend, every table and the group
names. The live timer keeps the stored-runs table in step with the store, and the views of the selection
until they show the state the store has. The train loss is smoothed by default; nothing on the tab reads
like code or shows a placeholder before a selection.
"""
from __future__ import annotations

from dataclasses import replace

import gradio as gr
import numpy as np
import pandas as pd
import pytest

from lab.config import RunConfig
from lab.engine.jobs import JobManager
from lab.engine.store import RunStore
from lab.engine.grid import build_grid
from lab.views.curves import curve
from lab.views.run_labels import GROUP_CHARS, LEGEND_CHARS
from ui.common import AppContext
from ui.compare.tab import build_compare_tab, export
from ui.compare.render import LIVE_POLL_S, WATCH_POLL_S, Controls, render
from lab.views.compare_frames import (FILTER_LABELS, FILTER_PARAMS, SMOOTHING, choices, final_tables,
                                      read_selection, seed_groups)
from ui.knobs import KNOBS, config_from_values

WATCHING = {"__type__": "update", "active": True, "value": WATCH_POLL_S}  # nothing live: the timer watches


def run_labels(ctx: AppContext, run_ids: list[str]) -> dict[str, str]:
    """The picked runs' labels, as Compare names them."""
    return read_selection(ctx.store, run_ids, metrics=False, configs=False).labels


def finals_and_configs(ctx: AppContext, run_ids: list[str], diff_only: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    return final_tables(read_selection(ctx.store, run_ids, metrics=False, configs=False), diff_only)


def groups_of(ctx: AppContext, run_ids: list[str], metric: str, x: str, smoothing: float):
    """Compare's seed groups of `run_ids`: the band frame and the group table."""
    return seed_groups(read_selection(ctx.store, run_ids), metric, x, smoothing)


BASE = config_from_values({"task.name": "copy", "task.max_len": 4, "model.d_model": 16, "model.n_heads": 2,
                           "model.n_layers": 1, "model.d_ff": 32, "train.steps": 12, "train.batch_size": 8})


@pytest.fixture
def ctx(tmp_path):
    store = RunStore(tmp_path / "runs")
    yield AppContext(store=store, jobs=JobManager(store, max_concurrent=1))
    store.close()


def add(ctx: AppContext, cfg: RunConfig, state: str = "completed", **fields) -> str:
    run_id = ctx.store.create(cfg)
    ctx.store.set_status(run_id, state, **fields)
    return run_id


def change(cfg: RunConfig, name: str = "", **values) -> RunConfig:
    """`cfg` with flat values changed ({"model.n_layers": 2}) and `name`."""
    return replace(config_from_values(values, cfg), name=name)


def listing(ctx: AppContext) -> pd.DataFrame:
    return ctx.store.list().set_index("run_id")


# ---- names (item 7) -----------------------------------------------------------------------------
def test_grid_runs_read_as_their_values_and_named_runs_by_their_name(ctx):
    grid = [add(ctx, c) for c in build_grid(BASE, [("PE", "rope, alibi"), ("seed", "1, 2")])]
    assert [ctx.store.config(r).name for r in grid[:2]] == ["pos=rope seed=1", "pos=rope seed=2"]
    labels = run_labels(ctx, grid)
    assert [labels[r] for r in grid] == [f"{pe} s{s} ({r[-6:]})" for (pe, s), r in
                                        zip([("rope", 1), ("rope", 2), ("alibi", 1), ("alibi", 2)], grid)]
    alone = run_labels(ctx, grid[:1])[grid[0]]  # alone: what the run is, not "pos=rope seed=1"
    assert "=" not in alone and alone.startswith("rope pre-LN L1 s1") and alone.endswith(f"({grid[0][-6:]})")

    # a preset's runs keep their names ("1 layer" in the picker is "1 layer" in the legend), beside a run
    # without a name, which reads as what differs from them
    one = add(ctx, change(BASE, "1 layer"))
    two = add(ctx, change(BASE, "2 layers", **{"model.n_layers": 2}))
    plain = add(ctx, change(BASE, **{"model.n_layers": 3}))
    labels = run_labels(ctx, [one, two, plain])
    assert labels == {one: f"1 layer ({one[-6:]})", two: f"2 layers ({two[-6:]})", plain: f"L3 ({plain[-6:]})"}
    twice = add(ctx, change(BASE, "1 layer", **{"train.seed": 7}))  # one preset run twice: its name and the seed
    assert run_labels(ctx, [one, twice]) == {one: f"1 layer s0 ({one[-6:]})", twice: f"1 layer s7 ({twice[-6:]})"}


def test_labels_lead_with_what_tells_runs_apart_and_read_like_the_ui(ctx):
    # an induction-like run against a copy run: a dozen fields differ; the task tells them apart
    other = change(BASE, **{"task.name": "induction", "task.min_len": 32, "task.max_len": 32, "task.n_symbols": 64,
                            "model.d_ff": 0, "model.n_layers": 2, "model.d_model": 64, "train.lr": 0.001})
    a, b = add(ctx, BASE), add(ctx, other)
    labels = run_labels(ctx, [a, b])
    assert labels[a].startswith("copy ") and labels[b].startswith("induction ")
    assert all(len(v) <= LEGEND_CHARS and "=" not in v for v in labels.values()), labels
    # fields outside the short forms are named by their label in the UI; the grid's lr and warmup axes by their
    # short names, as a grid names its runs (lr=0.01)
    wd, clip = add(ctx, change(BASE, **{"train.weight_decay": 0.5})), add(ctx, change(BASE, **{"train.grad_clip": 0.0}))
    labels = run_labels(ctx, [a, wd, clip])
    assert labels[wd].startswith("weight decay 0.5 ") and "gradient clip 0" in labels[clip], labels
    assert not any(code in v for v in labels.values() for code in ("=", "weight_decay", "_")), labels
    lr, warm = add(ctx, change(BASE, **{"train.lr": 0.01})), add(ctx, change(BASE, **{"train.warmup": 0}))
    labels = run_labels(ctx, [a, lr, warm])
    assert labels[lr].startswith("lr 0.01 ") and labels[warm].startswith("lr 0.003 warmup 0 "), labels


def test_the_picker_names_picked_runs_as_the_curves_and_tables_do(ctx):
    ids = [add(ctx, c) for c in build_grid(BASE, [("PE", "rope, alibi"), ("seed", "1, 2")])]
    ids.append(add(ctx, change(BASE, "my run", **{"model.pos": "none"})))
    picked = ids[1:]
    labels = run_labels(ctx, picked)
    offered = {r: text for text, r in choices(ctx.store.list(), picked)}
    assert {r: offered[r] for r in picked} == labels  # the picker's tokens are the legend's names
    assert offered[ids[0]].endswith(f"({ids[0][-6:]})") and "=" not in offered[ids[0]]  # not picked: in full
    finals, configs = finals_and_configs(ctx, picked, True)
    legend = [t.name for t in render(ctx, controls(picked), {})["curves"].data]
    assert set(legend) == set(finals["run"]) == set(configs["run"]) == set(labels.values())
    hidden = choices(ctx.store.list().iloc[:1], picked, ctx.store.list())  # a filter hides the picked runs
    assert [r for _, r in hidden][:len(picked)] == picked and {r: t for t, r in hidden}[ids[1]] == labels[ids[1]]


def test_the_names_of_the_runs_shown_stay_as_the_store_grows(ctx):
    """Issue 34 item 9: a run's name in Compare depends on the runs shown with it, never on what else is
    stored: runs trained by others (a class on one server), even ones that differ in fields the shown runs
    share, leave the picker's tokens, the legend and the unpicked runs' names as they were."""
    ids = [add(ctx, c) for c in build_grid(BASE, [("PE", "rope, alibi")])]
    picked = ids[:2]

    def names() -> tuple:
        legend = [t.name for t in render(ctx, controls(picked), {})["curves"].data]
        return dict(choices(ctx.store.list(), picked)), run_labels(ctx, picked), sorted(legend)

    before = names()
    assert len(before[0]) == 2 and len(before[2]) == 2, before  # both picked, both in the legend
    for values in ({"model.n_layers": 3}, {"train.seed": 9, "model.pos": "rope"}, {"task.name": "reverse"}):
        add(ctx, change(BASE, **values))  # another student's run, stored after
        add(ctx, change(BASE, "1 layer", **values))
    after = names()
    assert {k: v for k, v in after[0].items() if k in before[0]} == before[0] and after[1:] == before[1:]


def test_group_names_read_like_their_runs_without_the_seed(ctx):
    grid = [add(ctx, c) for c in build_grid(BASE, [("PE", "rope, alibi"), ("norm", "pre, post"), ("seed", "1, 2")])]
    _, table = groups_of(ctx, grid, "train loss", "step", 0.0)
    assert list(table["group"]) == ["rope pre-LN (2 seeds)", "rope post-LN (2 seeds)", "alibi pre-LN (2 seeds)",
                                    "alibi post-LN (2 seeds)"]
    assert list(table["seeds"]) == ["1, 2"] * 4
    # named repeats (one preset run with two seeds) keep the name; runs that differ in a dozen fields get a
    # name that tells the groups apart in words, not "learned h2 L2 d64 d_ff=0 n_ctx=63 i…"
    sort = [add(ctx, change(BASE, "sort", **{"task.name": "sort", "train.seed": s})) for s in (2, 1)]
    far = add(ctx, change(BASE, **{"task.name": "induction", "task.min_len": 32, "task.max_len": 32,
                                   "model.d_ff": 0, "model.n_heads": 4, "model.d_model": 64, "train.lr": 0.001}))
    _, table = groups_of(ctx, [*sort, far, grid[0]], "train loss", "step", 0.0)
    names = list(table["group"])
    assert names[0] == "sort (2 seeds)" and table["seeds"].iloc[0] == "1, 2"
    assert names[1].startswith("induction ") and names[2].startswith("copy "), names
    assert all("=" not in n and len(n) <= GROUP_CHARS + len(" (2 seeds)") for n in names), names


# ---- smoothing (item 7) -------------------------------------------------------------------------
def test_the_train_loss_is_smoothed_by_default_and_held_out_curves_never():
    rng = np.random.default_rng(0)
    steps = np.arange(1, 401)
    loss = 2.5 * np.exp(-steps / 100) + rng.normal(0, 0.3, len(steps)).clip(-0.5)  # batches of varying length
    metrics = pd.DataFrame({"kind": "train", "step": steps, "loss": loss, "elapsed_s": steps / 10.0,
                            "tokens": steps * 100})
    raw, smooth = curve(metrics, "train loss (batch)"), curve(metrics, "train loss (batch)", smoothing=SMOOTHING)
    assert SMOOTHING >= 0.8
    assert smooth["value"].diff().std() < 0.2 * raw["value"].diff().std()  # not a wall of noise
    evals = metrics.iloc[::50].assign(kind="eval")
    np.testing.assert_array_equal(curve(evals, "held-out loss", smoothing=SMOOTHING)["value"], evals["loss"])

    with gr.Blocks():
        tab = build_compare_tab(AppContext(store=None, jobs=None))  # the widgets only: nothing is read
    found = {c.elem_id: c for c in _components(tab.tab)}
    assert found["compare-smoothing"].value == SMOOTHING and found["compare-metric"].value == ["train loss (batch)"]


def _components(block) -> list:
    out = []
    for child in getattr(block, "children", []):
        out += [child, *_components(child)]
    return out


# ---- labels and empty states (items 6 and 10) ---------------------------------------------------
def test_compare_reads_like_the_ui_and_shows_no_placeholder(ctx):
    knob_labels = {k.key: k.label for k in KNOBS}
    assert FILTER_LABELS == {key: knob_labels[key] for key in FILTER_LABELS}  # "Task", not "name" or "task"
    assert set(FILTER_LABELS.values()) == {"Task", "Architecture", "Positional encoding", "LayerNorm placement"}
    assert FILTER_PARAMS == ["task", "arch", "pos", "norm"]
    a, b = add(ctx, BASE), add(ctx, change(BASE, **{"model.pos": "rope", "train.seed": 3}))
    finals, configs = finals_and_configs(ctx, [a, b], True)
    assert list(configs.columns) == ["run", "Positional encoding", "Seed"]  # labels, not model.pos
    assert not any("." in c or c.endswith(" s") for c in [*finals.columns, *configs.columns]), finals.columns

    with gr.Blocks():
        tab = build_compare_tab(ctx)
    found = {c.elem_id: c for c in _components(tab.tab)}
    headers = found["compare-finals"].value["headers"]  # before a selection: the real headers, not 1 2 3
    assert headers[:2] == ["run", "state"] and found["compare-configs"].value["headers"] == ["run"]
    assert not found["compare-files"].visible and not found["compare-params"].visible  # no empty boxes
    files = export(ctx, [a], "train loss", "step", 0.0)
    assert files.visible is True and len(files.value) == 4


# ---- the live timer (item 2) --------------------------------------------------------------------
def controls(run_ids: list[str], filters=(None,) * 4, metric: str = "train loss") -> Controls:
    return Controls.of(filters, run_ids, metric, "step", 0.0, True, True)


def test_a_tick_refreshes_the_stored_runs_table_while_a_listed_run_is_live(ctx):
    done, live = add(ctx, BASE), add(ctx, change(BASE, **{"model.pos": "rope"}), "running")
    out = render(ctx, controls([]), {})
    states = dict(zip(out["table"]["run"], out["table"]["state"]))
    assert states == {done: "completed", live: "running"} and out["timer"]["value"] == LIVE_POLL_S  # nothing picked
    again = render(ctx, controls([]), out["shown"])
    assert set(again) == {"shown"}  # nothing changed: nothing is sent (the timer stays on)
    out = render(ctx, controls([], [["sort"], None, None, None]), out["shown"])
    assert out["table"].empty and out["timer"] == WATCHING  # the filter hides the live run
    with pytest.raises(ValueError, match="run_id"):  # an id that is not a run is refused
        render(ctx, controls(["../outside"]), {})
    ctx.store.set_status(live, "completed")
    out = render(ctx, controls([]), {})
    assert dict(zip(out["table"]["run"], out["table"]["state"]))[live] == "completed"
    assert out["timer"] == WATCHING


def test_a_run_continued_elsewhere_is_shown_running_then_completed_on_a_page_that_was_idle(ctx):
    """Issue 34 item 3: a page whose runs had all finished turned its timer off, so a run another screen
    continued stayed "stopped" there until Refresh. With runs stored, the timer keeps watching (slowly)."""
    out = render(ctx, controls([]), {})
    assert out["timer"] == {"__type__": "update", "active": False, "value": WATCH_POLL_S}  # no run: nothing to watch
    run = add(ctx, BASE, "stopped", step=40)
    out = render(ctx, controls([run]), out["shown"])
    assert out["timer"] == WATCHING and list(pd.DataFrame(out["finals"].data)["state"]) == ["stopped"]
    idle = render(ctx, controls([run]), out["shown"])
    assert set(idle) == {"shown"}  # a watching tick that finds nothing new sends nothing
    ctx.store.set_status(run, "running", step=60)  # another screen continues it
    out = render(ctx, controls([run]), idle["shown"])
    assert out["timer"]["value"] == LIVE_POLL_S and list(pd.DataFrame(out["finals"].data)["state"]) == ["running"]
    assert dict(zip(out["table"]["run"], out["table"]["state"]))[run] == "running"
    ctx.store.set_status(run, "completed", step=240)
    out = render(ctx, controls([run]), out["shown"])
    assert out["timer"] == WATCHING and list(pd.DataFrame(out["finals"].data)["state"]) == ["completed"]


def test_the_final_metrics_show_inductions_headline_measure_only_where_a_run_measured_it(ctx):
    """Issue 34 item 4: an induction run's telling number is its accuracy on the predictable positions (99%),
    not its exact-match (0.086, near chance for a model that copies every repeat)."""
    copy = add(ctx, BASE)
    ctx.store.write_summary(copy, {"steps": 12, "eval": {"loss": 0.5, "exact_match": 0.25, "predictable_acc": None}})
    finals, _ = final_tables(read_selection(ctx.store, [copy]), True)
    assert "held-out accuracy (predictable positions)" not in finals.columns  # copy has no such measure
    induction = add(ctx, change(BASE, **{"task.name": "induction", "task.min_len": 12, "task.max_len": 12,
                                         "task.n_symbols": 16}))
    ctx.store.write_summary(induction, {"steps": 12, "eval": {"loss": 0.8, "exact_match": 0.086,
                                                               "predictable_acc": 0.99}})
    finals, _ = final_tables(read_selection(ctx.store, [copy, induction]), True)
    cols = list(finals.columns)
    assert cols.index("held-out accuracy (predictable positions)") == cols.index("held-out exact-match") - 1
    assert list(finals["held-out accuracy (predictable positions)"].isna()) == [True, False]
    assert finals["held-out accuracy (predictable positions)"].iloc[1] == 0.99


def table_of(component: gr.Dataframe) -> pd.DataFrame:
    """A table component's value as the page holds it."""
    return pd.DataFrame(component.value["data"], columns=component.value["headers"])


def test_a_tick_redraws_the_selection_until_the_page_shows_what_the_store_has(ctx):
    a, b = add(ctx, BASE, "running"), add(ctx, change(BASE, **{"train.seed": 1}))
    out = render(ctx, controls([a, b]), {})
    assert list(pd.DataFrame(out["finals"].data)["state"]) == ["running", "completed"]
    assert out["timer"]["value"] == LIVE_POLL_S and out["groups"].visible
    ctx.store.set_status(a, "completed")
    out = render(ctx, controls([a, b]), out["shown"])  # the tick after the run ended: the final state, timer off
    assert list(pd.DataFrame(out["finals"].data)["state"]) == ["completed"] * 2 and out["timer"] == WATCHING
    assert set(out["table"]["state"]) == {"completed"} and list(table_of(out["groups"])["finished"]) == [2]
    assert [t.name for t in out["curves"].data] == list(run_labels(ctx, [a, b]).values())
    assert set(render(ctx, controls([a, b]), out["shown"])) == {"shown"}  # then nothing more is sent


def test_a_control_change_redraws_its_views_and_no_others(ctx):
    a, b = add(ctx, BASE), add(ctx, change(BASE, **{"model.pos": "rope"}))
    first = render(ctx, controls([a, b]), {})
    assert {"curves", "finals", "configs", "params", "table", "pick"} <= set(first)
    out = render(ctx, controls([a, b], metric="held-out loss"), first["shown"])
    assert "curves" in out and "finals" not in out and "params" not in out and "pick" not in out
    assert out["curves"].layout.yaxis.title.text == "held-out loss"
    out = render(ctx, controls([a]), out["shown"])  # a new selection: its tables, labels and no old export
    assert {"curves", "finals", "configs", "params", "pick", "files"} <= set(out)


def test_the_export_titles_its_curves_as_compare_does_and_includes_the_seed_bands(ctx, monkeypatch):
    """The exported curves.png had axes "x" and "value", and the band figure was not exported."""
    import ui.compare.tab as compare

    a, b = add(ctx, BASE), add(ctx, change(BASE, **{"train.seed": 1}))
    drawn = {}
    real = compare.to_png

    def keep(fig):
        drawn[len(drawn)] = fig
        return real(fig)

    monkeypatch.setattr(compare, "to_png", keep)
    files = export(ctx, [a, b], ["held-out loss", "train loss"], "tokens", 0.0, True)
    names = [file_name(f) for f in files.value]
    assert names == ["configs.json", "metrics.csv", "curves.png", "parameters.png", "bands.png"]
    ax = drawn[0].axes[0]
    assert drawn[0].axes[-1].get_xlabel() == "tokens" and ax.get_ylabel() == "loss"  # two losses: one panel
    assert ax.get_title(loc="left") == "held-out loss / train loss"
    assert drawn[2].axes[0].get_xlabel() == "tokens" and drawn[2].axes[0].get_ylabel() == "held-out loss"
    alone = export(ctx, [a, b], "held-out loss", "step", 0.0, False)  # grouping off: no band figure
    assert [file_name(f) for f in alone.value][-1] == "parameters.png"


def file_name(f) -> str:
    """An exported file's name, from a gr.File value (a path, or a dict with one)."""
    return str(f["path"] if isinstance(f, dict) else f).rsplit("/", 1)[-1]
