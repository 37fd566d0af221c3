"""`python -m lab ablate` and `python -m lab sample` run as real subprocesses on a small trained run: the
JSON they print against the same functions called directly (lab/views/probing.py), and bad input."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from lab.cli.main import main
from lab.config import ModelConfig, RunConfig, TaskConfig
from lab.engine.store import RunStore
from lab.interventions import Interventions, parse_heads
from lab.tasks.batches import get_task
from lab.views.analysis import load_model
from lab.views.probing import ablation_report, generate, importance_map
from lab.records import EXACT_MATCH

REPO = Path(__file__).resolve().parents[1]
TRAIN = ["train", "--task", "copy", "--max-len", "4", "--n-layers", "2", "--n-heads", "2", "--d-model", "32",
         "--d-ff", "64", "--steps", "300", "--batch-size", "32", "--threads", "1", "--device", "cpu", "--json"]


def lab(*args: str, runs_dir: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    """`python -m lab ARGS` from the repository root on the store `runs_dir`."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", LAB_RUNS_DIR=str(runs_dir))
    return subprocess.run([sys.executable, "-m", "lab", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def one_json(res: subprocess.CompletedProcess) -> dict:
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert res.stdout.count("\n") == 1 and res.stdout.endswith("\n"), res.stdout  # exactly one line
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, str]:
    """A store with one copy run trained through the CLI (a few seconds), and its id."""
    runs = tmp_path_factory.mktemp("probe_runs")
    out = one_json(lab(*TRAIN, runs_dir=runs))
    assert out["status"] == "completed"
    return runs, out["run_id"]


def loaded(runs: Path, run_id: str):
    store = RunStore(runs)
    cfg = store.config(run_id)
    return cfg, load_model(cfg, store.load_weights(run_id))


def close(a: dict, b: dict) -> None:
    """Two {"eval": {...}, "ood": {...}} reports agree (float sums may differ in the last bits across processes)."""
    assert a.keys() == b.keys()
    for split in a:
        assert (a[split] is None) == (b[split] is None)
        if a[split] is not None:
            assert a[split] == pytest.approx(b[split], rel=1e-5, abs=1e-6), split


@pytest.mark.app
def test_ablate_json_matches_ablation_report(trained):
    runs, run_id = trained
    out = one_json(lab("ablate", run_id, "--heads", "1.0,1.1", "--json", runs_dir=runs))
    assert {"intact", "ablated", "interventions"} <= out.keys()
    cfg, model = loaded(runs, run_id)
    direct = ablation_report(model, cfg, Interventions(heads=parse_heads("1.0,1.1")))
    close(out["intact"], direct["intact"])  # the run's own held-out metrics, computed here
    close(out["ablated"], direct["ablated"])
    assert out["interventions"] == direct["interventions"] == ["knock out head 1.0 (zero)", "knock out head 1.1 (zero)"]
    assert out["intact"]["eval"][EXACT_MATCH] > 0.5  # the run learned to copy
    assert out["intact"]["ood"] is not None  # copy is evaluated at longer lengths too
    assert out["ablated"]["eval"]["loss"] != pytest.approx(out["intact"]["eval"]["loss"], rel=1e-3)


@pytest.mark.app
def test_ablate_table_and_composed_interventions(trained):
    runs, run_id = trained
    res = lab("ablate", run_id, "--heads", "0.1", "--mode", "mean", "--skip-ff", "0", "--no-pos", runs_dir=runs)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith(f"run {run_id}: copy, decoder, 2 layers x 2 heads")
    assert lines[1] == ("interventions: knock out head 0.1 (mean); skip feed-forward of layer 0; "
                        "remove the positional encoding")
    assert any(line.startswith("training lengths intact") for line in lines)
    assert sum("ablated" in line for line in lines) == 2  # at the training lengths and the longer ones


@pytest.mark.app
def test_importance_json_is_layers_by_heads(trained):
    runs, run_id = trained
    out = one_json(lab("ablate", run_id, "--importance", "--json", runs_dir=runs))
    assert len(out["loss"]) == 2 and all(len(row) == 2 for row in out["loss"])
    assert len(out[EXACT_MATCH]) == 2 and all(len(row) == 2 for row in out[EXACT_MATCH])
    cfg, model = loaded(runs, run_id)
    imp = importance_map(model, cfg)
    np.testing.assert_allclose(out["loss"], imp.loss, rtol=1e-5)
    np.testing.assert_allclose(out[EXACT_MATCH], imp.exact, atol=1e-6)
    assert out["intact"]["loss"] == pytest.approx(imp.intact_loss, rel=1e-5)
    assert out["ranked"][0]["head"] == str(imp.ranked()[0][0])
    assert out["sentence"].startswith("knocking out layer ")



@pytest.mark.app
def test_importance_table(trained, capsys):
    runs, run_id = trained
    assert main(["ablate", run_id, "--importance", "--runs-dir", str(runs)]) == 0
    table = capsys.readouterr().out
    assert "held-out loss with each head knocked out (zero; intact " in table
    assert "layer 1" in table and "head 1" in table
    assert table.rstrip().endswith(".") and "Knocking out layer" in table


@pytest.mark.app
def test_sample_greedy_is_deterministic_and_equals_generate(trained):
    runs, run_id = trained
    args = ("sample", run_id, "--prompt", "3 1 2", "--tokens", "5", "--temperature", "0", "--json")
    first, second = (one_json(lab(*args, runs_dir=runs)) for _ in range(2))
    assert first == second
    cfg, model = loaded(runs, run_id)
    sep = get_task("copy").sep(cfg.task)
    assert first["prompt_tokens"] == [3, 1, 2, sep]  # the separator is added after a seq2seq prompt
    assert first["tokens"] == generate(model, cfg, torch.tensor([[3, 1, 2, sep]]), 5, 0.0, 0)
    assert first["tokens"][:3] == [3, 1, 2]  # a copy model copies
    assert first["continuation"] == [str(t) if t != sep else "|" for t in first["tokens"]]


@pytest.mark.app
def test_sample_at_a_temperature_follows_the_seed(trained):
    runs, run_id = trained
    out = one_json(lab("sample", run_id, "--prompt", "4,4,1|", "--tokens", "6", "--temperature", "1.5",
                       "--seed", "7", "--json", runs_dir=runs))
    cfg, model = loaded(runs, run_id)
    assert out["prompt_tokens"] == [4, 4, 1, 10]  # a typed separator is not doubled
    assert out["tokens"] == generate(model, cfg, torch.tensor([out["prompt_tokens"]]), 6, 1.5, 7)



@pytest.mark.app
def test_sample_prints_prompt_and_continuation(trained, capsys):
    runs, run_id = trained
    assert main(["sample", run_id, "--prompt", "441", "--tokens", "3", "--temperature", "0", "--runs-dir",
                 str(runs)]) == 0
    cfg, model = loaded(runs, run_id)
    new = generate(model, cfg, torch.tensor([[4, 4, 1, 10]]), 3, 0.0, 0)
    assert capsys.readouterr().out == f"4 4 1 |  ->  {' '.join(map(str, new))}\n"


def test_sample_reads_a_text_runs_prompt_as_typed(tmp_path, capsys):
    """The text task's prompt is characters as typed (spaces included) and its continuation is text; the
    weights here are the seeded initialisation saved as the run's (what is sampled does not matter)."""
    cfg = RunConfig(task=TaskConfig(name="text", min_len=2, max_len=16),
                    model=ModelConfig(n_layers=1, n_heads=2, d_model=16, d_ff=32, n_ctx=32))
    store = RunStore(tmp_path)
    run_id = store.create(cfg, owner="test")
    model = load_model(cfg)
    store.save_weights(run_id, model.state_dict())
    argv = ["sample", run_id, "--prompt", "the cat", "--tokens", "5", "--temperature", "0", "--json",
            "--runs-dir", str(tmp_path)]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    task = get_task("text")
    assert out["prompt_tokens"] == task.encode_prompt(cfg.task, "the cat")  # 7 characters, the space kept
    assert out["tokens"] == generate(model, cfg, torch.tensor([out["prompt_tokens"]]), 5, 0.0, 0)
    assert out["text"] == task.decode(cfg.task, out["tokens"])
    assert main(argv[:3] + ["the €"] + argv[4:]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lab: error: --prompt: ") and "'€' is not a character of the text" in err, err


@pytest.fixture(scope="module")
def unready(trained) -> tuple[str, str]:
    """Two runs in the same store: one with no weights yet, one encoder-decoder."""
    store = RunStore(trained[0])
    cfg = RunConfig()
    enc_dec = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, arch="encoder-decoder"))
    return store.create(cfg, owner="test"), store.create(enc_dec, owner="test")


