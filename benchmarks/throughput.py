"""Training-step throughput of our Transformer against a minimal hand-written pre-LN GPT.

    python benchmarks/throughput.py [--configs S,M,L] [--pos learned,rope,...] [--threads 1]
                                    [--steps N] [--repeats N] [--json] [--device cpu|cuda]

For each config and every positional encoding (PE), one training step of our model
(`lab.model.Transformer` built by `lab.trainer.build_model`, optimiser from
`lab.trainer.make_optimizer`) is timed beside the same step of `benchmarks/baseline_gpt.py`
at the same sizes, in the same process. The baseline has only a learned PE; every PE of ours is
compared against that one baseline.

One training step on fresh random tokens (B, T) with random targets (cross-entropy over all B*T
positions), the same arithmetic for both models:
    ours:     `lab.trainer.train_step`, the step the app and the CLI run: forward, grads set to None,
              backward, `lab.optim.clip_grad_norm` (1.0: torch's clip_grad_norm_ with foreach
              kernels), torch.optim.AdamW.step()
    baseline: the nanoGPT-style step: forward; zero_grad(set_to_none=True); backward;
              torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); torch.optim.AdamW.step()
Both optimisers are AdamW with the same two groups (decay on matrices, none on biases, norms and
embeddings), hyperparameters and `fused` setting, and give the same numbers bit for bit
(both are torch's AdamW; benchmarks/README.md says what the profiler showed).

Timing (built for a shared, noisy 2-core machine): after a warm-up, `--repeats` rounds; in each
round every model runs one block of `--steps` steps (about 0.25 s), in a fresh random order.
A block's value is its fastest step. ratio = median over rounds of (baseline block / our block
in the same round), so both sides of each pair saw the same machine load; tok/s = B*T / median
block. Defaults give about 6 s of timing per model. A row "(baseline)" times a second baseline
instance as if it were ours: its ratio (ideally 1.000) shows how far this run's ratios can be
trusted; `--no-control` leaves it out.

Achieved GFLOP/s = training FLOPs per step / step time, with (PaLM, Chowdhery et al. 2022, app. B)
    FLOPs/step = 6 * N_matmul * B*T  +  12 * n_layers * d_model * T * B*T
N_matmul = elements of all Linear weights (qkv, out proj, fc1, fc2, head; no embeddings, biases
or norms); the second term is the attention score and value matmuls (forward + backward, causal
masking not discounted). The same formula is used for both models (their N_matmul are equal).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn

try:  # PYTHONPATH may point at another copy of lab/ (to benchmark a patch)
    import lab
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import lab
from lab.config import POS_ENCODINGS, ModelConfig, RunConfig, TaskConfig, TrainConfig  # noqa: E402
from lab.tasks.batches import Batch, get_task  # noqa: E402
from lab.trainer import build_model, make_optimizer, train_step  # noqa: E402

try:
    from benchmarks.baseline_gpt import GPT  # python -m benchmarks.throughput
except ImportError:
    from baseline_gpt import GPT  # python benchmarks/throughput.py

# name: (d_model, n_layers, n_heads, length T, batch B)
CONFIGS: dict[str, tuple[int, int, int, int, int]] = {
    "S": (64, 2, 4, 32, 64),
    "M": (128, 4, 4, 64, 32),
    "L": (256, 4, 8, 64, 32),
}
N_CTX = 128  # position table size of both models (>= every config's length)
TASK = TaskConfig(name="reverse")  # only fixes the vocabulary (11 tokens), as in the app
TASK_VOCAB = get_task(TASK.name).vocab_size(TASK)
TRAIN = TrainConfig()  # lr, betas, weight decay of the app's default run
BLOCK_S = 0.25  # seconds per timed block when --steps is not given
MODEL_S = 6.0  # timed seconds per model and config when --repeats is not given
MIN_ROUNDS = 9  # at least: a median of paired ratios from 5 rounds (L's old count) moved by +-2% between runs


def matmul_params(model: nn.Module) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def flops_per_step(n_matmul: int, n_layers: int, d: int, T: int, B: int) -> float:
    return 6.0 * n_matmul * B * T + 12.0 * n_layers * d * T * B * T


def baseline_optimizer(model: nn.Module, tc: TrainConfig, like: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The same AdamW as `make_optimizer`, written plainly: decay on Linear matrices only.

    `foreach` and `fused` are copied from our optimiser `like`, so the two always match.
    """
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.endswith("_emb.weight")]
    ids = {id(p) for p in decay}
    no_decay = [p for p in model.parameters() if id(p) not in ids]
    groups = [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=like.defaults["eps"],
                             foreach=like.defaults["foreach"], fused=like.defaults["fused"])


