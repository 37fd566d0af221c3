"""A Space rehearsal: the app started as a ZeroGPU Space and as a CPU Space start it, with the real
`spaces` package, driven by the classroom load test (benchmarks/classroom_load.py).

    python scripts/space_rehearsal.py                         # both Spaces, 30 users, 1.5 min each
    python scripts/space_rehearsal.py --space zerogpu --users 10 --minutes 0.5 --json
    python scripts/space_rehearsal.py --write-results         # also update benchmarks/RESULTS.md
    git worktree add /tmp/lab-old 9239716~1                    # the code before the environment fix:
    python scripts/space_rehearsal.py --repo /tmp/lab-old --label "before 9239716"

What it does:
1. The `spaces` package (SPACES_VERSION, from PyPI) goes into a virtual environment that sees this
   Python's packages (--system-site-packages: torch and gradio stay the ones installed here; pip
   installs `spaces` alone). --current-env uses this interpreter instead (it must have `spaces`).
2. A stub of the ZeroGPU device API on localhost (`StubDeviceAPI`): what `spaces` calls. It answers
   POST /startup-report (sent at launch when a @spaces.GPU function exists), /allow and /release with
   200, GET /queue-size with 0, and POST /schedule (a GPU request) with 503, so a GPU call fails as
   "No GPU was available" would. Every request is counted and reported.
3. `python app.py` with the variables such a Space sets (SPACE_ENVS; the ZeroGPU Space also
   SPACES_ZERO_GPU=true and SPACES_ZERO_DEVICE_API_URL=the stub), LAB_PUBLIC=1, any LAB_* override
   removed; 30 students start runs and poll them (light client: plain HTTP, as a browser).
4. A probe in the same interpreter, environment and checkout imports `spaces` first (as a ZeroGPU app
   must) and says what the app decides: training slots, batched seeds, Gradio's queue size, whether
   `spaces` imported and torch then says CUDA is available. The stub's /startup-report count shows
   whether the server's own process ran `spaces` (it reports only when a @spaces.GPU function exists).
Reported per Space: "Queue is full" count, errors, slots against usable CPUs, batching, queue size,
poll latency p50/p95, the app process's CPU share, the stub's requests. Exit status 0 when every Space
had no error, slots == usable CPUs and batching off (the acceptance of issue 14).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from classroom_load import RESULTS, simulate  # noqa: E402

SPACES_VERSION = "0.51.3"
VENV = Path(os.environ.get("LAB_REHEARSAL_VENV", "/tmp/lab-space-rehearsal-venv"))
START, END = "<!-- space_rehearsal:start -->", "<!-- space_rehearsal:end -->"
SPACE = {"SYSTEM": "spaces", "SPACE_ID": "teacher/transformer-lab", "SPACE_AUTHOR_NAME": "teacher",
         "SPACE_REPO_NAME": "transformer-lab", "SPACE_TITLE": "Transformer Lab",
         "SPACE_HOST": "teacher-transformer-lab.hf.space", "CPU_CORES": "2", "MEMORY": "16Gi"}
SPACE_ENVS: dict[str, dict[str, str | None]] = {
    # hub-docs spaces-overview.md "Built-in environment variables"; SYSTEM and SPACES_ZERO_GPU as gradio and
    # `spaces` read them. Whether a ZeroGPU Space sets CPU_CORES is not documented: set as on CPU Basic.
    "zerogpu": {**SPACE, "SPACES_ZERO_GPU": "true"},
    "cpu": {**SPACE, "ACCELERATOR": "none", "SPACES_ZERO_GPU": None, "SPACES_ZERO_DEVICE_API_URL": None},
}
OVERRIDES = ("LAB_MAX_CONCURRENT", "LAB_BATCH_SEEDS", "LAB_JOBS_MODE", "LAB_QUEUE_SIZE", "LAB_MAX_THREADS")
TORCH_CUDA = "12.8"  # what a CUDA build of torch reports as torch.version.cuda (a ZeroGPU Space has one)
SHIM = Path(os.environ.get("LAB_REHEARSAL_SHIM", "/tmp/lab-space-rehearsal-shim"))
SITECUSTOMIZE = '''"""Space rehearsal only (scripts/space_rehearsal.py): this torch is a CPU build, and `spaces`
on ZeroGPU expects a CUDA build: it reads torch.version.cuda as a string (spaces/zero/torch/static.py)
keeps torch._C._cuda_init and sends torch.cuda._is_in_bad_fork to a forked process
(zero/torch/patching.py). Without them its import fails, Gradio swallows
the error and the app runs without `spaces`. With LAB_REHEARSAL_TORCH_CUDA set, this gives a CPU
build what a CUDA build has there: a version string, a _cuda_init that fails as CUDA would, a
picklable _is_in_bad_fork."""
import importlib.machinery, os, sys


def _no_cuda():
    raise RuntimeError("Torch not compiled with CUDA enabled (Space rehearsal)")


def _not_in_bad_fork():  # a CPU build's is a lambda, which `spaces` cannot send to a forked process
    return False


PATCHES = {"torch.version": {"cuda": lambda old: old or os.environ["LAB_REHEARSAL_TORCH_CUDA"]},
           "torch._C": {"_cuda_init": lambda old: old or _no_cuda},
           "torch.cuda": {"_is_in_bad_fork": lambda old: _not_in_bad_fork if old.__name__ == "<lambda>" else old}}


class _CudaBuild:
    def find_spec(self, name, path, target=None):
        if name not in PATCHES or not os.environ.get("LAB_REHEARSAL_TORCH_CUDA"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for attr, patch in PATCHES[name].items():
                setattr(module, attr, patch(getattr(module, attr, None)))

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _CudaBuild())
'''
PROBE = """
import json, os, sys, importlib.util, tempfile
os.environ["LAB_RUNS_DIR"] = tempfile.mkdtemp()
try:  # first, as a ZeroGPU app must (today's app imports it in ui/gpu.py; Gradio's own attempt at import
    import spaces  # time is refused by `spaces` while gradio is half-initialised)
    error = None
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
import gradio
import torch
from lab.engine import environment as e
import app
demo = app.build_demo()
cpus = e.detect().cpus if hasattr(e, "detect") else len(os.sched_getaffinity(0))
print(json.dumps({"slots": e.default_max_concurrent(), "batch_seeds": e.batch_seeds_default(), "usable_cpus": cpus,
                  "queue_size": demo._queue.max_size, "spaces_imported": error is None, "spaces_error": error,
                  "torch_says_cuda": torch.cuda.is_available()}))
