"""`python -m lab sweep` and what it shares with the app's grid (lab/engine/grid.py), the Ray settings read
from the environment, and Ray staying optional: nothing in `lab` imports it, and without it installed a
Ray address is refused in one line naming where it came from, before any run folder is written. Training
on a real Ray cluster is tests/test_ray.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.config import RunConfig
from lab.engine.environment import detect, ray_address, ray_gpus
from lab.engine.grid import GridError, build_grid, parse_spec, parse_values
from lab.views.seed_groups import spread
from tests.helpers import CLI_TINY as TINY, REPO, lab

# `import ray` fails in this interpreter, as where the optional requirements are not installed
NO_RAY = ("import sys\nclass _NoRay:\n    def find_spec(self, name, path=None, target=None):\n"
          "        if name == 'ray' or name.startswith('ray.'):\n            raise ImportError('No module named ray')\n"
          "sys.meta_path.insert(0, _NoRay())\n")


def test_spec_reads_short_names_lists_and_ranges():
    axes = parse_spec("pos=rope,alibi norm=pre,post seed=0..4")
    assert axes == [("PE", ("rope", "alibi")), ("norm", ("pre", "post")), ("seed", (0, 1, 2, 3, 4))]
    assert parse_spec("PE=none layers=1,2") == [("PE", ("none",)), ("layers", (1, 2))]
    cfgs = build_grid(RunConfig(), axes, max_runs=1000, max_axes=6)
    assert len(cfgs) == 20 and cfgs[0].name == "pos=rope norm=pre seed=0" and cfgs[-1].train.seed == 4


@pytest.mark.parametrize("spec, field, words", [
    ("pos=rope,foo", "grid.PE", "'foo' is not one of"),
    ("depth=1,2", "grid", "is not AXIS=VALUES"),
    ("seed=4..1", "grid.seed", "is not a range"),
    ("seed=0..x", "grid.seed", "is not a range"),
    ("pos=rope pos=alibi", "grid.PE", "given twice"),
    ("", "grid", "no axes given"),
])
def test_a_bad_spec_names_the_axis_and_what_is_allowed(spec, field, words):
    with pytest.raises(GridError) as err:
        parse_spec(spec)
    assert err.value.field == field and words in str(err.value)


def test_the_app_grid_reads_ranges_too():
    """One module owns the grid's semantics: the app's value boxes take FIRST..LAST as the CLI does."""
    assert parse_values("seed", "0..3") == (0, 1, 2, 3)
    assert parse_values("layers", "1, 3..4") == (1, 3, 4)
    with pytest.raises(GridError, match="listed twice"):
        parse_values("seed", "0..2, 1")


def test_spread_is_mean_and_range_over_seeds():
    assert spread([0.5, 1.0, 1.5]) == "1.000 [0.500, 1.500]"
    assert spread([0.25]) == "0.250" and spread([None, float("nan")]) == ""


@pytest.mark.app
@pytest.mark.parametrize("args, words", [
    (["--grid", "pos=rope,fancy"], "grid.PE: 'fancy' is not one of"),
    (["--grid", "heads=2,3", "--d-model", "16"], "heads=3 is invalid"),
    (["--grid", "seed=0,1", "--steps", "0"], "train.steps"),
    (["--grid", "seed=0,1", "--max-concurrent", "0"], "--max-concurrent"),
    (["--grid", "seed=0..2000"], "is not a range"),
])
def test_a_bad_sweep_exits_2_in_one_line_and_writes_nothing(tmp_path, args, words):
    out = lab("sweep", *args, runs_dir=tmp_path / "runs")
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_ray_settings_from_the_environment():
    env = {"LAB_RAY_ADDRESS": " auto ", "LAB_BATCH_SEEDS": "on"}
    e = detect(env, affinity=2, cuda=False)
    assert (e.mode, e.ray_address, e.slots, e.batch_seeds, e.threads_per_job) == ("ray", "auto", 0, False, 1)
    assert "Ray tasks (auto)" in e.describe()
    assert detect({"LAB_RAY_ADDRESS": "h:1", "LAB_MAX_CONCURRENT": "300"}, affinity=2, cuda=False).slots == 300
    assert ray_address({}) is None and ray_gpus({}) == 0.0 and ray_gpus({"LAB_RAY_GPUS": "0.25"}) == 0.25
    with pytest.raises(ValueError, match="LAB_RAY_ADDRESS"):
        ray_address({"LAB_RAY_ADDRESS": "a b"})
    for bad in ("half", "-1", "9"):
        with pytest.raises(ValueError, match="LAB_RAY_GPUS"):
            ray_gpus({"LAB_RAY_GPUS": bad})


@pytest.mark.app
def test_nothing_in_lab_imports_ray():
    code = ("import sys, lab, lab.cli.main, lab.engine.jobs, lab.engine.slots, lab.engine.environment, lab.engine.grid, "
            "lab.cli.sweep, lab.engine.trackio_board\nlab.cli.main.build_parser()\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


@pytest.mark.app
def test_without_ray_a_ray_address_is_refused_in_one_line(tmp_path):
    runs = tmp_path / "runs"
    code = NO_RAY + (f"from lab.cli.main import main\nsys.exit(main(['sweep', '--grid', 'seed=0,1', *{TINY!r}, "
                     f"'--steps', '5', '--ray', 'auto', '--runs-dir', {str(runs)!r}]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "LAB_RAY_ADDRESS" in out.stderr and "requirements-scale.txt" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not runs.exists() or not any(p for p in runs.iterdir() if p.name != ".locks")


@pytest.mark.app  # two worker processes train
def test_a_local_sweep_trains_every_run_and_summarises_the_groups(tmp_path):
    out = lab("sweep", "--grid", "pos=rope,alibi seed=0..1", *TINY, "--steps", "20", "--json",
              runs_dir=tmp_path / "runs", timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert [r["name"] for r in result["runs"]] == ["pos=rope seed=0", "pos=rope seed=1", "pos=alibi seed=0",
                                                   "pos=alibi seed=1"]
    assert all(r["state"] == "completed" and r["steps"] == 20 for r in result["runs"])
    assert [(g["group"], g["runs"], g["seeds"]) for g in result["groups"]] == [("pos=rope", 2, "0, 1"),
                                                                             ("pos=alibi", 2, "0, 1")]
    losses = [r["eval"]["loss"] for r in result["runs"][:2]]
    assert result["groups"][0]["eval loss"] == spread(losses)
    assert out.stderr.count("] pos=") == 4 and "[4/4]" in out.stderr  # a progress line per run
    assert len(list(Path(tmp_path / "runs").glob("2*"))) == 4
