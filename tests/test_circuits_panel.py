"""Inspect's circuits panel (ui/inspect/circuits.py) through its page event, on stored runs: a run change draws that
run's head roles and its task's inputs, never the previous run's; the grids are patching.py's own for the
typed inputs; a click shows that cell's patch (its restored share is the grid's), outlines the residual
cell's causal cone; bad inputs are named by their box; a run without decoder heads says so. The inputs made
from a task differ where the task says (lab/circuits/pairs.py). The page in Chromium:
tests/test_browser_circuits.py."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from lab.circuits.circuit_figures import CONE, PICKED, residual_rows
from lab.circuits.head_roles import scores_over_training
from lab.circuits.pairs import induction_pair, pair_text, task_pair, typed_pair
from lab.circuits.patching import causal_cone, patch
from lab.config import ConfigError, ModelConfig, TaskConfig, TrainConfig
from lab.derived import run_config
from tests.helpers import app_context, trained_run
from tests.test_patching import CFG, inputs, sharpened

TINY = run_config(model=ModelConfig(n_layers=2, n_heads=2, d_model=16, d_ff=0),
                  task=TaskConfig(name="induction", min_len=12, max_len=12, n_symbols=20),
                  train=TrainConfig(steps=30, batch_size=8, eval_every=10, eval_samples=8, snapshots=3))
MODULAR = run_config(model=ModelConfig(n_layers=1, n_heads=2, d_model=16, d_ff=32, pos="none", norm="none"),
                     task=TaskConfig(name="modular_addition", modulus=31, train_fraction=0.5),
                     train=TrainConfig(steps=20, batch_size=16, eval_every=5, eval_samples=16, snapshots=3))
REVERSE = run_config(model=ModelConfig(n_layers=1, n_heads=2, d_model=16, d_ff=32),
                     task=TaskConfig(name="reverse", n_symbols=6, min_len=3, max_len=5),
                     train=TrainConfig(steps=4, batch_size=8, eval_every=2, eval_samples=8))


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    """(update(action, shown, run, step, role, clean, corrupt) -> outputs, store, run ids by name)."""
    from ui.inspect.circuits import panel_update
    from ui.inspect.intervention_views import MapCache

    with app_context(tmp_path_factory.mktemp("circuits")) as ctx:
        store = ctx.store
        ids = {"tiny": trained_run(store, TINY), "reverse": trained_run(store, REVERSE),
               "modular": trained_run(store, MODULAR),
               "lstm": trained_run(store, replace(REVERSE, model=replace(REVERSE.model, arch="lstm")))}
        ids["sharp"] = store.create(CFG)  # weights whose inputs' answers differ (tests/test_patching.py)
        store.save_weights(ids["sharp"], sharpened().state_dict())
        store.write_summary(ids["sharp"], {"steps": CFG.train.steps})
        store.set_status(ids["sharp"], "completed", step=CFG.train.steps)
        cache = MapCache()
        yield (lambda *a: panel_update(ctx, cache, *a)), store, ids


def cells(table) -> list[list[str]]:
    return table.value["data"] if table.visible else []


def typed(model) -> tuple[str, str]:
    clean, corrupt = inputs(model)
    return tuple(" ".join(str(int(t)) for t in x[0]) for x in (clean, corrupt))


def test_a_run_change_draws_that_runs_roles_and_its_tasks_inputs(panel):
    update, store, ids = panel
    out = update("run 0.1", None, ids["tiny"], None, "induction", "", "")
    final = scores_over_training(store, ids["tiny"])[-1]
    assert cells(out["roles_table"]) == [[f"layer {layer}"] + [f"{v:.2f}" for v in row]
                                         for layer, row in enumerate(final.scores["induction"])]
    assert out["roles_note"].startswith(f"**At step {final.step}, the top induction score is")
    pair = induction_pair(store.config(ids["tiny"]), 0)
    assert (out["clean"], out["corrupt"]) == (pair_text(TINY, pair.clean), pair_text(TINY, pair.corrupt))
    assert out["shown"] == ids["tiny"]
    at_zero = update("drawn 0.2", ids["tiny"], ids["tiny"], 0, "induction", out["clean"], out["corrupt"])
    first = scores_over_training(store, ids["tiny"])[0]
    assert at_zero["roles_note"].startswith(f"**At step {first.step},")
    assert cells(at_zero["roles_table"])[1][1:] == [f"{v:.2f}" for v in first.scores["induction"][1]]
    role = update("role 0.3", ids["tiny"], ids["tiny"], None, "previous-token", out["clean"], out["corrupt"])
    assert set(role) == {"shown", "roles_note", "roles_table", "roles_fig"}  # the grids stay as they are
    assert "top previous-token score" in role["roles_note"]


def test_the_grids_are_the_patches_of_the_typed_inputs_and_a_click_shows_one(panel):
    update, store, ids = panel
    model = sharpened()
    clean, corrupt = typed(model)
    want = patch(model, *inputs(model))
    out = update("patch 0.1", ids["sharp"], ids["sharp"], None, "induction", clean, corrupt)
    res = cells(out["residual"])
    assert [r[0] for r in res] == residual_rows(2)
    assert np.allclose([[float(v) for v in r[1:]] for r in res], want.residual, atol=0.006)
    assert np.allclose([[float(v) for v in r[1:]] for r in cells(out["heads"])], want.heads, atol=0.006)
    assert "Clean answer **" in out["pair_note"] and out["cell_note"] == ""
    row, pos = 1, int((inputs(model)[0] != inputs(model)[1]).nonzero()[0, 1])
    click = update(f"cell 0.2\n{row}\n{pos}", ids["sharp"], ids["sharp"], None, "induction", clean, corrupt)
    assert f"{want.residual[row, pos]:.0%} restored" in click["cell_note"], click["cell_note"]
    assert f"into layer 1 at position {pos}" in click["cell_note"] and click["cell_attn"].visible
    styles = click["residual"].value["metadata"]["styling"]  # the label column first, then one per position
    cone = causal_cone(2, want.residual.shape[1], row, pos)
    assert [[CONE in s for s in r[1:]] for r in styles] == cone.tolist()
    assert [[PICKED in s for s in r[1:]] for r in styles] == (np.eye(3)[row][:, None] * np.eye(
        want.residual.shape[1])[pos][None, :]).astype(bool).tolist()
    head = update("head 0.3\n1\n0", ids["sharp"], ids["sharp"], None, "induction", clean, corrupt)
    assert "layer 1 head 0's output at every position" in head["cell_note"]
    assert f"{want.heads[1, 0]:.0%} restored" in head["cell_note"]


def test_a_run_change_merged_into_a_click_draws_the_new_run_only(panel):
    update, store, ids = panel
    model = sharpened()
    clean, corrupt = typed(model)
    out = update("cell 0.4\n1\n2", ids["sharp"], ids["reverse"], None, "induction", clean, corrupt)
    pair = task_pair(store.config(ids["reverse"]), _model(store, ids["reverse"]), 0)
    assert (out["clean"], out["corrupt"]) == (pair_text(REVERSE, pair.clean), pair_text(REVERSE, pair.corrupt))
    assert out["shown"] == ids["reverse"] and out["cell_note"] == ""  # no patch made with the previous inputs


def _model(store, run_id):
    from lab.views.analysis import load_model
    return load_model(store.config(run_id), store.load_weights(run_id))


def test_bad_inputs_are_named_by_their_box_and_hide_the_grids(panel):
    update, store, ids = panel
    clean, corrupt = typed(sharpened())
    short = update("patch 0.1", ids["sharp"], ids["sharp"], None, "induction", clean, corrupt.rsplit(" ", 1)[0])
    assert short["pair_note"].startswith("⚠️ **Corrupted input**: has 8 symbols and the clean input 9")
    assert not short["residual"].visible and not short["heads"].visible
    empty = update("patch 0.2", ids["sharp"], ids["sharp"], None, "induction", "", corrupt)
    assert empty["pair_note"].startswith("⚠️ **Clean input**: is empty")
    same = update("patch 0.3", ids["sharp"], ids["sharp"], None, "induction", clean, clean)
    assert "**Corrupted input** at step 40: both inputs get the same answer" in same["pair_note"]
    bad = update("patch 0.4", ids["sharp"], ids["sharp"], None, "induction", clean, corrupt[:-1] + "x*")
    assert bad["pair_note"].startswith("⚠️ **Corrupted input**: 'x\\*' is not a symbol"), bad["pair_note"]
    with pytest.raises(ConfigError, match="Head role"):
        update("role 0.5", ids["sharp"], ids["sharp"], None, "copying", clean, corrupt)


def test_a_step_between_snapshots_reads_one_snapshot_in_every_part(panel):
    """The slider moves by the first gap between snapshots, and snapshot steps are rounded: the roles and the
    patching both use the nearest step that kept weights, and say the same one."""
    update, store, ids = panel
    steps = store.snapshot_steps(ids["tiny"])
    mid = steps[1] - 1  # not a snapshot step
    out = update("run 0.1", None, ids["tiny"], None, "induction", "", "")
    moved = update("drawn 0.2", ids["tiny"], ids["tiny"], mid, "induction", out["clean"], out["corrupt"])
    assert moved["roles_note"].startswith(f"**At step {steps[1]},")
    assert f"at step {steps[1]}" in moved["pair_note"].lower(), moved["pair_note"]  # not the final weights
    none = update("run 0.3", ids["tiny"], None, None, "induction", out["clean"], out["corrupt"])
    assert (none["clean"], none["corrupt"]) == ("", "")  # no run: no inputs of the last one


def test_make_from_task_tries_changed_tokens_where_a_swap_keeps_the_answer(panel):
    """A sum (modular addition), a sort or a parity is the same after a swap: the candidates also change one
    prompt token, and the panel's pair is one of them."""
    from lab.circuits.pairs import _candidates

    update, store, ids = panel
    cfg = store.config(ids["modular"])
    out = update("make 0.1", ids["modular"], ids["modular"], None, "induction", "", "")
    clean = typed_pair(cfg, out["clean"], out["corrupt"]).clean
    candidates, words = _candidates(cfg, clean, clean.shape[1] - 1, 0)  # the prompt "a b", then "="
    changed = [c for c in candidates.tolist() if sorted(c) != sorted(clean[0].tolist())]
    assert changed and any("became" in w for w in words)  # single tokens changed, not only swapped
    assert out["corrupt"] != out["clean"]


