"""Head roles over training (lab/circuits/head_roles.py, `python -m lab heads`): the scores equal their
definitions on crafted attention patterns, the probe repeats its tokens, the command reads every snapshot
that kept weights and refuses runs without heads by name; on the induction preset's 2-layer run the
induction score appears in layer 1 only (slow)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from lab.circuits.head_roles import SCORES, crossing_step, repeated_probe, role_masks, scores_of, HeadScores
from lab.cli.main import main
from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.derived import run_config
from tests.trained_once import trained_once

HALF = 5
T = 2 * HALF


def shifted(offset_of: "callable") -> np.ndarray:
    """A (T, T) causal pattern: query i puts all its attention on key offset_of(i) (itself where that is None)."""
    p = np.zeros((T, T), dtype=np.float32)
    for i in range(T):
        j = offset_of(i)
        p[i, i if j is None or not 0 <= j <= i else j] = 1.0
    return p


def test_each_score_is_one_for_its_own_pattern_and_measures_a_uniform_head_by_hand():
    patterns = np.stack([
        shifted(lambda i: i - 1),  # previous token
        shifted(lambda i: i - HALF + 1 if i >= HALF else None),  # induction
        shifted(lambda i: i - HALF if i >= HALF else None),  # duplicate token
        shifted(lambda i: 0),  # first token
        shifted(lambda i: i),  # self
        np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None],  # uniform over the visible keys
    ])[None]  # (1 layer, 6 heads, T, T)
    s = scores_of(patterns, HALF)
    for head, name in enumerate(SCORES):
        assert s[name][0, head] == pytest.approx(1.0), (name, s[name])
    assert s["previous-token"][0, 1] == pytest.approx(np.mean([float(i - 1 == i - HALF + 1) for i in range(1, T)]))
    uniform = {  # hand computation: query i sees i + 1 keys, each with 1 / (i + 1)
        "previous-token": np.mean([1 / (i + 1) for i in range(1, T)]),
        "induction": np.mean([1 / (i + 1) for i in range(HALF, T)]),
        "duplicate-token": np.mean([1 / (i + 1) for i in range(HALF, T)]),
        "first-token": np.mean([1 / (i + 1) for i in range(1, T)]),
        "self": np.mean([1 / (i + 1) for i in range(1, T)]),
    }
    for name, value in uniform.items():
        assert s[name][0, 5] == pytest.approx(value), name
    # several probes: the mean over them
    two = scores_of(np.stack([patterns, patterns[:, :, ::-1]]), HALF)
    assert two["self"].shape == (1, 6)
    with pytest.raises(ValueError, match="expected 10 x 10"):
        scores_of(patterns[..., :-1, :-1], HALF)


def test_the_masks_only_cover_the_queries_where_a_role_is_defined():
    masks = role_masks(HALF)
    assert masks["induction"][:HALF].sum() == 0 and masks["induction"][HALF:].sum(axis=1).tolist() == [1] * HALF
    assert masks["previous-token"][0].sum() == 0 and all(np.triu(m, 1).sum() == 0 for m in masks.values())  # causal


def test_the_probe_repeats_distinct_random_tokens():
    tokens = repeated_probe(vocab=50, half=HALF, n=8, seed=3)
    assert tokens.shape == (8, T) and (tokens[:, :HALF] == tokens[:, HALF:]).all()
    assert all(len(set(row[:HALF])) == HALF for row in tokens) and tokens.max() < 50
    assert (repeated_probe(50, HALF, 8, 3) == tokens).all() and not (repeated_probe(50, HALF, 8, 4) == tokens).all()
    assert repeated_probe(vocab=3, half=HALF, n=2).shape == (2, T)  # a small vocabulary repeats within a half


def test_the_crossing_step_is_the_first_above_the_threshold():
    def at(step, v):
        return HeadScores(step, HALF, {"induction": np.array([[0.0, v]])})
    assert crossing_step([at(0, 0.02), at(100, 0.3), at(200, 0.45), at(300, 0.6)]) == 200
    assert crossing_step([at(0, 0.02), at(100, 0.3)]) is None


TINY = run_config(model=ModelConfig(n_layers=2, n_heads=2, d_model=16, d_ff=0),
                  task=TaskConfig(name="induction", min_len=12, max_len=12, n_symbols=20),
                  train=TrainConfig(steps=30, batch_size=8, eval_every=10, eval_samples=8, snapshots=3))


def trained(tmp_path, cfg: RunConfig, capsys) -> str:
    assert main(["train", "--config", write(tmp_path, cfg), "--runs-dir", str(tmp_path / "runs"), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run_id"]


def heads_json(tmp_path, run_id: str, capsys) -> dict:
    """What `python -m lab heads RUN_ID --json` prints."""
    assert main(["heads", run_id, "--runs-dir", str(tmp_path / "runs"), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def write(tmp_path, cfg: RunConfig) -> str:
    path = tmp_path / f"{abs(hash(cfg.to_json()))}.json"
    path.write_text(cfg.to_json())
    return str(path)


def test_the_command_reads_every_snapshot_and_the_end(tmp_path, capsys):
    run_id = trained(tmp_path, TINY, capsys)
    out = heads_json(tmp_path, run_id, capsys)
    from lab.engine.store import RunStore
    store = RunStore(tmp_path / "runs")
    assert out["steps"] == sorted(set(store.snapshot_steps(run_id)) | {30}) and out["half"] == (TINY.task.max_len - 1) // 2
    assert set(out["scores"]) == set(SCORES)
    assert list(out["scores"]["induction"]) == ["layer 0 head 0", "layer 0 head 1", "layer 1 head 0", "layer 1 head 1"]
    assert all(len(v) == len(out["steps"]) and all(0 <= x <= 1 for x in v)
               for per_head in out["scores"].values() for v in per_head.values())
    assert main(["heads", run_id, "--runs-dir", str(tmp_path / "runs")]) == 0
    text = capsys.readouterr().out
    assert "previous-token" in text and "layer 1 head 1" in text and "top induction score at the end" in text


@pytest.mark.parametrize("arch", ["lstm", "encoder-decoder"])
def test_a_run_without_decoder_heads_is_refused_by_name(tmp_path, capsys, arch):
    task = replace(TINY.task, name="copy", n_symbols=5, min_len=2, max_len=4)
    cfg = run_config(model=ModelConfig(arch=arch, n_layers=1, n_heads=2, d_model=16, d_ff=0), task=task,
                     train=replace(TINY.train, steps=2))
    run_id = trained(tmp_path, cfg, capsys)
    assert main(["heads", run_id, "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert f"its architecture is {arch}" in err and "decoder-only" in err, err


@pytest.mark.science
@pytest.mark.parametrize("seed", [pytest.param(0, marks=pytest.mark.shares_training("induction 2 layers")), 1, 2])
def test_on_the_induction_preset_the_induction_head_forms_in_layer_1_as_the_loss_falls(trained_folder, capsys, seed):
    """Issue 25's acceptance, for each seed: the top induction score is below 0.1 at step 0 and above 0.4 at the
    end, in layer 1 only, and it first passes 0.4 within one snapshot interval of the held-out loss's steepest
    fall (the phase change)."""
    from lab.engine.store import RunStore
    from lab.teach.lesson_circuits import steepest_fall
    from lab.teach.presets.catalog import PRESETS

    cfg = next(c for c in PRESETS["induction"].runs if c.model.n_layers == 2)
    t = trained_once(replace(cfg, train=replace(cfg.train, seed=seed)), trained_folder)  # seed 0: the preset's run
    run_id = t.run_id
    out = heads_json(t.runs_dir.parent, run_id, capsys)
    induction, steps, crossing = out["scores"]["induction"], out["steps"], out["induction_forms_at"]
    store = RunStore(t.runs_dir)
    m = store.metrics(run_id)
    store.close()
    evals = m[m["kind"] == "eval"]
    fall = steepest_fall([(int(s), float(v)) for s, v in zip(evals["step"], evals["loss"])])
    every = steps[1] - steps[0]
    print(f"\n[heads seed {seed}] steps {steps} induction {induction} forms at {crossing}, loss falls fastest {fall}")
    assert max(v[0] for v in induction.values()) < 0.1  # step 0: no induction head
    assert max(induction["layer 1 head 0"][-1], induction["layer 1 head 1"][-1]) > 0.4  # the end: one in layer 1
    assert max(induction["layer 0 head 0"][-1], induction["layer 0 head 1"][-1]) < 0.1  # and none in layer 0
    assert crossing is not None and fall is not None
    assert fall[0] - every <= crossing <= fall[1] + every, (crossing, fall, every)


def test_the_learn_page_draws_the_scores_the_command_prints_and_the_losses_steepest_fall(tmp_path, capsys):
    from lab.engine.jobs import JobManager
    from lab.engine.store import RunStore
    from lab.teach.lesson_circuits import steepest_fall
    from ui.common import AppContext
    from ui.learn import page_view

    run_id = trained(tmp_path, TINY, capsys)
    printed = heads_json(tmp_path, run_id, capsys)
    store = RunStore(tmp_path / "runs")
    fig, source, caption = page_view(AppContext(store=store, jobs=JobManager(store, max_concurrent=1)), "circuits",
                                     run_id, "")
    induction = np.asarray(fig.axes[0].images[0].get_array())  # (heads, steps), as drawn
    assert np.allclose(induction, [v for v in printed["scores"]["induction"].values()], atol=1e-4)
    top = max(v[-1] for v in printed["scores"]["induction"].values())
    assert f"to {top:.2f} at step {printed['steps'][-1]}" in caption, caption
    assert f"at {len(printed['steps'])} steps" in caption and "final weights after 30 steps" in source
    m = store.metrics(run_id)
    losses = [(int(s), float(v)) for s, v in zip(m[m["kind"] == "eval"]["step"], m[m["kind"] == "eval"]["loss"])]
    fall = steepest_fall(losses)
    assert fall is None or f"fell fastest between steps {fall[0]} and {fall[1]}" in caption, caption
    store.close()


def test_the_steepest_fall_is_the_largest_drop_per_step():
    assert steepest_fall_of([(0, 7.0), (100, 6.5), (150, 3.0), (300, 2.0)]) == (100, 150, 6.5, 3.0)
    assert steepest_fall_of([(0, 1.0), (10, 1.2)]) is None and steepest_fall_of([(5, 1.0)]) is None
    assert steepest_fall_of([(0, 5.0), (20, float("nan")), (40, 1.0)]) == (0, 40, 5.0, 1.0)  # a NaN is skipped


def steepest_fall_of(losses):
    from lab.teach.lesson_circuits import steepest_fall
    return steepest_fall(losses)


def test_the_induction_presets_sentence_quotes_the_commands_crossing_and_the_steepest_fall(tmp_path, capsys):
    from lab.engine.store import RunStore
    from lab.teach.presets.results import induction_forming
    from lab.teach.presets.catalog import forming_sentence

    run_id = trained(tmp_path, TINY, capsys)
    printed = heads_json(tmp_path, run_id, capsys)
    store = RunStore(tmp_path / "runs")
    h = induction_forming(store, run_id)
    store.close()
    assert h["crossing"] == printed["induction_forms_at"] and h["every"] == printed["steps"][1] - printed["steps"][0]
    assert h["end"] == pytest.approx(max(v[-1] for v in printed["scores"]["induction"].values()), abs=1e-4)
    crafted = {"start": 0.03, "end": 0.57, "head": "layer 1 head 0", "crossing": 373, "every": 53,
               "fall": (300, 350, 4.48, 2.47)}
    text = forming_sentence(crafted)
    assert text == (" Its induction head (layer 1 head 0) formed at step 373: its induction score on random tokens "
                    "repeated once went from 0.03 to 0.57, past 0.4 there (snapshots every 53 steps), as the held-out "
                    "loss fell fastest (steps 300-350, 4.48 to 2.47): a phase change, drawn on Learn page 13."), text
    assert forming_sentence(crafted | {"crossing": None}) == "" and forming_sentence({}) == ""
