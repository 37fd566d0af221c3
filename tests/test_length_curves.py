"""Compare's accuracy-by-length panel (lab/views/length_curves.py, drawn by ui/compare/render.py): the picked
runs' configurations scored on longer inputs, a configuration's seeds measured at every length from their final
weights (the numbers the Python API gives), measured once per run for every page, and redrawn only when the
configuration or its runs change. tests/test_browser_grid.py picks a configuration in Chromium."""
from __future__ import annotations

import pytest

import lab
from lab.views.length_curves import LengthCache, length_cells, length_frame, length_figure
from tests.helpers import app_context, tiny_config, trained_run
from ui.compare.render import Controls, render


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two seeds of a parity RNN, one of a parity Transformer (trained on lengths 1-4, scored up to 8), and a
    run of a task without longer lengths (modular addition)."""
    folder = tmp_path_factory.mktemp("lengths")
    with app_context(folder) as ctx:
        parity = dict(task="parity", max_len=4, ood_len=8, steps=40, eval_every=40, eval_samples=16, threads=1)
        ids = {"rnn": [trained_run(ctx.store, tiny_config(arch="rnn", seed=s, **parity)) for s in (0, 1)],
               "transformer": [trained_run(ctx.store, tiny_config(seed=0, **parity))],
               "no longer lengths": [trained_run(ctx.store, tiny_config(task="modular_addition", steps=5,
                                                                        eval_every=5, eval_samples=8, threads=1))]}
        yield ctx, ids


def rows_of(ctx, run_ids):
    listing = ctx.store.list().set_index("run_id")
    return {r: listing.loc[r].to_dict() for r in run_ids}


def test_the_cells_are_the_configurations_scored_on_longer_inputs_with_their_seeds(runs):
    ctx, ids = runs
    every = [r for group in ids.values() for r in group]
    cells = length_cells(rows_of(ctx, every))
    assert sorted(map(sorted, cells.values())) == sorted([sorted(ids["rnn"]), ids["transformer"]])
    assert len(set(cells)) == 2 and all(cells)  # named, as Compare names its seed groups
    assert length_cells(rows_of(ctx, ids["no longer lengths"])) == {}
    rows = rows_of(ctx, ids["rnn"])
    rows[ids["rnn"][1]]["state"] = "running"  # a run still training has no final weights to measure
    assert list(length_cells(rows).values()) == [ids["rnn"][:1]]


def test_the_curve_is_the_runs_own_measure_and_measured_once(runs, tmp_path):
    ctx, ids = runs
    cache = LengthCache()
    rows = rows_of(ctx, ids["rnn"])
    frame = length_frame(ctx.store, rows, ids["rnn"], cache)
    assert cache.measured == 2 and sorted(frame["length"].unique()) == list(range(1, 9))
    for r in ids["rnn"]:
        mine = frame[frame["run"] == r].set_index("length")
        api = lab.load_run(r, runs_dir=ctx.store.root).accuracy_by_length()
        assert mine["token_acc"].tolist() == pytest.approx(api["token_acc"].tolist())
        assert mine["trained"].tolist() == api["trained"].tolist() == [True] * 4 + [False] * 4
    again = length_frame(ctx.store, rows, ids["rnn"], cache)
    assert cache.measured == 2 and again.equals(frame)  # every page after the first: no measurement
    fig = length_figure(frame, "parity RNN")
    title = fig.layout.title.text
    longer = frame[~frame["trained"]]["token_acc"].mean()
    assert title.startswith("parity RNN<br><sup>lengths 1-4: ") and \
        f"<br><sup>longer lengths 5-8: {longer:.0%} (mean over 2 seeds)</sup>" in title, title
    assert [t.name for t in fig.data] == ["seed 0", "seed 1", "mean over seeds"]


def test_compare_draws_the_picked_configuration_and_redraws_only_on_a_change(runs):
    ctx, ids = runs
    picked = ids["rnn"] + ids["transformer"] + ids["no longer lengths"]
    first = render(ctx, Controls.of([None] * 4, picked, "held-out loss", "step", 0.0, True, True), {})
    choices = first["cell"]["choices"]
    assert len(choices) == 2 and first["cell"]["value"] == choices[0]  # the first, until one is picked
    assert first["lengths"].visible is True
    shown = first["shown"]
    other = choices[1]
    second = render(ctx, Controls.of([None] * 4, picked, "held-out loss", "step", 0.0, True, True, other), shown)
    assert second["lengths"].visible is True and "value" in second["cell"] and second["cell"]["value"] == other
    same = render(ctx, Controls.of([None] * 4, picked, "held-out loss", "step", 0.0, True, True, other),
                  second["shown"])
    assert "lengths" not in same and "cell" not in same  # nothing changed: nothing sent
    none = render(ctx, Controls.of([None] * 4, ids["no longer lengths"], "held-out loss", "step", 0.0, True, True,
                                   other), same["shown"])
    assert none["cell"]["choices"] == [] and none["lengths"].visible is False


def test_a_run_without_final_weights_is_left_out_not_a_traceback(runs, tmp_path):
    """A finished run whose weights are gone, or do not fit its model (a fake trainer's, a damaged store's), is
    left out of the curve; with no run left, the panel hides its plot."""
    import shutil

    ctx, ids = runs
    copies = [f"{r[:-6]}c0ffee" if i == 0 else r for i, r in enumerate(ids["rnn"])]
    shutil.copytree(ctx.store.path(ids["rnn"][0]), ctx.store.path(copies[0]))
    (ctx.store.path(copies[0]) / "weights.safetensors").unlink()
    (ctx.store.path(copies[0]) / "checkpoint.safetensors").unlink()
    other = ctx.store.path(ids["transformer"][0])  # weights that do not fit the RNN's model (another's)
    shutil.copytree(ctx.store.path(ids["rnn"][0]), ctx.store.path(f"{ids['rnn'][0][:-6]}f00d00"))
    copies.append(f"{ids['rnn'][0][:-6]}f00d00")
    shutil.copy(other / "weights.safetensors", ctx.store.path(copies[2]) / "weights.safetensors")
    try:
        rows = rows_of(ctx, copies)
        frame = length_frame(ctx.store, rows, copies, LengthCache())
        assert set(frame["run"]) == {copies[1]}
        alone = render(ctx, Controls.of([None] * 4, copies[:1], "held-out loss", "step", 0.0, True, True), {})
        assert alone["lengths"].visible is False
    finally:
        for r in (copies[0], copies[2]):
            shutil.rmtree(ctx.store.path(r))
