"""How long activation patching takes: both grids (residual stream, layers x positions; head outputs,
layers x heads) for a 4-layer decoder at 32 positions, on one CPU thread.

    python benchmarks/patching.py            # writes its block of RESULTS.md
    python benchmarks/patching.py --no-write

The model is the default width (d_model 64, 4 heads) with 4 layers and the induction task's 1000 tokens;
its attention weights are scaled up so an earlier token changes the answer (as a trained induction model's
do), which the measurement needs and which costs nothing extra. Each grid row is one batched forward
(lab/circuits/patching.py), so the work is (layers + 1) forwards of 32 samples and 4 forwards of 4.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import torch  # noqa: E402

from lab.circuits.patching import patch  # noqa: E402
from lab.config import ModelConfig  # noqa: E402
from lab.model import Transformer  # noqa: E402
from results import write_block  # noqa: E402

LAYERS, T, VOCAB, TARGET_S = 4, 32, 1000, 2.0


def model_and_inputs() -> tuple[Transformer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = Transformer(ModelConfig(n_layers=LAYERS, n_heads=4, d_model=64, d_ff=256, n_ctx=T), VOCAB).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.mul_(10.0 if name.endswith("in_proj.weight") else 100.0 if name.endswith("out_proj.weight") else 1.0)
    clean = torch.randint(0, VOCAB, (1, T))
    answer = int(m(clean, None).logits[0, -1].argmax())
    for pos in range(T - 1):
        corrupt = clean.clone()
        corrupt[0, pos] = (corrupt[0, pos] + 1) % VOCAB
        if int(m(corrupt, None).logits[0, -1].argmax()) != answer:
            return m, clean, corrupt
    raise RuntimeError("no corruption of one token changes the answer")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    m, clean, corrupt = model_and_inputs()
    patch(m, clean, corrupt)  # warm-up
    times = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        p = patch(m, clean, corrupt)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    text = (f"Both patching grids of a {LAYERS}-layer decoder (d_model 64, 4 heads) at {T} positions: the residual "
            f"stream's {p.residual.shape[0]} x {p.residual.shape[1]} cells and the heads' {p.heads.shape[0]} x "
            f"{p.heads.shape[1]}, {p.residual.size + p.heads.size} patches, on one CPU thread: **{med:.3f} s** "
            f"(median of {args.rounds}; fastest {min(times):.3f} s, slowest {max(times):.3f} s), against a target "
            f"of {TARGET_S:.0f} s. Measured {time.strftime('%Y-%m-%d')}, torch {torch.__version__}.")
    print(text)
    if not args.no_write:
        write_block("<!-- patching:start -->", "<!-- patching:end -->",
                    "## Activation patching (benchmarks/patching.py)\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