"""


class StubDeviceAPI:
    """The ZeroGPU device API on 127.0.0.1, as far as `spaces` calls it (see the module's docstring)."""

    ANSWERS = {("POST", "/startup-report"): (200, b""), ("POST", "/allow"): (200, b""),
               ("POST", "/release"): (200, b""), ("GET", "/queue-size"): (200, b"0"),
               ("POST", "/schedule"): (503, b"No GPU in a rehearsal")}

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                path = self.path.split("?", 1)[0]
                key = f"{self.command} {path}"
                stub.requests[key] = stub.requests.get(key, 0) + 1
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                status, body = stub.ANSWERS.get((self.command, path), (404, b"not in the stub"))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def ensure_venv(path: Path = VENV) -> str:
    """A venv that sees this Python's packages, with spaces==SPACES_VERSION installed; its python."""
    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(path)], check=True)
    have = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('spaces'))"],
                          capture_output=True, text=True)
    if have.stdout.strip() != SPACES_VERSION:
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"spaces=={SPACES_VERSION}"], check=True)
    return str(python)


def versions(python: str) -> dict[str, str]:
    code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            "('spaces', 'gradio', 'torch')}))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def space_env(space: str, stub: StubDeviceAPI, cuda_shim: bool = True) -> dict[str, str | None]:
    """The app's environment on that Space. On ZeroGPU, `cuda_shim` lets `spaces` import with this
    CPU build of torch (SITECUSTOMIZE, on PYTHONPATH)."""
    env: dict[str, str | None] = {k: None for k in OVERRIDES}
    env.update(SPACE_ENVS[space])
    if space == "zerogpu":
        env["SPACES_ZERO_DEVICE_API_URL"] = stub.url
        if cuda_shim:
            SHIM.mkdir(parents=True, exist_ok=True)
            (SHIM / "sitecustomize.py").write_text(SITECUSTOMIZE)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH")) if p)
            env["LAB_REHEARSAL_TORCH_CUDA"] = TORCH_CUDA
    return env


def probe(python: str, repo: Path, env: dict[str, str | None]) -> dict[str, Any]:
    full = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    out = subprocess.run([python, "-c", PROBE], cwd=repo, env=full, capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"the probe failed:\n{out.stderr[-2000:]}")
    return json.loads(lines[-1])


def rehearse(space: str, python: str, repo: Path, users: int, minutes: float, ramp_s: float) -> dict[str, Any]:
    stub = StubDeviceAPI()
    try:
        env = space_env(space, stub)
        decided = probe(python, repo, env)
        load = simulate(users, minutes, 1.0, ramp_s, light=True, env=env, python=python, repo=repo)
    finally:
        stub.close()
    ok = (load["errors"] == 0 and decided["slots"] == decided["usable_cpus"] and not decided["batch_seeds"])
    return {"space": space, **decided, **load, "stub_requests": dict(stub.requests), "ok": ok}


