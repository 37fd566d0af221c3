"""`python -m lab train|list|show`, run as a real subprocess: bad flag values, the --json contract,
the store it writes, and what SIGKILL and SIGINT leave behind."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from lab.params import param_breakdown
from lab.cli.main import main
from lab.config import RunConfig
from tests.helpers import CLI_TINY as TINY, REPO, lab, lab_env, one_json
from lab.records import EXACT_MATCH, LOSS, TOKEN_ACC

SUMMARY_KEYS = {"run_id", "run_dir", "status", "params", "steps", "train_loss", "eval", "ood", "train_set", "wall_s",
                "tokens_per_s", "device"}
RUN_FILES = ("config.json", "status.json", "metrics.jsonl", "weights.safetensors", "summary.json")


def start(*args: str, runs_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lab", *args], cwd=REPO, env=lab_env(runs_dir),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_metrics(proc: subprocess.Popen, runs_dir: Path, timeout: float = 120) -> Path:
    """The run folder once its metrics.jsonl holds a complete line (training is under way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"train exited early with {proc.returncode}: {proc.stderr.read()}")
        for path in runs_dir.glob("*/metrics.jsonl"):
            if b"\n" in path.read_bytes():
                return path.parent
        time.sleep(0.05)
    pytest.fail("no metrics line within the timeout")


def listing(runs_dir: Path) -> list[dict]:
    res = lab("list", "--json", runs_dir=runs_dir)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    return one_json(res.stdout)


# ---- bad values: status 2, one line naming the field, nothing stored ---------------------
BAD = [  # (argv, what the one stderr line must name)
    ("train --d-model 100 --n-heads 8", ["model.d_model", "--d-model"]),
    ("train --task revers", ["task.name", "--task", "'reverse'"]),
    ("train --steps abc", ["train.steps", "--steps"]),
    ("train --steps 0", ["train.steps", "--steps"]),
    ("train --pos rop", ["model.pos", "--pos", "'rope'"]),
    ("train --lr -1", ["train.lr", "--lr"]),
    ("train --n-ctx 4", ["model.n_ctx", "--n-ctx"]),
    ("train --arch encoder-decoder --task induction", ["task.name", "induction"]),
    ("train --device tpu", ["train.device", "--device"]),
    ("show ../x", ["run_id", "../x"]),
    ("show no-such-run", ["run_id", "no-such-run", "does not exist"]),
]
if not torch.cuda.is_available():  # a device this machine lacks is refused before a run folder exists
    BAD.append(("train --device cuda", ["train.device", "--device", "cuda"]))
QUICK = ("train --d-model 100 --n-heads 8", "train --steps abc", "show ../x")  # the rest: in process, and slow


