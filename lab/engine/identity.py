"""What makes two runs the same training: a run's identity, the lab's code version, and a class seed.

Training is a pure function of its config and the code: the model is initialised from `train.seed`, the
data come from a per-run generator seeded with it (lab/trainer.py), and on a CPU with one thread per job
two trainings of one config give bit-identical weights (tests/test_shared_runs.py checks their SHA-256).
So a server that is asked again for a configuration it has trained, is training or has queued, with the
same code, lets the asker watch that run instead of training a copy (lab/engine/sharing.py).

- `code_version()`: the package version and a hash of the model core's code (the modules directly in
  lab/: config, model, trainer, tasks, ...), docstrings and comments left out, so a change of wording
  keeps it and a change of code changes it.
- `identity(cfg)`: SHA-256 of the whole config (name, task and its text, model, training, seed) and the
  code version. Any changed knob, seed or text is another identity.
- `class_seed(owner)`: each student's own seed, the same for every click of theirs ("my own seed").
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import secrets
from pathlib import Path

from lab.config import RunConfig

SEED_RANGE = 1_000_000  # class seeds are 1 .. SEED_RANGE (the Seed knob allows 0 .. 2**31 - 1)


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return tree


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """'0.1.0+3fa9c2d81e': the lab's version and 10 hex digits of the hash of its model core's code (the
    abstract syntax of lab/*.py, without docstrings; comments are not part of it)."""
    digest, version = hashlib.sha256(), "0"
    for path in sorted(Path(__file__).resolve().parents[1].glob("*.py")):  # lab/*.py (read, not imported:
        tree = ast.parse(path.read_bytes())  # lab/__init__.py is the public API, a layer above this one)
        if path.name == "__init__.py":
            version = next((n.value.value for n in tree.body if isinstance(n, ast.Assign)
                            and any(getattr(t, "id", "") == "__version__" for t in n.targets)
                            and isinstance(n.value, ast.Constant)), version)
        digest.update(path.name.encode() + b"\0")
        digest.update(ast.dump(_without_docstrings(tree)).encode() + b"\0")
    return f"{version}+{digest.hexdigest()[:10]}"


def identity(cfg: RunConfig, version: str | None = None) -> str:
    """The run's identity: SHA-256 (hex) of its whole config as canonical JSON and the code version."""
    text = cfg.to_json(indent=None) + "\n" + (version or code_version())
    return hashlib.sha256(text.encode()).hexdigest()


def class_seed(owner: str) -> int:
    """A student's own seed, from their user token: 1 to SEED_RANGE, the same on every click."""
    return 1 + int(hashlib.sha256(f"class-seed:{owner}".encode()).hexdigest()[:12], 16) % SEED_RANGE


def fresh_seed() -> int:
    """A new random seed, 1 to SEED_RANGE ("Train again with a new seed")."""
    return 1 + secrets.randbelow(SEED_RANGE)


def seeded(cfg: RunConfig, seed: int) -> RunConfig:
    """`cfg` with `seed` as its train.seed."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed))