def commit_of(repo: Path) -> str:
    out = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def table(results: list[dict[str, Any]], label: str, commit: str, vers: dict[str, str]) -> str:
    head = (f"**{label}** (commit {commit}; spaces {vers.get('spaces')}, gradio {vers.get('gradio')}, torch "
            f"{vers.get('torch')})")
    rows = [("Space", lambda r: {"zerogpu": "ZeroGPU", "cpu": "CPU"}[r["space"]]),
            ("students, minutes", lambda r: f"{r['users']}, {r['minutes']}"),
            ('"Queue is full"', lambda r: r["queue_full"]), ("errors", lambda r: r["errors"]),
            ("runs started / finished / unfinished", lambda r: f"{r['runs_started']} / {r['runs_finished']} / "
                                                              f"{r['runs_unfinished']}"),
            ("training slots / usable CPUs", lambda r: f"{r['slots']} / {r['usable_cpus']}"),
            ("batched seeds", lambda r: "on" if r["batch_seeds"] else "off"),
            ("Gradio queue size", lambda r: r["queue_size"]),
            ("probe: `spaces` imported / torch says CUDA", lambda r: f"{r['spaces_imported']} / {r['torch_says_cuda']}"),
            ("poll latency p50 / p95", lambda r: f"{r['poll_p50_s']} / {r['poll_p95_s']} s"),
            ("app process CPU (share of the machine)", lambda r: f"{100 * r['app_cpu_share']:.0f}%"),
            ("stub device API requests", lambda r: ", ".join(f"{k}: {v}" for k, v in r["stub_requests"].items())
             or "none"),
            ("errors seen", lambda r: "; ".join(r["error_samples"])[:300] or "none"),
            ("server log: exceptions Python ignored", lambda r: f"{r.get('log_ignored_exceptions', 0)} "
                                                                f"{r.get('log_ignored_sample', '')}".strip())]
    lines = [head, "", "| | " + " | ".join(rows[0][1](r) for r in results) + " |",
             "|---|" + "---|" * len(results)]
    lines += [f"| {name} | " + " | ".join(str(f(r)) for r in results) + " |" for name, f in rows[1:]]
    return "\n".join(lines)


def write_results(text: str, label: str, path: Path = RESULTS) -> None:
    """Put this label's table in the rehearsal's marked block of RESULTS.md (other labels and blocks kept)."""
    doc = path.read_text() if path.exists() else "# Benchmark results\n"
    tag = re.sub(r"\W+", "-", label.lower()).strip("-")
    part = f"<!-- rehearsal:{tag} -->\n{text}\n<!-- /rehearsal:{tag} -->"
    if START not in doc:
        doc = doc.rstrip("\n") + (f"\n\n{START}\n## Space rehearsal (`python scripts/space_rehearsal.py`)\n\n"
                                  f"See benchmarks/README.md for what it shows and what only a real Space can.\n"
                                  f"{END}\n")
    block = re.search(re.escape(START) + ".*?" + re.escape(END), doc, flags=re.S).group(0)
    pattern = re.escape(f"<!-- rehearsal:{tag} -->") + ".*?" + re.escape(f"<!-- /rehearsal:{tag} -->")
    stamped = part.replace(text, f"{time.strftime('%Y-%m-%d', time.gmtime())}, {text}", 1)
    new = (re.sub(pattern, lambda _: stamped, block, flags=re.S) if re.search(pattern, block, flags=re.S)
           else block.replace(END, f"{stamped}\n\n{END}"))
    path.write_text(doc.replace(block, new))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--space", choices=("zerogpu", "cpu", "both"), default="both")
    p.add_argument("--users", type=int, default=30)
    p.add_argument("--minutes", type=float, default=1.5)
    p.add_argument("--ramp-s", type=float, default=20.0)
    p.add_argument("--repo", type=Path, default=REPO, help="the checkout whose app.py runs (default: this one)")
    p.add_argument("--label", default="today's code", help="names the table in RESULTS.md")
    p.add_argument("--current-env", action="store_true", help="use this interpreter (with `spaces`), no venv")
    p.add_argument("--json", action="store_true")
    p.add_argument("--write-results", action="store_true")
    args = p.parse_args(argv)
    python = sys.executable if args.current_env else ensure_venv()
    vers = versions(python)
    if vers["spaces"] != SPACES_VERSION:
        p.error(f"spaces {vers['spaces']} in {python}; the rehearsal pins {SPACES_VERSION}")
    spaces = ("zerogpu", "cpu") if args.space == "both" else (args.space,)
    results = [rehearse(s, python, args.repo.resolve(), args.users, args.minutes, args.ramp_s) for s in spaces]
    if args.json:
        print(json.dumps({"versions": vers, "results": results}), flush=True)
    text = table(results, args.label, commit_of(args.repo), vers)
    if not args.json:
        print(text)
    if args.write_results:
        write_results(text, args.label)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