def test_a_run_without_decoder_heads_says_so(panel):
    update, _, ids = panel
    out = update("run 0.1", None, ids["lstm"], None, "induction", "1 2", "2 1")
    assert "decoder-only Transformers; this run is lstm" in out["roles_note"]
    assert (out["clean"], out["corrupt"]) == ("", "") and not out["residual"].visible


def test_the_induction_pair_changes_the_token_the_answer_copies():
    pair = induction_pair(TINY, seed=3)
    clean, corrupt = pair.clean[0].tolist(), pair.corrupt[0].tolist()
    half = (len(clean) + 1) // 2
    assert clean[half:] == clean[: half - 1] and len(set(clean[:half])) == half  # distinct tokens, then again
    assert [i for i, (a, b) in enumerate(zip(clean, corrupt)) if a != b] == [half - 1]
    assert corrupt[half - 1] not in clean and clean[-1] == clean[half - 2]  # the answer follows the last token
    assert len(clean) <= TINY.task.max_len - 1  # no longer than what it trained on


def test_a_sequence_tasks_pair_swaps_two_prompt_tokens_and_reads_back_from_its_boxes():
    torch.manual_seed(0)
    from lab.views.analysis import load_model

    model = load_model(REVERSE)
    pair = task_pair(REVERSE, model, 0)
    clean, corrupt = pair.clean[0].tolist(), pair.corrupt[0].tolist()
    diff = [i for i, (a, b) in enumerate(zip(clean, corrupt)) if a != b]
    assert len(diff) == 2 and sorted(clean) == sorted(corrupt) and clean[-1] == corrupt[-1] == 6  # the separator
    assert "swapped" in pair.how
    back = typed_pair(REVERSE, pair_text(REVERSE, pair.clean), pair_text(REVERSE, pair.corrupt))
    assert torch.equal(back.clean, pair.clean) and torch.equal(back.corrupt, pair.corrupt)
    with pytest.raises(ConfigError, match="Clean input"):
        typed_pair(REVERSE, "9 9", "1 2")


