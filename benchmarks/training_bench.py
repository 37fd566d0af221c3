"""Training-side figures for run_all.py: matmul peak, time to solve the presets, concurrent runs,
batched seeds against sequential ones. Each function returns plain dicts (one per table row)."""
from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import replace
from typing import Any, Iterator, Optional

import torch

from lab.batched import train_batched
from lab.config import RunConfig, TrainConfig
from lab.engine.jobs import JobManager
from lab.teach.presets.catalog import PRESETS
from lab.records import EvalRecord, Record
from lab.engine.store import RunStore
from lab.tasks.batches import Sort
from lab.trainer import train


def matmul_peak_gflops(threads: int = 1, n: int = 512, repeats: int = 40) -> float:
    """Best fp32 GEMM rate of this machine at `threads` intra-op threads (2 n^3 FLOPs per n x n matmul).
    The best of many short GEMMs: on a shared machine the fastest one is the least disturbed."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # warm-up
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
        return 2 * n ** 3 / best / 1e9
    finally:
        torch.set_num_threads(before)


# preset key -> (index of its headline run, what is measured, its value at an EvalRecord, target, sense, cap s):
# sense +1 means "at least the target", -1 "at most". The targets are the presets' claims.
TARGETS: dict[str, tuple[int, str, Any, float, int, float]] = {
    "hello_sort": (0, "exact-match", lambda e: e.exact_match, 0.999, +1, 60.0),
    "induction": (1, "2 layers: eval loss", lambda e: e.loss, 1.0, -1, 60.0),
    "pre_post_ln": (0, "pre-LN: eval loss", lambda e: e.loss, 0.6, -1, 60.0),
    "short_long": (0, "ALiBi: loss at longer lengths", lambda e: e.ood_loss if e.ood_loss is not None else 9.9,
                   1.5, -1, 60.0),
    "beyond": (0, "ALiBi seed 1: exact-match", lambda e: e.exact_match, 0.15, +1, 60.0),
    "encoder_decoder": (0, "exact-match", lambda e: e.exact_match, 0.99, +1, 60.0),
    "grokking": (0, "wd 1.0: held-out exact-match", lambda e: e.exact_match, 0.9, +1, 100.0),
}


@contextlib.contextmanager
def sort_before_recipe() -> Iterator[None]:
    """The sort task's sampling and hello_sort's steps as they were before the recipe was mended (the
    "many repeats" window one symbol wide for 3 symbols: half of each batch constant sequences; 500 steps),
    for a before/after pair timed in one run."""
    original = Sort.gen_prompt

    def gen_prompt(self: Sort, cfg: Any, length: int, n: int, gen: torch.Generator, split: str) -> torch.Tensor:
        x = torch.randint(0, cfg.n_symbols, (n, length), generator=gen, device=gen.device)
        few = max(1, cfg.n_symbols // 3)
        base = torch.randint(0, cfg.n_symbols - few + 1, (n, 1), generator=gen, device=gen.device)
        rep = base + torch.randint(0, few, (n, length), generator=gen, device=gen.device)
        return torch.where(torch.rand(n, 1, generator=gen, device=gen.device) < 0.5, rep, x)

    preset = PRESETS["hello_sort"]
    Sort.gen_prompt = gen_prompt  # type: ignore[method-assign]
    PRESETS["hello_sort"] = replace(preset, runs=tuple(replace(c, train=replace(c.train, steps=500))
                                                       for c in preset.runs))
    try:
        yield
    finally:
        Sort.gen_prompt = original  # type: ignore[method-assign]
        PRESETS["hello_sort"] = preset


def time_to_solve(key: str, cap_scale: float = 1.0) -> dict[str, Any]:
    """Train the preset's headline run (1 thread, as the app's jobs) until its target is met at an
    evaluation, or its steps or the time cap run out; wall seconds of the training loop, and the best
    value the metric reached."""
    idx, what, value, target, sense, cap = TARGETS[key]
    cfg = PRESETS[key].runs[idx]
    cfg = replace(cfg, train=replace(cfg.train, device="cpu", snapshots=0))
    cap *= cap_scale
    reached: list[EvalRecord] = []
    best: list[float] = []
    t0 = time.perf_counter()

    def seen(rec: Record) -> None:
        if isinstance(rec, EvalRecord):
            v = float(value(rec))
            best[:] = [v if not best else (max if sense > 0 else min)(best[0], v)]
            if not reached and sense * (v - target) >= 0:
                reached.append(rec)

    res = train(cfg, on_record=seen, should_stop=lambda: bool(reached) or time.perf_counter() - t0 > cap, threads=1)
    solved = reached[0] if reached else None
    return {"preset": key, "run": cfg.name or "(only run)", "target": f"{what} {'>=' if sense > 0 else '<='} {target:g}",
            "solved": solved is not None, "best": best[0] if best else float("nan"),
            "step": solved.step if solved else res.steps_done, "of_steps": cfg.train.steps,
            "wall_s": solved.elapsed_s if solved else res.wall_s, "capped": solved is None and res.stopped}


def _cfg(seed: int, steps: int) -> RunConfig:
    """The app's default run (reverse, d 64, 2 layers, batch 64), no eval or snapshots in the way."""
    return RunConfig(train=TrainConfig(steps=steps, seed=seed, eval_every=10 ** 6, snapshots=0, device="cpu"))