@pytest.mark.app
def test_bad_input_in_a_real_process(trained, unready):
    """Exit status 2 and one line naming the flag or the run, from `python -m lab` itself."""
    runs, run_id = trained
    cases = [  # (argv, what the one stderr line must contain)
        (["ablate", run_id, "--heads", "9.9"], ["--heads", "9.9", "not a head of this model"]),
        (["ablate", "no-such-run", "--heads", "1.0"], ["run_id", "'no-such-run'", "does not exist"]),
        (["sample", unready[0], "--prompt", "1"], ["run_id", "no saved weights"]),
        (["sample", run_id, "--prompt", "3 x 2"], ["--prompt", "'x' is not a symbol of task 'copy'"]),
    ]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda c: lab(*c[0], runs_dir=runs), cases))
    for (argv, needles), res in zip(cases, results):
        assert res.returncode == 2, (argv, res.stdout, res.stderr)
        assert res.stdout == "", argv
        assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1, (argv, res.stderr)
        assert res.stderr.startswith("lab: error: "), res.stderr
        for needle in needles:
            assert needle in res.stderr, (argv, needle, res.stderr)


BAD = [  # (argv after RUN_ID, what the one stderr line must contain); "{none}": the run with no weights
    (["ablate", "{run}", "--heads", "1.x"], ["--heads", "'1.x'"]),
    (["ablate", "{none}", "--heads", "1.0"], ["run_id", "no saved weights"]),
    (["ablate", "{run}"], ["--heads", "nothing to ablate"]),
    (["ablate", "{run}", "--heads", "1.0", "--mode", "half"], ["--mode", "'half'"]),
    (["ablate", "{run}", "--skip-block", "2"], ["--skip-block", "not a layer"]),
    (["ablate", "{run}", "--skip-ff", "0", "--importance"], ["--importance", "leave out"]),
    (["ablate", "{run}", "--importance", "--kind", "cross"], ["--kind", "'cross'"]),
    (["ablate", "{run}", "--no-pos", "--shuffle-pos"], ["--shuffle-pos", "--no-pos"]),
    (["sample", "{run}", "--prompt", " , "], ["--prompt", "is empty"]),
    (["sample", "{run}", "--prompt", "1", "--tokens", "0"], ["--tokens", "0"]),
    (["sample", "{run}", "--prompt", "1", "--tokens", "many"], ["--tokens", "'many'"]),
    (["sample", "{run}", "--prompt", "1", "--temperature", "9"], ["--temperature", "9"]),
    (["sample", "{enc_dec}", "--prompt", "1"], ["run_id", "encoder-decoder", "needs a decoder run"]),
    (["sample", "{run}"], ["--prompt"]),
]


