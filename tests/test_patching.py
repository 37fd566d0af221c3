"""Activation patching (lab/circuits/patching.py, `python -m lab patch`), checked against its definition on
stored weights: patching a whole row of the residual stream restores the clean logits exactly, patching
nothing changes nothing, each batched grid cell equals its own unbatched forward, a head's patch equals the
forward with that head's slice of the attention output replaced by hand, and the command prints both grids."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lab.circuits.patching import capture, causal_cone, patch, patch_residual
from lab.cli.main import main
from lab.config import ModelConfig, TaskConfig, TrainConfig
from lab.derived import run_config
from lab.model import Transformer

CFG = run_config(model=ModelConfig(n_layers=2, n_heads=2, d_model=16, d_ff=32),
                 task=TaskConfig(name="induction", min_len=12, max_len=12, n_symbols=20),
                 train=TrainConfig(steps=40, batch_size=8, eval_every=20, eval_samples=8, snapshots=2))


@pytest.fixture(scope="module")
def model() -> Transformer:
    return sharpened()


def sharpened() -> Transformer:
    """A model of CFG whose inputs' answers depend on earlier tokens (tests/test_circuits_panel.py stores it)."""
    torch.manual_seed(0)
    m = Transformer(CFG.model, 20)
    with torch.no_grad():  # sharp attention writing large outputs: an earlier token can change the answer
        for name, p in m.named_parameters():  # (at the small initialisation the last token alone decides it)
            if name.endswith("in_proj.weight"):
                p.mul_(10.0)
            if name.endswith("out_proj.weight"):
                p.mul_(100.0)
    return m.eval()


def inputs(model: Transformer) -> tuple[torch.Tensor, torch.Tensor]:
    """A clean input and the first corruption of one earlier token (in a fixed order) that changes the answer."""
    clean = torch.tensor([[3, 7, 1, 9, 4, 3, 7, 1, 9]])
    answer = int(model(clean, None).logits[0, -1].argmax())
    for pos in (3, 2, 4, 1, 5, 0, 6):
        for token in range(20):
            corrupt = clean.clone()
            corrupt[0, pos] = token
            if int(model(corrupt, None).logits[0, -1].argmax()) != answer:
                return clean, corrupt
    raise AssertionError("no corruption changes this model's answer")


def restored(model, logits, p) -> float:
    ld = float(logits[0, -1, p.clean_answer] - logits[0, -1, p.corrupt_answer])
    return (ld - p.ld_corrupt) / (p.ld_clean - p.ld_corrupt)


def test_a_whole_row_restores_the_clean_logits_and_no_patch_changes_nothing(model):
    clean, corrupt = inputs(model)
    clean_logits, rows, _ = capture(model, clean)
    corrupt_logits = model(corrupt, None).logits
    t = clean.shape[1]
    for row in range(len(model.decoder) + 1):
        assert torch.allclose(patch_residual(model, corrupt, rows, row, list(range(t))), clean_logits, atol=1e-5)
        assert torch.equal(patch_residual(model, corrupt, rows, row, []), corrupt_logits)


def test_each_batched_cell_equals_its_own_forward(model):
    clean, corrupt = inputs(model)
    p = patch(model, clean, corrupt)
    assert p.residual.shape == (3, clean.shape[1]) and p.heads.shape == (2, 2) and p.clean_answer != p.corrupt_answer
    _, rows, _ = capture(model, clean)
    for row in range(3):
        for pos in range(clean.shape[1]):
            assert p.residual[row, pos] == pytest.approx(restored(model, patch_residual(model, corrupt, rows, row, [pos]), p),
                                                         abs=1e-4)
    # the causal cone: in row 0 only the corrupted position matters; the last row's last position is the answer
    changed = int((clean != corrupt).nonzero()[0, 1])
    assert np.allclose(np.delete(p.residual[0], changed), 0, atol=1e-5) and p.residual[0, changed] == pytest.approx(1.0, abs=1e-5)
    assert p.residual[-1, -1] == pytest.approx(1.0, abs=1e-5)


def test_a_heads_patch_equals_the_forward_with_its_output_replaced_by_hand(model):
    clean, corrupt = inputs(model)
    p = patch(model, clean, corrupt)
    _, _, clean_heads = capture(model, clean)
    d_head = model.cfg.d_head
    for layer in range(2):
        for head in range(2):
            cols = slice(head * d_head, (head + 1) * d_head)
            block = model.decoder[layer]
            original = block.self_attn.out_proj.forward

            def replaced(z, original=original, layer=layer, cols=cols):  # the projection's input, by hand
                z = z.clone()
                z[:, :, cols] = clean_heads[layer][:, :, cols]
                return original(z)
            block.self_attn.out_proj.forward = replaced
            try:
                with torch.no_grad():
                    logits = model(corrupt, None).logits
            finally:
                block.self_attn.out_proj.forward = original
            assert p.heads[layer, head] == pytest.approx(restored(model, logits, p), abs=1e-4)


def test_same_answers_and_unequal_lengths_are_refused(model):
    clean, corrupt = inputs(model)
    with pytest.raises(ValueError, match="same length"):
        patch(model, clean, corrupt[:, :-1])
    with pytest.raises(ValueError, match="same answer"):
        patch(model, clean, clean)


def test_the_causal_cone_is_later_rows_at_later_positions():
    cone = causal_cone(2, 4, row=1, position=2)
    assert cone.tolist() == [[False] * 4, [False, False, True, True], [False, False, True, True]]


def test_the_command_prints_both_grids_as_the_function_computes_them(tmp_path, capsys, model):
    from lab.engine.store import RunStore

    store = RunStore(tmp_path / "runs")  # a stored run holding the fixture's weights: its inputs' answers differ
    run_id = store.create(CFG)
    store.save_weights(run_id, model.state_dict())
    store.write_summary(run_id, {"steps": CFG.train.steps})
    store.set_status(run_id, "completed", step=CFG.train.steps)
    store.close()
    clean, corrupt = inputs(model)
    text = [" ".join(str(int(t)) for t in x[0]) for x in (clean, corrupt)]
    args = ["patch", run_id, "--runs-dir", str(tmp_path / "runs"), "--clean", text[0], "--corrupt", text[1]]
    assert main(args + ["--json"]) == 0, capsys.readouterr().err
    got = json.loads(capsys.readouterr().out)
    want = patch(model, clean, corrupt)
    assert (got["clean_answer"], got["corrupt_answer"], got["step"]) == (want.clean_answer, want.corrupt_answer, 40)
    assert np.allclose(got["residual"], want.residual, atol=1e-3) and np.allclose(got["heads"], want.heads, atol=1e-3)
    assert main(args) == 0 and "layer 1 head 1" in capsys.readouterr().out
    assert main(args[:-2] + ["--corrupt", text[1].rsplit(" ", 1)[0]]) == 2
    assert "--corrupt: the clean and corrupted inputs must have the same length" in capsys.readouterr().err
    assert main(args[:-2] + ["--corrupt", text[0]]) == 2
    assert "--corrupt: both inputs get the same answer" in capsys.readouterr().err