def _at_once(jm: JobManager, store: RunStore, n: int, steps: int) -> tuple[float, float]:
    """(end-to-end, in-loop) aggregate tokens/s of n runs submitted at once. In-loop: the tokens over
    the training loops' seconds summed over runs and divided by the runs that train at a time (so runs
    waiting in the queue count only while they train)."""
    t0 = time.perf_counter()
    ids = [jm.submit(_cfg(i, steps)) for i in range(n)]
    for r in ids:
        assert jm.wait(r, timeout=600).state == "completed"
    wall = time.perf_counter() - t0
    sums = [store.summary(r) for r in ids]
    tokens = sum(s["tokens_per_s"] * s["wall_s"] for s in sums)
    return tokens / wall, tokens / (sum(s["wall_s"] for s in sums) / min(n, jm.max_concurrent))


SPARES_S = 12.0  # > the job manager's SPARE_DELAY_S plus a torch import on this machine


def concurrent_runs(modes=("process", "thread"), counts=(1, 2, 4), steps: int = 300,
                    rounds: int = 2, slots: Optional[int] = None) -> list[dict[str, Any]]:
    """n runs submitted at once to a JobManager with `slots` job slots (default: the app's, one per core),
    one intra-op thread each: aggregate tokens/s from submit to the last finish (end to end), and inside
    the training loops. Modes and counts are interleaved, `rounds` times; each figure is the best of its
    rounds."""
    from lab.engine.environment import default_max_concurrent

    slots = slots or default_max_concurrent()
    best: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(tmp)
        jms = {m: JobManager(store, max_concurrent=slots, mode=m) for m in modes}
        for jm in jms.values():
            jm.wait(jm.submit(_cfg(0, 20)), timeout=300)  # warm: imports, a worker process
        time.sleep(SPARES_S)  # a warm server: every slot's worker has imported torch (and keeps it, job after job)
        for _ in range(rounds):
            for n in counts:
                for m in modes:
                    e2e, loop = _at_once(jms[m], store, n, steps)
                    old = best.get((m, n), [0.0, 0.0])
                    best[(m, n)] = [max(old[0], e2e), max(old[1], loop)]
        for jm in jms.values():
            jm.shutdown(wait=True)
        store.close()
    rows = []
    for m in modes:
        one = best[(m, counts[0])]
        for n in counts:
            e2e, loop = best[(m, n)]
            rows.append({"mode": m, "slots": slots, "runs": n, "e2e_tok_s": e2e, "loop_tok_s": loop, "e2e_x": e2e / one[0],
                         "loop_x": loop / one[1]})
    return rows


def batched_vs_sequential(k: int = 4, steps: int = 150, cfg: Optional[RunConfig] = None) -> dict[str, Any]:
    """k seeds of one config: one batched training against k solo trainings, 1 thread, same process,
    interleaved twice (ratio = sequential time / batched time; > 1: batching wins)."""
    base = cfg or _cfg(0, steps)
    cfgs = [replace(base, train=replace(base.train, seed=s)) for s in range(k)]
    torch.set_num_threads(1)
    train(replace(base, train=replace(base.train, steps=5)), threads=1)  # warm-up
    seq, bat = [], []
    for _ in range(2):
        t0 = time.perf_counter()
        for c in cfgs:
            train(c, threads=1)
        seq.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        train_batched(cfgs, threads=1)
        bat.append(time.perf_counter() - t0)
    return {"k": k, "steps": base.train.steps, "d_model": base.model.d_model, "sequential_s": min(seq),
            "batched_s": min(bat), "ratio": min(seq) / min(bat), "device": "cpu", "threads": 1,
            "load": os.getloadavg()[0]}
