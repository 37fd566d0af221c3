"""The project as a library (pyproject.toml): its dependency lists equal the requirements files', `import lab`
stays light (no gradio, Ray or Trackio; not even torch until an API name is used), the public API is the one
docs/python-api.md documents, and (slow) `pip install` of the checkout into a fresh virtual environment gives
a working console command and an importable package outside the checkout."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the package itself supports 3.10


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def requirement_lines(name: str) -> list[str]:
    """A requirements file's requirements: comments, blank lines and -r includes left out."""
    out = []
    for line in (REPO / name).read_text(encoding="utf-8").splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-r")):
            out.append(line)
    return out


def canonical(req: str) -> str:
    return re.sub(r"\s+", "", req).replace("'", '"')


def test_dependencies_equal_the_requirements_files():
    from packaging.requirements import Requirement

    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    lines = [canonical(r) for r in requirement_lines("requirements.txt")]
    pins = [Requirement(r) for r in lines if r.startswith("torch")]
    library = [Requirement(r) for r in project["dependencies"]]
    assert library[0].name == "torch" and not any(s.operator == "==" for s in library[0].specifier)  # a range
    assert len(pins) == 2 and all(library[0].specifier.contains(str(next(iter(p.specifier)).version)) for p in pins)
    # requirements.txt = torch's pins, then the library's other lines, then the app extra's
    assert lines[2:] == [canonical(r) for r in project["dependencies"][1:] + extras["app"]]
    assert [canonical(r) for r in extras["scale"]] == [canonical(r) for r in requirement_lines("requirements-scale.txt")]
    name = project["name"]
    assert extras["dev"][0] == f"{name}[app,scale]"  # requirements-dev.txt's "-r requirements.txt", "-r ...scale.txt"
    assert [canonical(r) for r in extras["dev"][1:]] == [canonical(r) for r in requirement_lines("requirements-dev.txt")]
    dev_includes = (REPO / "requirements-dev.txt").read_text(encoding="utf-8")
    assert "-r requirements.txt" in dev_includes and "-r requirements-scale.txt" in dev_includes