def run_bad(argvs, root: Path) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Bad commands two at a time (each pays a torch import), each with its own store path."""

    def run(i_argv):
        i, argv = i_argv
        runs = root / f"runs{i}"
        return argv, (lab(*argv.split(), runs_dir=runs), runs)

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(run, enumerate(argvs)))


def check_bad(res: subprocess.CompletedProcess, runs: Path, names: list[str]) -> None:
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("lab: error: ")
    for name in names:
        assert name in lines[0], lines[0]
    assert "Traceback" not in res.stderr
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.app
def test_bad_values_as_subprocess(tmp_path):
    names = dict(BAD)
    for argv, (res, runs) in run_bad(QUICK, tmp_path).items():
        check_bad(res, runs, names[argv])


@pytest.mark.app
def test_every_bad_value_as_subprocess(tmp_path):
    for argv, (res, runs) in run_bad([a for a, _ in BAD if a not in QUICK], tmp_path).items():
        check_bad(res, runs, dict(BAD)[argv])


@pytest.mark.app
@pytest.mark.parametrize("argv,names", BAD, ids=[a for a, _ in BAD])
def test_bad_value_exits_2_with_one_line_in_process(tmp_path, capsys, argv, names):
    runs = tmp_path / "runs"
    try:
        rc = main([*argv.split(), "--runs-dir", str(runs)])
    except SystemExit as exc:  # argparse type errors
        rc = exc.code
    out, err = capsys.readouterr()
    check_bad(subprocess.CompletedProcess(argv, rc, out, err), runs, names)


@pytest.mark.parametrize("argv,field", [
    (["--norm", "layer"], "model.norm"), (["--dropout", "2"], "model.dropout"), (["--lr", "nan"], "train.lr"),
    (["--max-len", "3", "--min-len", "5"], "task.max_len"), (["--n-heads", "0"], "model.n_heads"),
    (["--ood-len", "4", "--max-len", "8"], "task.ood_len"), (["--threads", "x"], "train.threads"),
    (["--name", "n" * 201], "name"), (["--config", "/nonexistent/cfg.json"], "--config"),
])
def test_more_bad_values_in_process(tmp_path, capsys, argv, field):
    runs = tmp_path / "runs"
    try:
        rc = main(["train", *argv, "--runs-dir", str(runs)])
    except SystemExit as exc:  # argparse type errors
        rc = exc.code
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and field in err
    assert not runs.exists()


def test_config_file_is_validated_and_flags_override_it(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": {"d_modle": 32}}')
    assert main(["train", "--config", str(bad), "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "model.d_modle" in err and "d_model" in err and len(err.splitlines()) == 1
    from lab.cli.main import build_parser, config_from_args

    good = tmp_path / "good.json"
    good.write_text(RunConfig().to_json())
    cfg = config_from_args(build_parser().parse_args(["train", "--config", str(good), "--pos", "alibi",
                                                      "--lr", "0.01", "--name", "x"]))
    assert (cfg.model.pos, cfg.train.lr, cfg.name) == ("alibi", 0.01, "x")
    assert cfg.model.d_model == RunConfig().model.d_model
    assert not (tmp_path / "runs").exists()


# ---- a real run ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    runs = tmp_path_factory.mktemp("store") / "runs"
    res = lab("train", *TINY, "--steps", "20", "--eval-every", "10", "--name", "cli-test", "--json",
              "--runs-dir", str(runs))
    assert res.returncode == 0, res.stderr
    return res, runs


@pytest.mark.app
def test_train_json_prints_one_summary_object(trained):
    res, runs = trained
    out = one_json(res.stdout)
    assert set(out) == SUMMARY_KEYS
    assert out["status"] == "completed" and out["steps"] == 20 and out["device"] == "cpu"
    run_dir = Path(out["run_dir"])
    assert run_dir.parent == runs.resolve() and run_dir.name == out["run_id"]
    for name in RUN_FILES:
        assert (run_dir / name).is_file(), name
    cfg = RunConfig.from_json((run_dir / "config.json").read_text())
    assert cfg.name == "cli-test" and cfg.model.d_model == 16 and cfg.train.steps == 20 and cfg.train.threads == 1
    assert out["params"] == sum(param_breakdown(cfg).values())
    for part in ("eval", "ood", "train_set"):  # held out, at longer lengths, and on the training distribution
        assert set(out[part]) == {LOSS, TOKEN_ACC, EXACT_MATCH}
        assert 0 <= out[part][TOKEN_ACC] <= 1 and 0 <= out[part][EXACT_MATCH] <= 1
        assert 0 < out[part]["loss"] < 10
    assert 0 < out["train_loss"] < 10 and out["wall_s"] > 0 and out["tokens_per_s"] > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {k: summary[k] for k in SUMMARY_KEYS - {"run_id", "run_dir", "status"}} == {
        k: out[k] for k in SUMMARY_KEYS - {"run_id", "run_dir", "status"}}
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in rows} == {"train", "eval"}
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [10, 20]
    assert max(r["step"] for r in rows if r["kind"] == "train") == 20


@pytest.mark.app
def test_train_progress_goes_to_stderr(trained):
    res, _ = trained
    progress = [line for line in res.stderr.splitlines() if "/20" in line]
    assert progress and progress[-1].lstrip("\r").startswith("[") and "20/20" in progress[-1]
    assert "loss" in progress[-1] and "steps/s" in progress[-1]
    assert "Traceback" not in res.stderr and "steps/s" not in res.stdout


@pytest.mark.app
def test_list_and_show(trained):
    res, runs = trained
    out = json.loads(res.stdout)
    with ThreadPoolExecutor(2) as pool:  # list reads the store from $LAB_RUNS_DIR, show from --runs-dir
        listed = pool.submit(listing, runs)
        shown = pool.submit(lab, "show", out["run_id"], "--json", "--runs-dir", str(runs)).result()
        rows = listed.result()
    assert [r["run_id"] for r in rows] == [out["run_id"]]
    row = rows[0]
    assert row["state"] == "completed" and row["name"] == "cli-test" and row["damaged"] == ""
    assert row["model.d_model"] == 16
    assert row["final.eval.exact_match"] == pytest.approx(out["eval"][EXACT_MATCH])  # pandas rounds to 10 digits
    assert shown.returncode == 0, shown.stderr
    info = one_json(shown.stdout)
    assert info["run_id"] == out["run_id"] and info["status"]["state"] == "completed"
    assert RunConfig.from_dict(info["config"]) == RunConfig.from_json(
        (Path(out["run_dir"]) / "config.json").read_text())
    assert info["summary"]["steps"] == 20 and info["summary"]["eval"] == out["eval"]


def test_list_of_an_empty_store(tmp_path, capsys):
    assert main(["list", "--json", "--runs-dir", str(tmp_path / "nothing-here")]) == 0
    assert json.loads(capsys.readouterr().out) == [] and not (tmp_path / "nothing-here").exists()
    assert main(["list", "--runs-dir", str(tmp_path / "nothing-here")]) == 0
    assert capsys.readouterr().out.strip() == "no runs stored"


# ---- signals ---------------------------------------------------------------------------------
LONG = [*TINY, "--steps", "5000", "--eval-every", "100000", "--json"]  # far more than the test waits


def add_torn_copy(run_dir: str, runs: Path) -> Path:
    """A copy of a finished run whose metrics.jsonl ends in a torn line (a crash mid-write)."""
    copy = runs / Path(run_dir).name
    shutil.copytree(run_dir, copy)
    with open(copy / "metrics.jsonl", "ab") as fh:
        fh.write(b'{"kind": "train", "step": 21, "lo')
    return copy


@pytest.mark.app
def test_sigkill_mid_training_lists_as_interrupted_beside_a_torn_run(trained, tmp_path):
    """One store, one `list`: a run killed mid-training, and a finished run with a torn last line."""
    runs = tmp_path / "runs"
    proc = start("train", *LONG, runs_dir=runs)
    try:
        run_dir = wait_for_metrics(proc, runs)
        assert json.loads((run_dir / "status.json").read_text())["state"] == "running"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    done = json.loads(trained[0].stdout)
    torn = add_torn_copy(done["run_dir"], runs)
    rows = {r["run_id"]: r for r in listing(runs)}
    assert set(rows) == {run_dir.name, torn.name}
    killed = rows[run_dir.name]
    assert killed["state"] == "interrupted" and "died" in killed["error"]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "running"  # listing writes nothing
    assert rows[torn.name]["state"] == "completed" and rows[torn.name]["damaged"] == ""
    assert rows[torn.name]["final.eval.exact_match"] == pytest.approx(done["eval"][EXACT_MATCH])


@pytest.mark.app
def test_sigint_stops_cleanly(tmp_path):
    runs = tmp_path / "runs"
    proc = start("train", *LONG, runs_dir=runs)
    try:
        run_dir = wait_for_metrics(proc, runs)
        os.kill(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    out = one_json(stdout)
    assert set(out) == SUMMARY_KEYS
    assert out["status"] == "stopped" and out["run_id"] == run_dir.name
    assert 1 <= out["steps"] < 5000
    assert out["eval"] is not None and 0 <= out["eval"][EXACT_MATCH] <= 1  # evaluated where it stopped
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "stopped" and status["step"] == out["steps"]
    for name in RUN_FILES:
        assert (run_dir / name).is_file(), name
    assert json.loads((run_dir / "summary.json").read_text())["stopped"] is True