def test_a_modular_addition_run_draws_its_fourier_picture_at_the_sliders_step(panel):
    from lab.circuits.circuit_figures import fourier_figure
    from lab.circuits.fourier import spectra_over_training

    update, store, ids = panel
    spectra = spectra_over_training(store, ids["modular"])
    out = update("run 0.1", ids["tiny"], ids["modular"], None, "induction", "", "")
    last = spectra[-1]
    assert out["fourier"].visible and out["fourier_note"].startswith(
        f"**At step {last.step}, the 8 strongest frequencies (k = {', '.join(map(str, last.top))}) hold "
        f"{last.fraction:.0%} of the token embedding's non-constant power** (spread evenly: {8 / 15:.0%})")
    early = update("drawn 0.2", ids["modular"], ids["modular"], 0, "induction", out["clean"], out["corrupt"])
    assert early["fourier_note"].startswith(f"**At step {spectra[0].step}, ") and spectra[0].step == 0
    role = update("role 0.3", ids["modular"], ids["modular"], 0, "self", out["clean"], out["corrupt"])
    assert "fourier" not in role  # a role switch leaves the picture as it is
    other = update("run 0.4", ids["modular"], ids["tiny"], None, "induction", "", "")
    assert not other["fourier"].visible and other["fourier_note"] == ""  # no other run's picture stays
    fig = fourier_figure(spectra, {"held-out": [(5, 0.1), (20, 0.3)]}, at=spectra[1].step)
    drawn = np.asarray(fig.axes[0].collections[0].get_array()).reshape(len(last.power), len(spectra))
    assert np.allclose(drawn, np.stack([s.power / s.power.sum() for s in spectra], axis=1), atol=1e-6)
    assert np.allclose(fig.axes[1].lines[0].get_ydata(), [s.fraction for s in spectra])  # the top share
