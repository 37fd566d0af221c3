"""The app's analyses from Python (lab/api/analyses.py): each equals what the app's own functions compute on
the same stored weights (patching grids, head roles, the Fourier picture, the logit lens), presets come by
name with the app's configs and explanations, and an untrained model is the one a run starts from."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lab
from lab.circuits.fourier import frequency_power, number_embedding
from lab.circuits.head_roles import head_scores
from lab.circuits.patching import patch
from lab.engine.store import RunStore
from lab.teach.presets.catalog import PRESETS
from lab.trainer import build_model
from tests.test_patching import CFG, inputs, sharpened


@pytest.fixture(scope="module")
def sharp(tmp_path_factory) -> lab.Run:
    """A stored run with sharpened weights: an earlier token can change its answer (tests/test_patching.py)."""
    store = RunStore(tmp_path_factory.mktemp("analyses"))
    run_id = store.create(CFG)
    store.save_weights(run_id, sharpened().state_dict())
    store.write_summary(run_id, {"steps": CFG.train.steps})
    store.set_status(run_id, "completed", step=CFG.train.steps)
    return lab.load_run(run_id, store.root)


def test_patching_grids_are_the_circuits_panels_on_typed_inputs(sharp):
    model = sharpened()
    clean, corrupt = inputs(model)
    want = patch(model, clean, corrupt)
    text = [" ".join(str(int(t)) for t in x[0]) for x in (clean, corrupt)]
    grids = sharp.patching(*text)
    np.testing.assert_allclose(grids.heads.to_numpy(), want.heads, atol=1e-5)
    np.testing.assert_allclose(grids.residual.to_numpy(), want.residual, atol=1e-5)
    assert list(grids.residual.index) == ["resid_pre 0", "resid_pre 1", "resid_post 1"]
    assert grids.residual.columns[0] == f"0 {int(clean[0, 0])}" and grids.heads.shape == (2, 2)
    assert (grids.clean_answer, grids.corrupt_answer) == (str(want.clean_answer), str(want.corrupt_answer))
    assert "changed at position" in grids.how
    with pytest.raises(lab.ConfigError, match="give both inputs"):
        sharp.patching(text[0])


def test_head_roles_and_the_logit_lens_are_the_apps_numbers(sharp):
    roles = sharp.head_roles()
    want = head_scores(sharpened(), CFG, CFG.train.steps)
    assert list(roles.index) == [(0, 0), (0, 1), (1, 0), (1, 1)] and set(roles.columns) == set(want.scores)
    for name, scores in want.scores.items():
        np.testing.assert_allclose(roles[name].to_numpy(), scores.reshape(-1), atol=1e-6)
    lens = sharp.logit_lens("3 7 1 9 4 3 7 1")
    last = lens[lens["stream"] == "after layer 1"]
    with torch.no_grad():
        probs = sharpened()(torch.tensor([[3, 7, 1, 9, 4, 3, 7, 1]]), None).logits[0].softmax(-1)
    np.testing.assert_allclose(last["top_prob"].to_numpy(), probs.max(-1).values.numpy(), rtol=1e-5)
    assert list(last["top"]) == [str(int(t)) for t in probs.argmax(-1)]
    assert sorted(set(lens["stream"])) == ["after layer 0", "after layer 1", "embedding"]


def test_the_fourier_picture_is_the_embeddings_power_per_frequency(tmp_path):
    run = lab.train(task="modular_addition", modulus=11, steps=4, d_model=16, n_heads=2, n_layers=1, eval_every=4,
                    threads=1, runs_dir=tmp_path, progress=False)
    table = run.fourier()
    power, _ = frequency_power(number_embedding(run.config, run.store.weights_at(run.run_id, None)[0]))
    np.testing.assert_allclose(table["power"].to_numpy(), power)
    assert list(table.index) == list(range(1, 6)) and abs(table["share"].sum() - 1) < 1e-9  # (p - 1) / 2 for p = 11
    with pytest.raises(ValueError, match="modular addition"):
        lab.train(task="copy", steps=2, d_model=16, n_heads=2, n_layers=1, eval_every=2, threads=1, runs_dir=tmp_path,
                  progress=False).fourier()


def test_presets_come_by_name_with_the_apps_configs_and_explanations(tmp_path):
    table = lab.presets()
    assert list(table.index) == list(PRESETS) and table.loc["hello_sort", "runs"] == 1
    assert lab.preset_configs("why_scaling") == list(PRESETS["why_scaling"].runs)
    quick = lab.preset_configs("why_scaling", steps=10)
    assert [c.name for c in quick] == [c.name for c in PRESETS["why_scaling"].runs] and {c.train.steps for c in quick} == {10}
    with pytest.raises(lab.ConfigError, match="hello_sort"):
        lab.preset_configs("no_such_preset")
    done = lab.train_preset("hello_sort", steps=6, eval_every=3, threads=1, runs_dir=tmp_path, progress=False)
    assert list(done.runs) == ["sort"] and done.runs["sort"].state == "completed"
    assert done.explanation == lab.explain_preset("hello_sort", list(done.runs.values()))
    assert "exact-match" in done.explanation


def test_an_untrained_model_is_the_one_a_run_starts_from():
    cfg = lab.make_config(task="copy", d_model=16, n_heads=2, n_layers=1, seed=5)
    state = torch.random.get_rng_state()
    model = lab.untrained(cfg)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random numbers untouched
    for (name, a), b in zip(model.state_dict().items(), build_model(cfg).state_dict().values()):
        assert torch.equal(a, b), name
    assert not model.training and model.W_E.shape[0] == model.vocab_size
    assert isinstance(lab.untrained(task="copy", seed=6).W_E, torch.Tensor)


def test_accuracy_by_length_is_the_runs_own_held_out_measure_one_length_at_a_time(tmp_path):
    """Each length's numbers come from the run's own held-out sequences: at equal counts per length, their mean
    over the longer lengths is the run's evaluation there. An RNN that learned parity keeps it at every
    longer length (Delétang et al. 2023); the lengths are the training ones, then the longer ones."""
    run = lab.train(task="parity", arch="rnn", d_model=32, max_len=6, ood_len=12, steps=300, lr=1e-2, eval_every=300,
                    eval_samples=48, threads=1, runs_dir=tmp_path, progress=False)
    table = run.accuracy_by_length(per_length=8)
    assert list(table.index) == list(range(1, 13))
    assert list(table["trained"]) == [True] * 6 + [False] * 6
    longer = table[~table["trained"]]
    assert longer["token_acc"].mean() == pytest.approx(run.evaluate("ood", n=48)["token_acc"])
    assert (table["token_acc"] == table["exact_match"]).all()  # one answer token: the same measure
    assert longer["token_acc"].min() == 1.0, table
