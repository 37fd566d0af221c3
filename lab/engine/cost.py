"""The cost model: how many seconds a run's training loop takes on one idle CPU core (no torch here).

It only has to get *relative* costs right: lab/engine/estimate.py scales it by the speed measured on the
server (the runs training now, or its last finished runs). Training FLOPs per step follow PaLM's count
(Chowdhery et al. 2022, app. B): 6 N_matmul per token plus 12 n_layers d_model T for the attention scores
and values; an evaluation is a forward pass (a third of that) over each of its sets: the held-out samples
at the training lengths and at the longer ones, and half as many samples of the training distribution
(lab/evaluation.py). Models this small are bound by per-op
overhead and memory traffic, not FLOPs, so a step also pays a fixed cost, a cost per block, one per
activation element (LayerNorm, GELU, residual adds) and one per attention score (softmax, masks). The
constants were fitted (non-negative least squares on the relative error) to the CPU time of 1-thread
steps and evaluations of 55 configs on the 2-core dev machine: every preset's runs and variations of the
default run in width, depth, batch, length, task, positional encoding and architecture; how close the fit
came: benchmarks/README.md, "Cost model calibration".
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from lab.config import GATED, GATES, RECURRENT, RunConfig
from lab.tasks.shapes import task_shape

# ---- constants: seconds on one idle core of the dev machine, 1 intra-op thread --------------------------
STEP_S = 0.52e-3  # per training step: optimizer, batch generation, Python
BLOCK_S = 1.36e-3  # per block per step: the ops of its forward and backward
# per FLOP, per activation element (token x d_model x block: norms, GELU, adds) and per attention score
# (row x head x T_query x T_key x layer), for a training step (forward and backward) and for an evaluation
TRAIN_S = (1 / 9.4e10, 4.8e-9, 9.2e-9)
EVAL_S = (1 / 2.6e11, 9.1e-9, 0.8e-9)  # its FLOPs counted as training ones: ~3x cheaper, forward only
EVAL_BATCH_S = 0.5e-3  # per evaluation batch (256 rows at most) per block
SNAPSHOT_S = 5e-3  # one attention snapshot: a probe forward pass and its file
FIXED_S = 0.4  # per run, outside the loop: hand-over to a worker, eval data, model build, saving
# The constants above come from the fastest CPU time of each measurement; a whole run's steps average
# longer even alone on a quiet machine (benchmarks/RESULTS.md, "Measurements quoted in the code before"),
# hence TYPICAL. An "idle core" here is that quiet machine's typical speed.
TYPICAL = 1.4
TRAIN_SHARE = 2  # lab/evaluation.py's TRAIN_SHARE (torch-free here): the training set is the held-out count / 2


@dataclass(frozen=True)
class Cost:
    """A run's modelled idle-core seconds: per step, per evaluation, per snapshot, and their schedule."""

    steps: int
    step_s: float
    eval_s: float
    eval_every: int
    snapshot_s: float
    snapshots: tuple[int, ...]  # steps at which an attention snapshot is taken

    def upto(self, step: int) -> float:
        """Modelled seconds of the loop up to the step record of `step`: the steps so far and the
        evaluations and snapshots taken before it (the one at `step` itself comes after its record)."""
        evals = (step - 1) // self.eval_every if step > 0 else 0
        snaps = sum(1 for s in self.snapshots if s < step)
        return step * self.step_s + evals * self.eval_s + snaps * self.snapshot_s

    @property
    def loop_s(self) -> float:
        """The whole training loop: every step, every evaluation (the last step's too), every snapshot."""
        evals = self.steps // self.eval_every + (1 if self.steps % self.eval_every else 0)
        return self.steps * self.step_s + evals * self.eval_s + len(self.snapshots) * self.snapshot_s


def _lengths(cfg: RunConfig, length: int) -> tuple[int, int, int]:
    """(decoder input tokens T, encoder input tokens S, scored decoder positions) of one sequence."""
    task = task_shape(cfg.task.name)
    if task.lm:  # a language-model task reads `length` tokens, predicting each next one
        return length - 1, 0, length - 1
    p, a = task.prompt_len(cfg.task, length), task.answer_len(cfg.task, length)
    if cfg.model.arch == "encoder-decoder":
        return a, p, a
    return p + a, 0, a


