"""The export to TransformerLens 4.x (lab/api/lens_export.py: a `TransformerBridge` from `boot_native`), checked
against the real transformer-lens 4.3.0. The test environment holds 3.9.0 (requirements-dev.txt) and the two
cannot share an environment, so this module makes a virtual environment that sees this one's packages
(`--system-site-packages`) and installs 4.3.0 alone over them, from the wheel scripts/test.sh fetched into .wheels/,
then runs tests/lens_bridge_check.py there.

The same notebook as the 3.9 check (tests/lens_notebook.py) on a learned-position and a rotary model trained a few
steps, and a cached run of every other setting the bridge expresses: every number and activation both name agree
to 1e-5, after the differences the export documents; the names only this lab caches are the ones it documents
the bridge never fires; what the bridge cannot compute is refused, naming the setting.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lens_bridge_check import REFUSED, SETTINGS

pytestmark = pytest.mark.app  # a virtual environment and a subprocess (tests/conftest.py, the tiers)
REPO = Path(__file__).resolve().parents[1]
VERSION = "4.3.0"  # as scripts/test.sh fetches it


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """tests/lens_bridge_check.py's JSON, run with transformer-lens 4.3.0."""
    venv = tmp_path_factory.mktemp("tl4") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    py = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    wheels = sorted((REPO / ".wheels").glob(f"transformer_lens-{VERSION}-*.whl"))
    assert wheels, f"no transformer-lens {VERSION} wheel in .wheels/: `bash scripts/test.sh` fetches it"
    done = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                           "--no-index", str(wheels[-1])], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    done = subprocess.run([str(py), "-m", "tests.lens_bridge_check"], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def never_fired(name: str, attn_only: bool) -> bool:
    """A name the export documents the bridge never fires (its attention-only blocks have no hook_resid_mid)."""
    return name.endswith(("attn.hook_result", "attn.hook_rot_q", "attn.hook_rot_k")) or (
        attn_only and name.endswith("hook_resid_mid"))


def test_the_environment_holds_transformerlens_4(checked: dict[str, Any]) -> None:
    assert checked["version"] == VERSION


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_a_transformerlens_notebook_gives_the_same_numbers_on_the_4x_bridge(checked: dict[str, Any], pos: str) -> None:
    seen = checked["models"][f"trained {pos}"]
    assert seen["type"] == "TransformerBridge"
    assert seen["failed"] == {}, seen["failed"]
    assert seen["compared"] >= 60  # the notebook's numbers and at least the six kinds of activation in each layer
    assert all(never_fired(name, False) for name in seen["only_ours"]), seen["only_ours"]
    if pos == "learned":  # the notebook's stack_head_results fills the bridge's cache with each hook_result
        assert seen["only_ours"] == []  # (TransformerLens computes them from hook_z and W_O): compared too


@pytest.mark.parametrize("keywords", SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_each_setting_the_bridge_expresses_gives_the_same_numbers(checked: dict[str, Any], keywords: dict) -> None:
    seen = checked["models"][json.dumps(keywords)]
    assert seen["failed"] == {}, seen["failed"]
    assert all(never_fired(name, keywords.get("d_ff") == 0) for name in seen["only_ours"]), seen["only_ours"]


@pytest.mark.parametrize("keywords, field", REFUSED, ids=lambda x: json.dumps(x) if isinstance(x, dict) else x)
def test_what_the_bridge_cannot_compute_is_refused_naming_the_setting(checked: dict[str, Any], keywords: dict,
                                                                      field: str) -> None:
    seen = checked["refused"][json.dumps(keywords)]
    assert seen is not None, f"{keywords} was exported"
    assert seen["field"] == field and f"{field} is " in seen["message"], seen
    if keywords.get("pos") == "alibi" or keywords.get("qk_norm") == "on":  # what only 4.x refuses says so
        assert "TransformerLens 4.x" in seen["message"], seen