def test_metadata_names_the_console_command_and_the_version():
    data = pyproject()
    project = data["project"]
    assert project["name"] == "transformer-ablation-lab"
    assert project["requires-python"] == ">=3.10,<3.13"
    assert project["scripts"] == {"ablation-lab": "lab.cli.main:main"}
    assert data["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "lab.__version__"}
    import lab
    assert re.fullmatch(r"\d+\.\d+\.\d+", lab.__version__)
    # everything the wheel must carry for lab.demo(): the ui package (ui/app.py builds the app); no top-level
    # module (the checkout's app.py is only an entry point: an installed `app` would clash with a notebook's)
    assert data["tool"]["setuptools"]["py-modules"] == []
    assert {"lab", "lab.*", "ui", "ui.*"} <= set(data["tool"]["setuptools"]["packages"]["find"]["include"])
    assert list((REPO / "lab" / "teach").glob("*.json")), "package-data names lab/teach/*.json"


@pytest.mark.app
def test_build_outputs_are_ignored_by_git():
    ignored = subprocess.run(["git", "check-ignore", "build/lib/x.py", "transformer_ablation_lab.egg-info/PKG-INFO"],
                             cwd=REPO, capture_output=True, text=True)
    assert ignored.stdout.split() == ["build/lib/x.py", "transformer_ablation_lab.egg-info/PKG-INFO"]


HEAVY = ("gradio", "ray", "trackio")
PROBE = """
import json, sys
import lab
bare = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'gradio', 'ray', 'trackio', 'matplotlib'})
assert lab.api.figures.METRICS  # the API package itself is reachable from the front door
names = {name: getattr(lab, name) for name in lab.__all__}  # every public name, loaded
import lab.api.runs, lab.api.figures, lab.api.cache, lab.api.configs
print(json.dumps({"bare": bare, "after": sorted({m.split('.')[0] for m in sys.modules})}))
"""


@pytest.mark.app
def test_import_lab_does_not_import_gradio_ray_or_trackio(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["bare"] == []  # `import lab` alone: nothing heavy, not even torch
    assert not set(HEAVY) & set(seen["after"]), seen["after"]  # every API name loaded: still no app, Ray, Trackio
    assert "torch" in seen["after"] and "matplotlib" in seen["after"]


def test_public_names_are_the_api_and_documented():
    import lab
    import lab.api

    assert lab.__all__ == lab.api.__all__
    assert set(dir(lab)) >= set(lab.__all__)
    with pytest.raises(AttributeError):
        lab.no_such_name  # noqa: B018
    page = (REPO / "docs" / "python-api.md").read_text(encoding="utf-8")
    for name in lab.__all__:
        assert f"`{name}" in page or f"lab.{name}" in page, f"docs/python-api.md does not document {name}"


def _working_tree(dest: Path) -> None:
    """The checkout's files as they are now (tracked, and new ones git does not ignore), copied to `dest`:
    the install builds there, so build/ and *.egg-info never land in the checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


@pytest.mark.app
def test_pip_install_into_a_fresh_venv_gives_the_command_and_the_package(tmp_path):
    """`python -m venv --system-site-packages` (the runtime's packages come from this environment: no
    download), then `pip install` of the checkout's working tree; the console command and `import lab` run
    from a folder outside the checkout, and the imported package is the venv's copy."""
    src, venv, outside = tmp_path / "src", tmp_path / "venv", tmp_path / "elsewhere"
    src.mkdir()
    outside.mkdir()
    _working_tree(src)
    # --without-pip: pip and setuptools come from this environment too (a venv's own bundled setuptools can be
    # too old to build a wheel without the `wheel` package); pip still installs into the venv
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    py = bindir / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["LAB_RUNS_DIR"] = str(tmp_path / "runs")
    install = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                              "--no-index", str(src)], cwd=outside, env=env, capture_output=True, text=True,
                             timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    listed = subprocess.run([str(bindir / "ablation-lab"), "list", "--json"], cwd=outside, env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    helped = subprocess.run([str(bindir / "ablation-lab"), "--help"], cwd=outside, env=env, capture_output=True,
                            text=True, timeout=120)
    assert helped.returncode == 0 and "train" in helped.stdout and helped.stdout.startswith("usage: ablation-lab")
    (outside / "app.py").write_text("raise ImportError(\"a notebook folder's own app.py\")\n")  # lab.demo() must not read it
    code = ("import json, sys, lab; cfg = lab.make_config(task='copy', n_layers=3); n = lab.count_params(cfg); "
            "heavy = 'gradio' in sys.modules; demo = lab.demo(); import ui.app; "
            "print(json.dumps({'lab': lab.__file__, 'app': ui.app.__file__, 'version': lab.__version__, "
            "'params': n, 'gradio_before': heavy, 'demo': type(demo).__name__}))")
    probe = subprocess.run([str(py), "-c", code], cwd=outside, env=env, capture_output=True, text=True, timeout=180)
    assert probe.returncode == 0, probe.stderr
    info = json.loads(probe.stdout.strip().splitlines()[-1])
    assert Path(info["lab"]).resolve().is_relative_to(venv.resolve())  # the installed copy, not the checkout
    assert Path(info["app"]).resolve().is_relative_to(venv.resolve())  # the app ships for lab.demo()
    assert info["params"] > 0 and info["gradio_before"] is False and info["demo"] == "Blocks"  # gradio on demo() only
    shown = subprocess.run([str(py), "-m", "pip", "show", "transformer-ablation-lab"], cwd=outside, env=env,
                           capture_output=True, text=True, timeout=120)
    assert f"Version: {info['version']}" in shown.stdout
    data = Path(info["lab"]).parent / "teach" / "sequence_length.json"
    assert data.is_file()  # package data travels in the wheel


LIGHT_PROBE = """
import importlib.util, json, torch, lab
torch.set_num_threads(2)
run = lab.train(task="copy", steps=5, d_model=16, n_heads=2, n_layers=1, eval_every=5, threads=1, progress=False)
try:
    lab.demo()
    refused = ""
except ImportError as exc:
    refused = str(exc)
print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "state": run.state,
                  "gradio": importlib.util.find_spec("gradio") is not None, "refused": refused}))
"""


@pytest.mark.app
def test_the_library_installs_alone_and_keeps_the_torch_a_notebook_has(tmp_path):
    """A fresh virtual environment (nothing from this one) holding a torch first, as Colab's does; `pip install`
    of the checkout without the app extra keeps that torch, brings no gradio, and `lab.train` works and gives
    the notebook its thread count back; `lab.demo()` says which extra it needs. The torch installed first is this
    environment's version (on this project's machines pip takes it from a file on disk: no download), or the one
    LAB_NOTEBOOK_TORCH names (e.g. 2.14.1, a CUDA build of several GB), to check that another version stays."""
    import torch

    src, venv = tmp_path / "src", tmp_path / "venv"
    src.mkdir()
    _working_tree(src)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
    theirs = os.environ.get("LAB_NOTEBOOK_TORCH") or torch.__version__.split("+")[0]
    for what in ([f"torch=={theirs}"], [str(src)]):
        done = subprocess.run(pip + what, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    before = subprocess.run([str(py), "-m", "pip", "show", "torch"], env=env, capture_output=True, text=True).stdout
    probe = subprocess.run([str(py), "-c", LIGHT_PROBE], cwd=tmp_path, env={**env, "LAB_RUNS_DIR": str(tmp_path / "runs")},
                           capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen["torch"].split("+")[0] == theirs and f"Version: {theirs}" in before  # torch stayed
    assert seen["state"] == "completed" and seen["threads"] == 2  # trained, and the notebook's 2 threads are back
    assert seen["gradio"] is False and "transformer-ablation-lab[app]" in seen["refused"]