def flops_per_token(cfg: RunConfig, seq_len: int) -> float:
    """Training FLOPs per token (PaLM's count): 6 N_matmul + 12 n_layers d_model T."""
    m = cfg.model
    vocab = task_shape(cfg.task.name).vocab_size(cfg.task)
    if m.arch in RECURRENT:  # per layer, gates x (W_ih, W_hh) of d x d; no attention scores
        return 6.0 * (m.n_layers * GATES[m.arch] * 2 * m.d_model ** 2 + m.d_model * vocab)
    cross = m.arch == "encoder-decoder"
    attn = 4 * m.d_model * m.n_heads * m.d_head  # Wq, Wk, Wv, Wo (d_model x n_heads d_head each)
    ff = (3 if m.activation in GATED else 2) * m.d_model * m.d_ff_hidden
    per_block = attn + ff
    n_matmul = m.n_layers * per_block * (2 if cross else 1) + (m.n_layers * attn if cross else 0)
    n_matmul += m.d_model * vocab
    return 6.0 * n_matmul + 12.0 * m.n_layers * m.n_heads * m.d_head * seq_len * (2 if cross else 1)


def _pass(cfg: RunConfig, rows: int, length: int, per: tuple[float, float, float]) -> float:
    """Seconds of the arithmetic of one pass over `rows` sequences of one task length (`per`: TRAIN_S or
    EVAL_S), without the per-op overheads."""
    m = cfg.model
    t, s, _ = _lengths(cfg, length)
    blocks = m.n_layers * (2 if m.arch == "encoder-decoder" else 1)
    flops = rows * (t * flops_per_token(cfg, t) + (s * flops_per_token(cfg, s) if s else 0) / 2)
    elements = rows * (t + s) * m.d_model * blocks
    # attention scores: decoder self-attention T x T, and for an encoder-decoder S x S plus cross T x S
    scores = 0 if m.arch in RECURRENT else rows * m.n_heads * m.n_layers * (t * t + s * s + t * s)
    return flops * per[0] + elements * per[1] + scores * per[2]


def train_samples(eval_samples: int) -> int:
    """Samples of the training distribution each evaluation measures (lab.evaluation.train_samples)."""
    return max(1, -(-eval_samples // TRAIN_SHARE))


def eval_sets(cfg: RunConfig) -> tuple[tuple[str, int], ...]:
    """(split, samples) of each set an evaluation measures: held out at the training lengths ("eval") and at
    the longer ones ("ood"; no lengths, no cost, where the task has none), and the training set ("train")."""
    n = cfg.train.eval_samples
    return ("eval", n), ("ood", n), ("train", train_samples(n))


def set_seconds(cfg: RunConfig, split: str, samples: int) -> float:
    """Modelled seconds (before TYPICAL) of one evaluation set: as lab.tasks.batches.eval_batches, `samples` spread
    evenly over the split's lengths, 256 a batch."""
    m = cfg.model
    blocks = m.n_layers * (2 if m.arch == "encoder-decoder" else 1)
    lens = task_shape(cfg.task.name).lengths(cfg.task, split)
    per_len = max(1, -(-samples // len(lens))) if lens else 0
    return sum(-(-per_len // 256) * EVAL_BATCH_S * blocks + _pass(cfg, per_len, n, EVAL_S) for n in lens)


@functools.lru_cache(maxsize=4096)
def cost(cfg: RunConfig) -> Cost:
    """The modelled cost of a run (cached: a config is frozen)."""
    tc, m = cfg.train, cfg.model
    task = task_shape(cfg.task.name)
    blocks = m.n_layers * (2 if m.arch == "encoder-decoder" else 1)
    train = task.lengths(cfg.task, "train")
    step_s = STEP_S + BLOCK_S * blocks + sum(_pass(cfg, tc.batch_size, n, TRAIN_S) for n in train) / len(train)
    eval_s = sum(set_seconds(cfg, split, n) for split, n in eval_sets(cfg))
    k = tc.snapshots
    snaps = () if k == 0 else (tc.steps,) if k == 1 else tuple(sorted({round(i * tc.steps / (k - 1)) for i in range(k)}))
    return Cost(tc.steps, TYPICAL * step_s, TYPICAL * eval_s, tc.eval_every, TYPICAL * SNAPSHOT_S, snaps)


def run_seconds(cfg: RunConfig) -> float:
    """Modelled seconds of one run's training loop on one idle core."""
    return cost(cfg).loop_s
