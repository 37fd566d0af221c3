"""How jobs run on this machine: training slots, threads or processes, batched seeds.

Each choice can be set by an environment variable; otherwise it follows the hardware. Measured reasons
are in benchmarks/RESULTS.md.
"""
from __future__ import annotations

import os

MODES = ("thread", "process")
BATCH_ON_CPU = False  # batched seeds measured 0.64x (slower than sequential runs) on this CPU: RESULTS.md


def default_mode() -> str:
    """LAB_JOBS_MODE (thread | process); else process on POSIX (it passes pipe fds to children)."""
    env = os.environ.get("LAB_JOBS_MODE", "").strip().lower()
    if env:
        if env not in MODES:
            raise ValueError(f"LAB_JOBS_MODE: {env!r} is not one of {', '.join(MODES)}")
        return env
    return "process" if os.name == "posix" else "thread"


def batch_seeds_default() -> bool:
    """LAB_BATCH_SEEDS (on | off); else on with a CUDA GPU (tiny models are launch-bound there)
    and on the CPU as measured by benchmarks/run_all.py (batched-vs-sequential ratio)."""
    env = os.environ.get("LAB_BATCH_SEEDS", "").strip().lower()
    if env:
        if env not in ("on", "off"):
            raise ValueError(f"LAB_BATCH_SEEDS: {env!r} is not one of on, off")
        return env == "on"
    import torch

    return torch.cuda.is_available() or BATCH_ON_CPU


def default_max_concurrent() -> int:
    """LAB_MAX_CONCURRENT, else 4 on CUDA, else one job per CPU core capped at 4."""
    env = os.environ.get("LAB_MAX_CONCURRENT", "").strip()
    if env:
        if not env.isdigit() or not 1 <= int(env) <= 64:
            raise ValueError(f"LAB_MAX_CONCURRENT: {env!r} is not an integer from 1 to 64")
        return int(env)
    import torch

    return 4 if torch.cuda.is_available() else max(1, min(4, os.cpu_count() or 1))
