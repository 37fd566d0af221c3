"""Grokking's Fourier picture (lab/circuits/fourier.py, `python -m lab fourier`): the basis is orthonormal,
an embedding made of one frequency has all its power there, the powers add up to the embedding's squared
norm, a random embedding spreads its power, and the command reads every snapshot of a modular-addition run
and refuses other runs by name."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from lab.circuits.fourier import fourier_basis, frequency_power, spectrum
from lab.cli.main import main
from lab.config import ModelConfig, TaskConfig, TrainConfig
from lab.derived import run_config


@pytest.mark.parametrize("p", [7, 10, 97])
def test_the_basis_is_orthonormal_and_covers_every_frequency(p):
    basis, freq = fourier_basis(p)
    assert basis.shape == (p, p) and np.allclose(basis @ basis.T, np.eye(p))
    assert sorted(set(freq.tolist())) == list(range(p // 2 + 1))


def test_a_pure_frequency_holds_all_the_power_and_the_powers_add_up():
    p, x = 97, np.arange(97)
    emb = np.stack([3 * np.cos(2 * np.pi * 5 * x / p), np.sin(2 * np.pi * 5 * x / p + 1.0),
                    np.cos(2 * np.pi * 12 * x / p) + 0.5], axis=1)  # (p, 3): frequencies 5 and 12, a constant
    power, const = frequency_power(emb)
    assert power.shape == (48,) and set(np.flatnonzero(power > 1e-9) + 1) == {5, 12}
    assert power[4] == pytest.approx((9 + 1) * p / 2) and power[11] == pytest.approx(p / 2)  # ||cos||^2 = p / 2
    assert const == pytest.approx(0.25 * p) and power.sum() + const == pytest.approx((emb ** 2).sum())
    s = spectrum(emb, step=7, top=2)
    assert s.top == (5, 12) and s.fraction == pytest.approx(1.0) and s.step == 7


def test_a_random_embedding_spreads_its_power():
    s = spectrum(np.random.default_rng(0).normal(size=(97, 128)), 0, top=8)
    assert 0.12 < s.fraction < 0.3  # about 8 / 48 of it: no key frequencies


GROK = run_config(model=ModelConfig(n_layers=1, n_heads=2, d_model=16, d_ff=32, norm="none", pos="none"),
                  task=TaskConfig(name="modular_addition", modulus=13, train_fraction=0.5),
                  train=TrainConfig(steps=20, batch_size=16, eval_every=10, eval_samples=16, snapshots=3))


def train(tmp_path, cfg, capsys) -> str:
    path = tmp_path / "cfg.json"
    path.write_text(cfg.to_json())
    assert main(["train", "--config", str(path), "--runs-dir", str(tmp_path / "runs"), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run_id"]


def test_the_command_reads_every_snapshot_and_refuses_other_tasks(tmp_path, capsys):
    from lab.engine.store import RunStore
    from lab.circuits.fourier import number_embedding

    run_id = train(tmp_path, GROK, capsys)
    assert main(["fourier", run_id, "--runs-dir", str(tmp_path / "runs"), "--top", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    store = RunStore(tmp_path / "runs")
    assert [s["step"] for s in out["spectra"]] == sorted(set(store.snapshot_steps(run_id)) | {20})
    final = spectrum(number_embedding(GROK, store.load_weights(run_id)), 20, top=3)  # by hand from the weights
    assert out["spectra"][-1]["frequencies"] == list(final.top)
    assert out["spectra"][-1]["fraction"] == pytest.approx(final.fraction, abs=1e-4) and len(final.power) == 6
    assert main(["fourier", run_id, "--runs-dir", str(tmp_path / "runs"), "--top", "0"]) == 2
    assert "--top: 0 is out of range (allowed: 1 to 64)" in capsys.readouterr().err
    copy = train(tmp_path, run_config(model=GROK.model, task=TaskConfig(name="copy", n_symbols=5, min_len=2, max_len=4),
                                      train=replace(GROK.train, steps=2)), capsys)
    assert main(["fourier", copy, "--runs-dir", str(tmp_path / "runs")]) == 2
    assert "its task is copy, but the Fourier picture is of modular addition" in capsys.readouterr().err
    store.close()