@dataclass
class Candidate:
    name: str  # "baseline", "(baseline)" (the control twin) or our PE
    model: nn.Module
    opt: torch.optim.Optimizer
    ours: bool
    blocks: list[float] = field(default_factory=list)  # seconds per step, one value per round

    def __post_init__(self) -> None:
        if self.ours:  # what lab.trainer.train sets up once per run
            self.params = list(self.model.parameters())

    def step(self, idx: torch.Tensor, tgt: torch.Tensor) -> None:
        if self.ours:
            train_step(self.model, Batch(idx, tgt), self.params, self.opt, 1.0, contextlib.nullcontext())
            return
        loss = self.model(idx, tgt)[1]
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_block(c: Candidate, n: int, batch, device: torch.device) -> float:
    """Seconds per step of one block of n steps, each on a fresh random batch from `batch()`.

    CPU: every step is timed alone and the block's fastest step is kept (a step is >= 10 ms,
    the clock costs < 1 us): the first step after switching models runs on cold caches, and
    other processes on this shared machine slow single steps. CUDA: the n steps are timed as
    one block with one synchronisation, so kernel queueing overlaps as in training.
    """
    sync(device)
    if device.type == "cuda":
        t0 = time.perf_counter()
        for _ in range(n):
            c.step(*batch())
        sync(device)
        return (time.perf_counter() - t0) / n
    best = float("inf")
    for _ in range(n):
        idx, tgt = batch()  # outside the timed region
        t0 = time.perf_counter()
        c.step(idx, tgt)
        best = min(best, time.perf_counter() - t0)
    return best


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    i = q * (len(xs) - 1)
    lo = int(i)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (i - lo)


