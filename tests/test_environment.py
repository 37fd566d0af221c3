"""Where the app runs is decided in one place (lab/engine/environment.py), from real inputs: cgroup files
written here in temp folders, the process's affinity, the environment a Space sets, and torch as the
`spaces` package leaves it on ZeroGPU (is_available() patched to True with no GPU attached).
The app's queue always has an explicit size that holds a class.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import app
from lab.engine import environment as envmod
from lab.engine.environment import (
    CLASS_SIZE,
    KINDS,
    affinity_cpus,
    batch_seeds_default,
    cgroup_cpu_limit,
    default_max_concurrent,
    default_queue_size,
    detect,
    usable_cpus,
)
from lab.engine.jobs import JobManager
from lab.engine.store import RunStore

SPACE = {"SYSTEM": "spaces", "SPACE_ID": "teacher/transformer-lab"}
ZEROGPU = {**SPACE, "SPACES_ZERO_GPU": "true"}
# a class polls once a second and a page load fires several events at once: at least 4 each may wait
CLASS_EVENTS = CLASS_SIZE * 4


def cgroup(tmp_path: Path, files: dict[str, str], own: str = "0::/\n") -> tuple[Path, Path]:
    """A cgroup mount with `files` (relative path -> text) and a /proc/self/cgroup naming `own`."""
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    root.mkdir(exist_ok=True)
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text(own)
    return root, proc


def no_torch() -> bool:
    raise AssertionError("torch was asked whether CUDA is available")


# ---- CPUs: affinity and cgroup quota, the smaller wins ---------------------------------------------------
def test_cgroup_v2_quota_below_affinity_wins(tmp_path):
    root, proc = cgroup(tmp_path, {"cpu.max": "150000 100000\n"})
    assert cgroup_cpu_limit(root, proc) == pytest.approx(1.5)
    env = detect({}, root, proc, affinity=8, cuda=False)
    assert (env.kind, env.cpus, env.slots) == ("local-cpu", 2, 2)  # 1.5 CPUs run two threads


def test_cgroup_v2_max_means_no_quota(tmp_path):
    root, proc = cgroup(tmp_path, {"cpu.max": "max 100000\n"})
    assert cgroup_cpu_limit(root, proc) is None
    assert detect({}, root, proc, affinity=3, cuda=False).cpus == 3


def test_cgroup_v2_own_group_is_read(tmp_path):
    root, proc = cgroup(tmp_path, {"cpu.max": "max 100000\n", "lab.slice/cpu.max": "100000 100000\n"},
                        own="0::/lab.slice\n")
    assert cgroup_cpu_limit(root, proc) == pytest.approx(1.0)
    assert detect({}, root, proc, affinity=16, cuda=False).cpus == 1


@pytest.mark.parametrize("controller", ["cpu", "cpu,cpuacct"])
def test_cgroup_v1_quota_over_period(tmp_path, controller):
    root, proc = cgroup(tmp_path, {f"{controller}/cpu.cfs_quota_us": "200000\n",
                                   f"{controller}/cpu.cfs_period_us": "100000\n"},
                        own=f"4:{controller}:/\n0::/\n")
    assert cgroup_cpu_limit(root, proc) == pytest.approx(2.0)
    assert detect({}, root, proc, affinity=8, cuda=False).cpus == 2


def test_cgroup_v1_minus_one_means_no_quota(tmp_path):
    root, proc = cgroup(tmp_path, {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_limit(root, proc) is None
    assert detect({}, root, proc, affinity=2, cuda=False).cpus == 2


def test_no_cgroup_files_leaves_the_affinity(tmp_path):
    root, proc = cgroup(tmp_path, {})
    assert cgroup_cpu_limit(root, proc) is None
    assert usable_cpus(3, None) == 3 and usable_cpus(3, 0.2) == 1 and usable_cpus(64, None, declared=2) == 2


def test_affinity_is_this_process_s_not_the_host_s():
    assert affinity_cpus(lambda pid: {0, 5, 7}) == 3
    if hasattr(os, "sched_getaffinity"):
        assert affinity_cpus() == len(os.sched_getaffinity(0))
        assert 1 <= detect().cpus <= len(os.sched_getaffinity(0))


# ---- CUDA: on ZeroGPU from the environment, never from torch ---------------------------------------------
def test_zerogpu_from_env_although_torch_says_cuda(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # what `spaces` does on ZeroGPU
    monkeypatch.setattr(envmod, "_torch_cuda", no_torch)
    root, proc = cgroup(tmp_path, {"cpu.max": "200000 100000\n"})
    env = detect(ZEROGPU, root, proc, affinity=16)
    assert (env.kind, env.cuda, env.cpus, env.slots, env.threads_per_job, env.batch_seeds) == (
        "zerogpu-space", False, 2, 2, 1, False)
    assert env.on_space and env.zerogpu
    for value in ("1", "True", "t"):  # read as the `spaces` package reads it
        assert detect({**SPACE, "SPACES_ZERO_GPU": value}, root, proc, affinity=16).zerogpu


def test_zerogpu_defaults_the_job_manager_uses(tmp_path, monkeypatch):
    """The callers (JobManager's slots and batching) follow the environment: on ZeroGPU with torch
    patched to report CUDA, slots are the usable CPUs and batched seeds are off."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name, value in ZEROGPU.items():
        monkeypatch.setenv(name, value)
    for name in ("LAB_MAX_CONCURRENT", "LAB_BATCH_SEEDS", "LAB_QUEUE_SIZE", "CPU_CORES"):
        monkeypatch.delenv(name, raising=False)
    cpus = detect().cpus
    assert default_max_concurrent() == min(cpus, envmod.MAX_CPU_SLOTS)
    assert batch_seeds_default() is False
    jm = JobManager(RunStore(tmp_path / "runs"), mode="thread")
    try:
        assert (jm.max_concurrent, jm.batch_seeds) == (min(cpus, envmod.MAX_CPU_SLOTS), False)
    finally:
        jm.shutdown(wait=True)


def test_kinds_slots_and_batching(tmp_path):
    root, proc = cgroup(tmp_path, {})
    cpu = detect({}, root, proc, affinity=3, cuda=False)
    assert (cpu.kind, cpu.slots, cpu.threads_per_job, cpu.batch_seeds) == ("local-cpu", 3, 1, False)
    one = detect({}, root, proc, affinity=1, cuda=False)
    assert (one.slots, one.threads_per_job) == (1, 1)
    gpu = detect({}, root, proc, affinity=3, cuda=True)
    assert (gpu.kind, gpu.slots, gpu.batch_seeds) == ("local-cuda", 4, True)
    space = detect({**SPACE, "CPU_CORES": "2"}, root, proc, affinity=64, cuda=False)
    assert (space.kind, space.cpus, space.slots, space.batch_seeds) == ("cpu-space", 2, 2, False)
    assert detect(SPACE, root, proc, affinity=4, cuda=True).kind == "cuda-space"
    assert detect({"CPU_CORES": "1"}, root, proc, affinity=4, cuda=False).cpus == 4  # only a Space's counts
    big = detect({}, root, proc, affinity=64, cuda=False)
    assert big.slots == envmod.MAX_CPU_SLOTS and big.cpus == 64


def test_overrides_win_and_bad_values_name_the_variable(tmp_path):
    root, proc = cgroup(tmp_path, {})
    env = detect({"LAB_MAX_CONCURRENT": "1", "LAB_BATCH_SEEDS": "on", "LAB_JOBS_MODE": "thread",
                  "LAB_QUEUE_SIZE": "500"}, root, proc, affinity=4, cuda=False)
    assert (env.slots, env.threads_per_job, env.batch_seeds, env.mode, env.queue_size) == (1, 4, True, "thread", 500)
    for name, bad in (("LAB_QUEUE_SIZE", "lots"), ("LAB_MAX_CONCURRENT", "0"), ("LAB_BATCH_SEEDS", "maybe")):
        with pytest.raises(ValueError, match=name):
            detect({name: bad}, root, proc, affinity=4, cuda=False)


# ---- the queue holds a class -------------------------------------------------------------------------------
def test_queue_size_is_explicit_on_every_kind(tmp_path):
    root, proc = cgroup(tmp_path, {})
    envs = [detect({}, root, proc, affinity=2, cuda=False), detect({}, root, proc, affinity=2, cuda=True),
            detect(SPACE, root, proc, affinity=2, cuda=False), detect(SPACE, root, proc, affinity=2, cuda=True),
            detect(ZEROGPU, root, proc, affinity=2)]
    assert [e.kind for e in envs] == list(KINDS)
    assert all(isinstance(e.queue_size, int) and e.queue_size >= CLASS_EVENTS for e in envs)


@pytest.mark.parametrize("zerogpu", [True, False])
def test_app_queue_has_the_explicit_size(tmp_path, monkeypatch, zerogpu):
    """Built as on a ZeroGPU Space, where Gradio's queue() takes max_size=1 unless told otherwise."""
    monkeypatch.delenv("LAB_QUEUE_SIZE", raising=False)
    if zerogpu:
        monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    else:
        monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    store = RunStore(tmp_path / "runs")
    jobs = JobManager(store, max_concurrent=1, mode="thread")
    try:
        demo = app.build_demo(store, jobs)
        assert demo._queue.max_size == default_queue_size() >= CLASS_EVENTS
    finally:
        jobs.shutdown(wait=True)


def test_an_idle_queue_looks_for_work_at_the_apps_intervals_not_every_millisecond(tmp_path, monkeypatch):
    """Gradio's queue, idle, looks for an event every 1 ms and for progress every 10 ms (about 6% of a core
    on this machine: benchmarks/idle_server.py); the app's queue runs Gradio's own loops at its intervals."""
    import asyncio
    import threading

    from gradio import queueing

    from ui.app import IDLE_POLL_S, PROGRESS_POLL_S

    store = RunStore(tmp_path / "runs")
    jobs = JobManager(store, max_concurrent=1, mode="thread")
    try:
        queue = app.build_demo(store, jobs)._queue
    finally:
        jobs.shutdown(wait=True)
    slept: list[float] = []
    loops: list[asyncio.Task] = []

    class Recorded:  # asyncio as gradio/queueing.py sees it: the waits of the two loops below are recorded
        def __getattr__(self, name: str):
            return getattr(asyncio, name)

        @staticmethod
        async def sleep(seconds: float, *args):
            if asyncio.current_task() in loops:
                slept.append(seconds)
                seconds = 0
            await asyncio.sleep(seconds, *args)

    async def watch() -> None:  # Gradio's two idle loops, as launch() starts them, for 40 waits
        loops.extend([asyncio.create_task(queue.start_processing()), asyncio.create_task(queue.start_progress_updates())])
        while len(slept) < 40:
            await asyncio.sleep(0)
        queue.stopped = True
        await asyncio.gather(*loops)

    monkeypatch.setattr(queueing, "asyncio", Recorded())
    # a loop of its own in a thread of its own (a test before may have left this thread's loop set)
    watcher = threading.Thread(target=asyncio.run, args=(watch(),))
    watcher.start()
    watcher.join(timeout=60)
    assert not watcher.is_alive()
    assert set(slept) == {IDLE_POLL_S, PROGRESS_POLL_S} and min(slept) >= 0.02, sorted(set(slept))
