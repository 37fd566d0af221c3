"""The trainer's optimiser step and clipping (lab/optim.py) against torch's public API, in a training step.

    python benchmarks/optim_step.py [--configs S,M,L] [--write] [--quick] [--threads 1] [--device cpu|cuda]

Does `lab.optim.FastAdamW`, which calls torch's private fused AdamW kernel (`torch._fused_adamw_`)
directly, and `lab.optim.clip_grad_norm` (torch's foreach ops on the gradient list) save a meaningful
share of a training step over `torch.optim.AdamW(fused=True).step()` + `torch.nn.utils.clip_grad_norm_`?
Both give the same numbers bit for bit (tests/test_optim.py); only the Python around the kernels
differs. lab/optim.py says what was decided from this.

For each of the throughput benchmark's S, M and L configs (benchmarks/throughput.py: our model with a
learned PE, the app's default optimiser settings, fresh random tokens every step), ONE model and ONE
`make_optimizer` AdamW (fused) are stepped by every candidate, so all touch the same tensors:
    lab:       `lab.trainer.train_step` with `lab.optim.FastAdamW` (the step the app and the CLI run)
    torch:     the same step written out, with `clip_grad_norm_(params, 1.0)` and `opt.step()` in place
               of `lab.optim.clip_grad_norm` and `FastAdamW.step()` (forward, grads set to None and
               backward as train_step does them)
    (control): the torch step again, timed as one more candidate: torch / control (ideally 1.000)
               shows how far this run's whole-step ratios can be trusted

Whole steps, as throughput.py times them (a shared, noisy 2-core machine, 1 intra-op thread): after
a warm-up, interleaved rounds; in each round every candidate runs one block of steps (about 0.25 s)
in a fresh random order; a block's value is its fastest step (CUDA: the block's mean, one sync).
ms/step = median over rounds; ratio = median over rounds of (torch block / lab block, same round).

The optimiser step and the clip are also timed on their own, call by call, inside those training
steps (lab's clip where train_step calls it and its AdamW step, each through a timing wrapper;
torch's inline): each block's fastest call, median over the rounds. These are the figures the
decision rests on: the whole-step ratios have a noise of a percent or more (the control), about
the size of the saving; and timing the calls in a hot loop instead measures only a quarter of the
AdamW saving seen inside a real step (after a forward and backward, the Python around the kernel
runs on cold caches). On CUDA the in-step times are the host's time to issue the work.

`--write` replaces this benchmark's own block of benchmarks/RESULTS.md (between
`<!-- optim_step:start -->` and `<!-- optim_step:end -->`). About 50-75 s for S, M and L on 2 cores.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

try:  # PYTHONPATH may point at another copy of lab/ (to benchmark a patch)
    import lab
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import lab
from lab.config import ModelConfig, RunConfig  # noqa: E402
from lab.optim import FastAdamW, clip_grad_norm  # noqa: E402
from lab.tasks import Batch  # noqa: E402
from lab.trainer import build_model, make_optimizer, train_step  # noqa: E402

try:
    from benchmarks.results import RESULTS, write_block  # python -m benchmarks.optim_step
    from benchmarks.throughput import CONFIGS, N_CTX, TASK, TASK_VOCAB, TRAIN, quantile
except ImportError:
    from results import RESULTS, write_block  # python benchmarks/optim_step.py
    from throughput import CONFIGS, N_CTX, TASK, TASK_VOCAB, TRAIN, quantile

HERE = Path(__file__).resolve().parent
START, END = "<!-- optim_step:start -->", "<!-- optim_step:end -->"
CLIP = 1.0  # the trainer's default clip
BLOCK_S = 0.25  # seconds per whole-step block
STEP_S = 4.0  # timed seconds per candidate and config (whole steps)
MIN_ROUNDS = 9


class TimedStep:
    """An optimiser stepper that records how long each `step()` takes, inside the training step."""

    def __init__(self, inner, times: list[float]) -> None:
        self.inner, self.times = inner, times

    def step(self) -> None:
        t0 = time.perf_counter()
        self.inner.step()
        self.times.append(time.perf_counter() - t0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def timed_lab_clip(times: list[float]):
    """Time `lab.optim.clip_grad_norm` where train_step calls it (its module's name for it, patched for
    the duration); yields False (and times nothing) if train_step no longer calls it by that name."""
    mod = sys.modules[train_step.__module__]
    orig = getattr(mod, "clip_grad_norm", None)
    if orig is not clip_grad_norm:
        yield False
        return

    def timed(grads: list[Tensor], max_norm: float) -> Tensor:
        t0 = time.perf_counter()
        out = orig(grads, max_norm)
        times.append(time.perf_counter() - t0)
        return out

    mod.clip_grad_norm = timed
    try:
        yield True
    finally:
        mod.clip_grad_norm = orig


def bench_config(name: str, quick: bool = False, device: torch.device | None = None) -> dict:
    device = device or torch.device("cpu")
    d, L, H, T, B = CONFIGS[name]
    mc = ModelConfig(arch="decoder", n_layers=L, n_heads=H, d_model=d, d_ff=4 * d, dropout=0.0,
                     activation="gelu", norm="pre", pos="learned", n_ctx=N_CTX)
    model = build_model(RunConfig(model=mc, task=TASK, train=TRAIN), device).train()
    opt = make_optimizer(model, TRAIN)
    assert opt.defaults["fused"], "make_optimizer no longer builds a fused AdamW on this device"
    params = list(model.parameters())
    fast = FastAdamW(opt)  # what lab.trainer.train sets up once per run
    amp = contextlib.nullcontext()
    gen = torch.Generator(device).manual_seed(1)
    names = ("lab", "torch", "(control)")
    clip_t: dict[str, list[float]] = {k: [] for k in names}  # seconds per call, inside the training steps
    step_t: dict[str, list[float]] = {k: [] for k in names}
    stepper = TimedStep(fast, step_t["lab"])

    def batch() -> Batch:
        return Batch(*(torch.randint(0, TASK_VOCAB, (B, T), generator=gen, device=device) for _ in range(2)))

    def lab_step(b: Batch) -> None:
        train_step(model, b, params, stepper, CLIP, amp)

    def torch_step(b: Batch, k: str) -> None:  # train_step, with torch's clip and optimiser step
        loss = model(b.inp, b.src, b.tgt).loss
        for p in params:
            p.grad = None
        loss.backward()
        t0 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        clip_t[k].append(t1 - t0)
        step_t[k].append(t2 - t1)

    cands: dict[str, Callable[[Batch], None]] = {
        "lab": lab_step, "torch": lambda b: torch_step(b, "torch"), "(control)": lambda b: torch_step(b, "(control)")}

    part_blocks: dict[tuple[str, str], list[float]] = {}  # (part, candidate) -> per block: its fastest call

    def block(fn: Callable[[Batch], None], n: int, k: str = "") -> float:
        """Seconds per step: the fastest of n steps (CPU), or n steps timed together with one sync (CUDA).
        With a candidate name `k`, also keeps the block's fastest clip and AdamW call of that candidate."""
        if k:
            marks = len(clip_t[k]), len(step_t[k])
            try:
                return block(fn, n)
            finally:
                for part, times, m in (("clip", clip_t[k], marks[0]), ("adamw", step_t[k], marks[1])):
                    if len(times) > m:
                        part_blocks.setdefault((part, k), []).append(min(times[m:]))
        if device.type == "cuda":
            bs = [batch() for _ in range(n)]
            _sync(device)
            t0 = time.perf_counter()
            for b in bs:
                fn(b)
            _sync(device)
            return (time.perf_counter() - t0) / n
        best = float("inf")
        for _ in range(n):
            b = batch()  # outside the timed region
            t0 = time.perf_counter()
            fn(b)
            best = min(best, time.perf_counter() - t0)
        return best

    with timed_lab_clip(clip_t["lab"]) as clip_timed:
        for fn in cands.values():  # warm-up: allocator, oneDNN primitives, optimiser state, lazy imports
            block(fn, 3)
        per = min(block(lab_step, 2), block(cands["torch"], 2))
        for v in (*clip_t.values(), *step_t.values()):
            v.clear()
        steps = max(1, round(BLOCK_S / per))
        rounds = max(MIN_ROUNDS, round(STEP_S / (steps * per)))
        if quick:
            rounds = max(5, rounds // 2)
        full: dict[str, list[float]] = {k: [] for k in cands}
        order = random.Random(0)
        for _ in range(rounds):
            for k in order.sample(list(cands), len(cands)):
                full[k].append(block(cands[k], steps, k))

    med = {k: statistics.median(v) for k, v in full.items()}

    def ratio(k: str, over: str = "torch") -> tuple[float, float, float]:
        r = [t / x for t, x in zip(full[over], full[k])]
        return statistics.median(r), quantile(r, 0.25), quantile(r, 0.75)

    def ms(part: str, k: str) -> float | None:
        v = part_blocks.get((part, k))
        return 1e3 * statistics.median(v) if v else None

    step = 1e3 * med["lab"]
    clip_ms = {k: ms("clip", k) for k in names}
    adamw_ms = {k: ms("adamw", k) for k in names}
    row = {
        "config": name, "d_model": d, "n_layers": L, "T": T, "B": B, "rounds": rounds, "steps_per_block": steps,
        "params": sum(p.numel() for p in params), "n_tensors": len(params), "device": str(device),
        "threads": torch.get_num_threads(), "fast_adamw_direct": bool(getattr(fast, "fused", False)),
        "ms": {k: 1e3 * v for k, v in med.items()},
        "ratio": {"lab": ratio("lab"), "(control)": ratio("(control)")},
        "clip_ms": clip_ms, "adamw_ms": adamw_ms,
        "adamw_saved_ms": adamw_ms["torch"] - adamw_ms["lab"],
        "clip_saved_ms": clip_ms["torch"] - clip_ms["lab"] if clip_timed else None,
    }
    row["adamw_saved_pct"] = 100 * row["adamw_saved_ms"] / step
    row["clip_saved_pct"] = None if row["clip_saved_ms"] is None else 100 * row["clip_saved_ms"] / step
    return row


def table(rows: list[dict]) -> list[str]:
    def r3(x: tuple[float, float, float]) -> str:
        return f"{x[0]:.3f} ({x[1]:.2f}-{x[2]:.2f})"

    def saved(ms: float | None, pct: float | None) -> str:
        return "n/a" if ms is None else f"{ms:.3f} ({pct:.2f}%)"

    lines = ["| config | params (tensors) | lab step ms | torch step ms | torch / lab (q25-q75) | control |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['params']:,} ({r['n_tensors']}) | {r['ms']['lab']:.2f} | "
                     f"{r['ms']['torch']:.2f} | {r3(r['ratio']['lab'])} | {r3(r['ratio']['(control)'])} |")
    lines += ["", ("| config | AdamW step, in the step: lab / torch ms | saves (% of step) | clip: lab / torch ms | "
                   "saves (% of step) |"), "|---|---|---|---|---|"]
    for r in rows:
        c = r["clip_ms"]
        clip = "n/a" if c["lab"] is None else f"{c['lab']:.3f} / {c['torch']:.3f}"
        lines.append(f"| {r['config']} | {r['adamw_ms']['lab']:.3f} / {r['adamw_ms']['torch']:.3f} | "
                     f"{saved(r['adamw_saved_ms'], r['adamw_saved_pct'])} | {clip} | "
                     f"{saved(r['clip_saved_ms'], r['clip_saved_pct'])} |")
    rs = "; ".join(f"{r['config']}: {r['rounds']} rounds x {r['steps_per_block']} steps" for r in rows)
    notes = [f"{r['config']}: FastAdamW fell back to opt.step() with this torch (see its warning): lab and torch "
             "run the same AdamW step" for r in rows if not r["fast_adamw_direct"]]
    dev = f"{rows[0]['threads']} thread(s), {rows[0]['device']}" if rows else ""
    return lines + ["", "lab = `lab.trainer.train_step` (`lab.optim.clip_grad_norm` + `FastAdamW`, which calls torch's "
                    "private fused AdamW kernel directly); torch = the same step with `torch.nn.utils.clip_grad_norm_` + "
                    "`torch.optim.AdamW(fused=True).step()`; one model and optimiser stepped by both. Step ms = median "
                    "over interleaved rounds of each block's fastest step; torch / lab = median of the per-round "
                    "ratios (> 1: lab is faster); control = torch / a second torch candidate (this run's noise, "
                    "ideally 1.000). AdamW and clip: each call timed inside the training steps, each block's fastest, "
                    "median over the rounds (as the steps); % of step = the saving / lab's step. " + dev + ". " + rs + "."] + ([""] + notes if notes else [])


def write_results(body: str, path: Path = RESULTS) -> None:
    """Replace this benchmark's block of RESULTS.md (appended if it has none); other blocks stay."""
    write_block(START, END, body, path)


def run(configs: list[str], quick: bool = False, device: torch.device | None = None) -> list[dict]:
    rows = []
    for name in configs:
        rows.append(bench_config(name, quick, device))
        r = rows[-1]
        clip = "" if r["clip_saved_ms"] is None else \
            f", clip {r['clip_saved_ms']:.3f} ms = {r['clip_saved_pct']:.2f}%"
        print(f"{name}: lab {r['ms']['lab']:.2f} ms, torch {r['ms']['torch']:.2f} ms, torch/lab "
              f"{r['ratio']['lab'][0]:.3f} (control {r['ratio']['(control)'][0]:.3f}); in the step, FastAdamW saves "
              f"{r['adamw_saved_ms']:.3f} ms = {r['adamw_saved_pct']:.2f}% of it{clip}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="S,M,L", help="comma list of " + ",".join(CONFIGS))
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, as the app's jobs)")
    ap.add_argument("--quick", action="store_true", help="half the rounds (a smoke test)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--write", action="store_true", help="replace this benchmark's block of benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"--configs: {c!r} is not one of {', '.join(CONFIGS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA GPU is available")
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    print(f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} thread(s), load average {load0:.1f}, "
          f"lab from {os.path.dirname(os.path.abspath(lab.__file__))}", flush=True)
    rows = run(configs, args.quick, torch.device(args.device))
    total = time.perf_counter() - t0
    dev = torch.cuda.get_device_name() if args.device == "cuda" else f"{os.cpu_count()} CPU cores shared with other jobs"
    head = ["## Optimiser step: lab.optim against torch's public API (`python benchmarks/optim_step.py`)", "",
            f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; torch {torch.__version__}, python "
            f"{platform.python_version()}, {dev}, load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at the "
            f"end; {total:.0f} s" + (" (--quick)" if args.quick else "") + ".", ""]
    body = "\n".join(head + table(rows))
    print("\n" + body)
    if args.write:
        write_results(body)
        print(f"\nwrote {HERE / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