def bench_config(name: str, pes: list[str], args, device: torch.device) -> list[dict]:
    d, L, H, T, B = CONFIGS[name]
    cands: list[Candidate] = []
    torch.manual_seed(0)
    base = GPT(TASK_VOCAB, N_CTX, d, L, H, 4 * d).to(device).train()
    for pe in pes:
        mc = ModelConfig(arch="decoder", n_layers=L, n_heads=H, d_model=d, d_ff=4 * d, dropout=0.0,
                         activation="gelu", norm="pre", pos=pe, n_ctx=N_CTX)
        model = build_model(RunConfig(model=mc, task=TASK, train=TRAIN), device).train()
        cands.append(Candidate(pe, model, make_optimizer(model, TRAIN), ours=True))
    like = cands[0].opt
    cands.insert(0, Candidate("baseline", base, baseline_optimizer(base, TRAIN, like), ours=False))
    if args.control:  # a second baseline, timed like ours: its ratio shows the noise of this run
        torch.manual_seed(1)
        twin = GPT(TASK_VOCAB, N_CTX, d, L, H, 4 * d).to(device).train()
        cands.append(Candidate("(baseline)", twin, baseline_optimizer(twin, TRAIN, like), ours=False))
    gen = torch.Generator(device).manual_seed(1)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh random tokens and targets every step: a fixed batch gets memorised within ~100
        steps (loss -> 0), which is not the regime the app trains in."""
        return tuple(torch.randint(0, TASK_VOCAB, (B, T), generator=gen, device=device) for _ in range(2))

    for c in cands:  # warm up: allocator, oneDNN primitives, optimiser state
        timed_block(c, 4, batch, device)
    per = min(timed_block(c, 2, batch, device) for c in cands[:2])  # calibration
    steps = args.steps or max(2, round(BLOCK_S / per))
    rounds = args.repeats or max(MIN_ROUNDS, round(MODEL_S / (steps * per)))
    order = random.Random(0)
    for _ in range(rounds):  # interleaved, in a fresh random order each round
        for c in order.sample(cands, len(cands)):
            c.blocks.append(timed_block(c, steps, batch, device))

    base_s = statistics.median(cands[0].blocks)
    n_base = matmul_params(base)
    rows = []
    for c in cands[1:]:
        n_ours = matmul_params(c.model)
        assert abs(n_ours - n_base) <= 0.05 * n_base, (n_ours, n_base)
        ours_s = statistics.median(c.blocks)
        paired = [b / o for b, o in zip(cands[0].blocks, c.blocks)]  # same round: same machine load
        rows.append({
            "config": name, "pe": c.name, "d_model": d, "n_layers": L, "n_heads": H, "T": T, "B": B,
            "steps_per_block": steps, "rounds": rounds, "threads": torch.get_num_threads(), "device": str(device),
            "ours_ms": 1e3 * ours_s, "base_ms": 1e3 * base_s,
            "ours_best_ms": 1e3 * min(c.blocks), "base_best_ms": 1e3 * min(cands[0].blocks),
            "ours_tok_s": B * T / ours_s, "base_tok_s": B * T / base_s,
            "ratio": statistics.median(paired), "ratio_q25": quantile(paired, 0.25), "ratio_q75": quantile(paired, 0.75),
            "ours_gflop_s": flops_per_step(n_ours, L, d, T, B) / ours_s / 1e9,
            "base_gflop_s": flops_per_step(n_base, L, d, T, B) / base_s / 1e9,
            "ours_params": sum(p.numel() for p in c.model.parameters()),
            "base_params": sum(p.numel() for p in base.parameters()),
            "optimizer": {k: cands[0].opt.defaults[k] for k in ("foreach", "fused")},
            "control": not c.ours,
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="S,M,L", help="comma list of " + ",".join(CONFIGS))
    ap.add_argument("--pos", default=",".join(POS_ENCODINGS), help="comma list of our PEs (default: all)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, as the app's jobs)")
    ap.add_argument("--steps", type=int, default=0, help=f"steps per timed block (0 = about {BLOCK_S} s)")
    ap.add_argument("--repeats", type=int, default=0,
                    help=f"interleaved rounds, one block per model each (0 = about {MODEL_S:.0f} s per model, >= {MIN_ROUNDS})")
    ap.add_argument("--no-control", dest="control", action="store_false",
                    help="leave out the (baseline) row: a second baseline timed as ours, whose ratio shows the noise")
    ap.add_argument("--json", action="store_true", help="also print one JSON object per row")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = ap.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    pes = [p.strip() for p in args.pos.split(",") if p.strip()]
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"--configs: {c!r} is not one of {', '.join(CONFIGS)}")
    if not pes:
        ap.error("--pos: give at least one of " + ", ".join(POS_ENCODINGS))
    for p in pes:
        if p not in POS_ENCODINGS:
            ap.error(f"--pos: {p!r} is not one of {', '.join(POS_ENCODINGS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA GPU is available")
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)

    t_start = time.perf_counter()
    print(f"torch {torch.__version__}, {device}, {torch.get_num_threads()} thread(s), load average "
          f"{os.getloadavg()[0]:.1f}, lab from {os.path.dirname(os.path.abspath(lab.__file__))}", flush=True)
    hdr = (f"{'config':<7}{'pe':<11}{'ours tok/s':>11}{'base tok/s':>11}{'ratio':>7}{'(q25-q75)':>12}"
           f"{'ours GF/s':>10}{'base GF/s':>10}")
    print(hdr)
    print("-" * len(hdr), flush=True)
    all_rows = []
    for name in configs:
        rows = bench_config(name, pes, args, device)
        for r in rows:
            print(f"{name:<7}{r['pe']:<11}{r['ours_tok_s']:>11,.0f}{r['base_tok_s']:>11,.0f}{r['ratio']:>7.3f}"
                  f"{r['ratio_q25']:>6.2f}-{r['ratio_q75']:<5.2f}{r['ours_gflop_s']:>10.1f}{r['base_gflop_s']:>10.1f}",
                  flush=True)
        all_rows += rows
    sizes = []
    for n in configs:
        r = next(x for x in all_rows if x["config"] == n)
        d, L, H, T, B = CONFIGS[n]
        sizes.append(f"{n}: d={d} L={L} H={H} T={T} B={B}, {r['rounds']} rounds x {r['steps_per_block']} steps")
    print("; ".join(sizes))
    print(f"ratio = median over rounds of (baseline / our step time) in the same round; >= 1.0: ours is "
          f"as fast or faster. tok/s = B*T / median step time. Total {time.perf_counter() - t_start:.0f} s, "
          f"load average {os.getloadavg()[0]:.1f}")
    if args.json:
        for r in all_rows:
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
