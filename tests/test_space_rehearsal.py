"""A short Space rehearsal (scripts/space_rehearsal.py): the app started as on a ZeroGPU Space, with the
real `spaces` package imported in its process (it patches torch there, so torch says CUDA is available
with no GPU) and a stub of the device API, holds 10 students for 30 s: no "Queue is full", no error, one
training slot per usable CPU, batched seeds off, every run finished.

Uses `spaces` from this environment (requirements-dev.txt pins it) or, without it, the script's venv
(pip installs it there: needs the network)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "space_rehearsal.py"


@pytest.mark.app
def test_a_zerogpu_space_holds_a_class_with_the_real_spaces_package():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from space_rehearsal import SPACES_VERSION
    finally:
        sys.path.remove(str(REPO / "scripts"))
    here = importlib.util.find_spec("spaces") is not None
    if here:
        from importlib.metadata import version

        assert version("spaces") == SPACES_VERSION, "requirements-dev.txt and the rehearsal pin the same spaces"
    args = [sys.executable, str(SCRIPT), "--space", "zerogpu", "--users", "10", "--minutes", "0.5", "--ramp-s", "5",
            "--json"] + (["--current-env"] if here else [])
    out = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines and not here and "pip" in out.stderr:
        pytest.skip(f"could not install spaces=={SPACES_VERSION} into the rehearsal's venv: {out.stderr[-300:]}")
    assert lines, out.stderr[-3000:]
    (r,) = json.loads(lines[-1])["results"]
    assert r["spaces_imported"] and r["torch_says_cuda"], "the real package was imported and patched torch"
    assert r["queue_full"] == 0 and r["errors"] == 0, r["error_samples"]
    assert r["slots"] == r["usable_cpus"] and not r["batch_seeds"], r
    assert r["environment"].startswith("zerogpu-space"), r["environment"]
    assert r["runs_started"] >= 10 and r["runs_finished"] == r["runs_started"], r
    assert r["polls"] > 0 and r["poll_p95_s"] is not None
    assert out.returncode == 0
