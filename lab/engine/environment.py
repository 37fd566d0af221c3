"""Where the app runs, decided in one place: the kind of machine, the CPUs this process may use, whether
CUDA is usable here, and what follows from them (training slots, threads per job, batched seeds, workers
as threads or processes, the size of the web queue).

Kinds: "local-cpu", "local-cuda", "cpu-space", "cuda-space" (a paid GPU Space) and "zerogpu-space".
  - A Hugging Face Space sets SYSTEM=spaces and SPACE_ID (gradio.utils.get_space reads the same pair).
  - A ZeroGPU Space sets SPACES_ZERO_GPU=true (the `spaces` package reads "1", "t" or "true": its
    spaces/config.py). There the `spaces` package patches torch so that torch.cuda.is_available() returns
    True in the app's process although no GPU is attached (spaces/zero/torch/patching.py, `patch`): a GPU
    exists only inside a @spaces.GPU call. So on ZeroGPU CUDA is decided from the environment, never
    asked of torch; the app's own jobs train on the CPU.
  - CPUs: the process's affinity and its cgroup CPU quota (v2 cpu.max, v1 cpu.cfs_quota_us over
    cpu.cfs_period_us) and, on a Space, CPU_CORES; the smallest wins. os.cpu_count() in a container
    counts the host's cores, not the container's.
Each choice can still be forced by an environment variable (LAB_MAX_CONCURRENT, LAB_BATCH_SEEDS,
LAB_JOBS_MODE, LAB_QUEUE_SIZE). Measured reasons are in benchmarks/RESULTS.md.
LAB_RAY_ADDRESS (auto, local, or a cluster's host:port) trains every run as a task on a Ray cluster instead
(lab/engine/ray_backend.py), with LAB_RAY_GPUS of a GPU per run (a fraction, default 0); slots then follow
the cluster's CPUs unless LAB_MAX_CONCURRENT says otherwise.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

KINDS = ("local-cpu", "local-cuda", "cpu-space", "cuda-space", "zerogpu-space")
MODES = ("thread", "process")  # LAB_JOBS_MODE; "ray" follows from LAB_RAY_ADDRESS
BATCH_ON_CPU = False  # batched seeds are slower than sequential runs on this CPU: benchmarks/RESULTS.md
MAX_CPU_SLOTS = 4  # each slot is a worker process holding its own torch; more than 4 was never measured
CUDA_SLOTS = 4  # tiny models leave a GPU mostly idle: several runs share it
CLASS_SIZE = 30  # students one server is meant to hold at once
EVENTS_PER_STUDENT = 8  # a page load fires several events at once; polls, Start and Compare add to them
QUEUE_SIZE = CLASS_SIZE * EVENTS_PER_STUDENT  # events waiting in Gradio's queue before "Queue is full"
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
TRUE = ("1", "t", "true")  # what the `spaces` package takes for SPACES_ZERO_GPU being set


@dataclass(frozen=True)
class Environment:
    """What this server runs on and how it runs jobs there (see the module's docstring)."""

    kind: str
    cpus: int  # CPUs this process may use: affinity, cgroup quota and CPU_CORES, the smallest
    cuda: bool  # a real CUDA GPU usable from this process (never on ZeroGPU outside @spaces.GPU)
    slots: int  # training jobs at once
    threads_per_job: int  # intra-op threads of one job when the config names none
    batch_seeds: bool  # train a group's seed repeats as one batched model
    mode: str  # "process" (a worker process per slot), "thread", or "ray" (tasks on a Ray cluster)
    queue_size: int  # Gradio's queue max_size, always explicit
    ray_address: str | None = None  # LAB_RAY_ADDRESS: the Ray cluster that trains the runs

    @property
    def on_space(self) -> bool:
        return self.kind.endswith("-space")

    @property
    def zerogpu(self) -> bool:
        return self.kind == "zerogpu-space"

    def describe(self) -> str:
        """One line for the server's log and the rehearsal's report."""
        where = {"process": "worker processes", "thread": "threads", "ray": f"Ray tasks ({self.ray_address})"}
        return (f"{self.kind}: {self.cpus} CPU(s), CUDA {'yes' if self.cuda else 'no'}, "
                f"{self.slots if self.slots else 'cluster-sized'} slot(s) of "
                f"{self.threads_per_job} thread(s) in {where[self.mode]}, batched seeds "
                f"{'on' if self.batch_seeds else 'off'}, queue size {self.queue_size}")


# ---- reading the machine ------------------------------------------------------------------------------
def affinity_cpus(getter: Callable[[int], set] | None = None) -> int:
    """CPUs this process may be scheduled on (os.sched_getaffinity); os.cpu_count() only where the
    platform has no affinity (macOS, Windows)."""
    getter = getter if getter is not None else getattr(os, "sched_getaffinity", None)
    if getter is not None:
        try:
            return max(1, len(getter(0)))
        except OSError:
            pass
    return os.cpu_count() or 1


def _v2_quota(text: str) -> float | None:
    """cgroup v2 cpu.max: "QUOTA PERIOD" in microseconds, or "max PERIOD" for no limit."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    period = float(parts[1]) if len(parts) > 1 else 100_000.0
    return float(parts[0]) / period if period > 0 else None


def _v1_quota(quota: str, period: str) -> float | None:
    """cgroup v1 cpu.cfs_quota_us over cpu.cfs_period_us; a quota of -1 is no limit."""
    q, p = int(quota.strip()), int(period.strip())
    return q / p if q > 0 and p > 0 else None


def _own_cgroups(proc_cgroup: Path) -> tuple[str, str]:
    """This process's cgroup paths from /proc/self/cgroup: (v2 path, v1 cpu controller path)."""
    v2 = v1 = "/"
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return v2, v1
    for line in lines:
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            v2 = path or "/"
        elif "cpu" in controllers.split(","):
            v1 = path or "/"
    return v2, v1


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (1.5 = one and a half), or None when there is none.
    Reads cgroup v2 (ROOT/cpu.max) and v1 (ROOT/cpu/cpu.cfs_quota_us, or ROOT/cpu,cpuacct/...), at the
    process's own cgroup (from /proc/self/cgroup) and at the root of the mount a container sees; the
    tightest limit found wins."""
    v2, v1 = _own_cgroups(proc_cgroup)
    limits: list[float] = []
    for d in dict.fromkeys([root / v2.lstrip("/"), root]):
        try:
            q = _v2_quota((d / "cpu.max").read_text())
        except (OSError, ValueError, IndexError):
            continue
        if q is not None:
            limits.append(q)
    v1_dirs = [base / rel for base in (root / "cpu", root / "cpu,cpuacct", root) for rel in (v1.lstrip("/"), "")]
    for d in dict.fromkeys(v1_dirs):
        try:
            q = _v1_quota((d / "cpu.cfs_quota_us").read_text(), (d / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        if q is not None:
            limits.append(q)
    return min(limits) if limits else None


def usable_cpus(affinity: int, quota: float | None, declared: int | None = None) -> int:
    """The CPUs a process may use: its affinity, capped by a cgroup quota (rounded up: 1.5 CPUs let two
    threads run) and by a platform's declared count (a Space's CPU_CORES). At least one."""
    n = affinity
    if quota is not None:
        n = min(n, math.ceil(quota - 1e-9))
    if declared is not None and declared > 0:
        n = min(n, declared)
    return max(1, n)


# ---- deciding -----------------------------------------------------------------------------------------
def _int_env(env: Mapping[str, str], name: str, lo: int, hi: int) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not lo <= int(raw) <= hi:
        raise ValueError(f"{name}: {raw!r} is not an integer from {lo} to {hi}")
    return int(raw)


def _choice_env(env: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str | None:
    raw = env.get(name, "").strip().lower()
    if raw and raw not in allowed:
        raise ValueError(f"{name}: {raw!r} is not one of {', '.join(allowed)}")
    return raw or None


def is_zerogpu(env: Mapping[str, str]) -> bool:
    """SPACES_ZERO_GPU as the `spaces` package reads it (gradio's own test is the stricter == "true")."""
    return env.get("SPACES_ZERO_GPU", "").strip().lower() in TRUE


def is_space(env: Mapping[str, str]) -> bool:
    """A Hugging Face Space: SYSTEM=spaces (as gradio.utils.get_space reads it) or a SPACE_ID."""
    return env.get("SYSTEM") == "spaces" or bool(env.get("SPACE_ID"))


def _torch_cuda() -> bool:
    import torch  # only off ZeroGPU, where torch's answer is the truth

    return bool(torch.cuda.is_available())


def detect(env: Mapping[str, str] | None = None, cgroup_root: Path = CGROUP_ROOT,
           proc_cgroup: Path = PROC_SELF_CGROUP, affinity: int | None = None,
           cuda: bool | None = None) -> Environment:
    """The environment this process runs in. `env` defaults to os.environ; `affinity` and `cuda` to what
    the process and torch report (on ZeroGPU CUDA is off whatever torch says)."""
    env = os.environ if env is None else env
    zerogpu = is_zerogpu(env)
    cpus = usable_cpus(affinity_cpus() if affinity is None else affinity, cgroup_cpu_limit(cgroup_root, proc_cgroup),
                       _int_env(env, "CPU_CORES", 1, 100_000) if is_space(env) else None)
    if zerogpu:
        cuda = False
    elif cuda is None:
        cuda = _torch_cuda()
    kind = ("zerogpu-space" if zerogpu else
            ("cuda-space" if cuda else "cpu-space") if is_space(env) else
            "local-cuda" if cuda else "local-cpu")
    batch = _choice_env(env, "LAB_BATCH_SEEDS", ("on", "off"))
    mode = _choice_env(env, "LAB_JOBS_MODE", MODES) or ("process" if os.name == "posix" else "thread")
    ray = ray_address(env)
    if ray:  # one run per Ray task of one CPU; slots follow the cluster's size (0: ask the cluster)
        mode, slots = "ray", _int_env(env, "LAB_MAX_CONCURRENT", 1, 10_000) or 0
    else:
        slots = _int_env(env, "LAB_MAX_CONCURRENT", 1, 64) or (CUDA_SLOTS if cuda else min(cpus, MAX_CPU_SLOTS))
    return Environment(
        kind=kind, cpus=cpus, cuda=cuda, slots=slots,
        threads_per_job=1 if slots >= 2 or ray else cpus,  # torch threads are per process: one each when sharing
        batch_seeds=False if ray else batch == "on" if batch else (cuda or BATCH_ON_CPU),
        mode=mode, queue_size=_int_env(env, "LAB_QUEUE_SIZE", 1, 100_000) or QUEUE_SIZE, ray_address=ray,
    )


def ray_address(env: Mapping[str, str] | None = None) -> str | None:
    """LAB_RAY_ADDRESS, or None: "auto" (a cluster running on this machine), "local" (start one in this
    process), or a cluster's host:port or ray://host:port."""
    raw = (os.environ if env is None else env).get("LAB_RAY_ADDRESS", "").strip()
    if raw and (any(c.isspace() for c in raw) or len(raw) > 300):
        raise ValueError(f"LAB_RAY_ADDRESS: {raw[:40]!r} is not an address (allowed: auto, local, or host:port)")
    return raw or None


def ray_gpus(env: Mapping[str, str] | None = None) -> float:
    """LAB_RAY_GPUS: the fraction of a GPU each Ray task asks for (0 to 8; default 0, CPU only)."""
    raw = (os.environ if env is None else env).get("LAB_RAY_GPUS", "").strip()
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 8.0:
        raise ValueError(f"LAB_RAY_GPUS: {raw!r} is not a number from 0 to 8 (a GPU fraction per run)")
    return value


# ---- what the rest of the code asks ------------------------------------------------------------------
def default_mode() -> str:
    """"ray" with LAB_RAY_ADDRESS set; else LAB_JOBS_MODE (thread | process); else process on POSIX (it
    passes pipe fds to children)."""
    return detect().mode


def batch_seeds_default() -> bool:
    """LAB_BATCH_SEEDS (on | off); else on with a usable CUDA GPU (tiny models are launch-bound there),
    off on the CPU (ZeroGPU's app process included) as measured by benchmarks/run_all.py."""
    return detect().batch_seeds


def default_max_concurrent() -> int:
    """LAB_MAX_CONCURRENT, else 4 with a usable CUDA GPU, else one job per usable CPU, at most 4 (on Ray:
    0, meaning one per CPU of the cluster, which the job manager asks the cluster)."""
    return detect().slots


def default_queue_size() -> int:
    """LAB_QUEUE_SIZE, else room for a class of 30 students' events (Gradio's max_size, always explicit:
    on ZeroGPU Gradio would otherwise take 1)."""
    return detect().queue_size


def default_threads() -> int:
    """Intra-op threads of a job that trains alone and whose config names none: every usable CPU."""
    return detect().cpus