@pytest.mark.app
@pytest.mark.parametrize("argv,needles", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_names_the_flag(trained, unready, argv, needles, capsys):
    """The same checks through lab.cli.main in this process (argparse's own errors exit as SystemExit 2)."""
    runs, run_id = trained
    ids = {"{run}": run_id, "{none}": unready[0], "{enc_dec}": unready[1]}
    try:
        code = main([ids.get(a, a) for a in argv] + ["--runs-dir", str(runs)])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr()
    assert code == 2 and err.out == "", err
    assert err.err.startswith("lab: error: ") and err.err.count("\n") == 1, err.err
    for needle in needles:
        assert needle in err.err, (needle, err.err)


@pytest.mark.app
def test_ablate_at_a_snapshot_step_uses_the_weights_kept_then(trained, capsys):
    """`--step 0` is the untrained model (its seeded initialisation, kept in float16 with the snapshot)."""
    runs, run_id = trained
    store = RunStore(runs)
    cfg = store.config(run_id)
    assert 0 in store.snapshot_steps(run_id)
    assert main(["ablate", run_id, "--heads", "0.0", "--step", "0", "--json", "--runs-dir", str(runs)]) == 0
    out = json.loads(capsys.readouterr().out)
    init = {k: v.half().float() for k, v in load_model(cfg).state_dict().items()}  # what the snapshot kept
    expected = ablation_report(load_model(cfg, init), cfg, Interventions(heads=parse_heads("0.0")))
    assert out["step"] == 0
    close(out["intact"], expected["intact"])
    final = one_json(lab("ablate", run_id, "--heads", "0.0", "--json", runs_dir=runs))
    assert final["step"] == cfg.train.steps and final["intact"]["eval"]["loss"] < out["intact"]["eval"]["loss"]
    assert main(["ablate", run_id, "--heads", "0.0", "--step", "7", "--runs-dir", str(runs)]) == 2
    assert "--step" in capsys.readouterr().err
