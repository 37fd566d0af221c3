"""The training loop: one synchronous loop, callbacks with small frozen records, a stop check per step.

One loop (`fit`) serves one run alone (`train`) and k seed repeats trained as one batched model
(lab/batched.py): it owns evaluation (lab/evaluation.py: held-out and training-set metrics), attention
snapshots, logging, stopping and the results, and asks a `Stepper` only for the optimisation step. No
threads and no files here (see lab/engine/). Reproducible from the seed: the model is
initialised from a forked global RNG seeded with `train.seed`, the data come from a per-run
`torch.Generator`, and dropout masks and randomized positions' ids from the global RNG seeded with
`train.seed` at the start, so two runs with one config give the same numbers on the same device (with
those draws, when no other run trains in the same process at the same time: the app's worker processes
run one at a time).
Checkpoints (lab/checkpoint.py) are taken at evaluation points and when a run stops or ends, if asked for
(`on_checkpoint`); `train(cfg, resume=checkpoint)` goes on from one, bit for bit on the same device and
thread count. A continuation to a larger `train.steps` follows the new total's learning-rate schedule,
logging interval and snapshot steps for its remaining steps (see `fit`).
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor

from lab.checkpoint import Checkpoint, RunState, capture, restore
from lab.config import RECURRENT, RunConfig, TrainConfig
from lab.device import autocast, batch_source, resolve_device, set_threads
from lab.evaluation import Evaluator, evaluate  # noqa: F401 (evaluate: its callers import it from here)
from lab.model import Transformer
from lab.optim import clip_grad_norm, make_optimizer  # noqa: F401 (make_optimizer: imported from here too)
from lab.records import EvalRecord, Record, SnapshotRecord, StepRecord
from lab.recurrent import RecurrentLM
from lab.tasks.batches import Batch, get_task, probe

_INIT_LOCK = threading.Lock()  # model init uses the global RNG: one thread at a time
MAX_LOGGED_STEPS = 500  # train records per run, at most (plus the last step)
SNAPSHOT_WEIGHTS_MAX = 1_000_000  # parameters: larger models keep attention snapshots without their weights


@dataclass(frozen=True)
class TrainResult:
    steps_done: int
    stopped: bool
    wall_s: float
    device: str
    params: int
    tokens_per_s: float
    final_train_loss: float
    final_eval: Optional[EvalRecord]
    state_dict: dict[str, Tensor]  # final weights, on the CPU


def build_model(cfg: RunConfig, device: torch.device | str = "cpu") -> Transformer | RecurrentLM:
    """A freshly initialised model for this config, seeded from `train.seed`: a Transformer, or a recurrent
    baseline (lab/recurrent.py) for arch rnn / lstm / gru."""
    vocab = get_task(cfg.task.name).vocab_size(cfg.task)
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.train.seed)
        model = RecurrentLM(cfg.model, vocab) if cfg.model.arch in RECURRENT else Transformer(cfg.model, vocab)
    return model.to(device)


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warmup over `warmup` steps, then cosine / linear decay to min_lr_ratio * lr (or constant)."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    if tc.schedule == "constant" or tc.steps <= tc.warmup:
        return tc.lr
    frac = min(1.0, (step - tc.warmup) / max(1, tc.steps - 1 - tc.warmup))
    shape = 0.5 * (1 + math.cos(math.pi * frac)) if tc.schedule == "cosine" else 1 - frac
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * shape)


def train_step(model: Transformer, b: Batch, params: list[Tensor], opt: torch.optim.Optimizer, clip: float,
               amp: contextlib.AbstractContextManager, smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
    """One optimisation step: forward, backward, clip the gradients' joint norm to `clip`, AdamW.
    Returns (loss, grad norm before clipping), both on the device: no host sync here."""
    with amp:
        loss = model(b.inp, b.src, b.tgt, label_smoothing=smoothing).loss
    for p in params:  # zero_grad(set_to_none=True), without walking the param groups
        p.grad = None
    loss.backward()
    grad_norm = clip_grad_norm(params, clip)
    opt.step()
    return loss, grad_norm


@torch.no_grad()
def probe_attention(model: Transformer, cfg: RunConfig, device: torch.device) -> dict[str, np.ndarray]:
    """Attention patterns for the run's fixed probe input: kind -> (n_layers, n_heads, Tq, Tk)."""
    was_training = model.training
    model.eval()
    b = probe(cfg.task, cfg.model.arch).to(device)
    out = model(b.inp, b.src, need_weights=True)
    model.train(was_training)
    return {k: v[:, 0].float().cpu().numpy() for k, v in out.attention.items()}  # drop batch dim


def snapshot_weights(model: Transformer) -> dict[str, np.ndarray]:
    """float16 copies of the weights for an attention snapshot (interventions at that step), or {} for a
    model over SNAPSHOT_WEIGHTS_MAX parameters (2 MB a snapshot at most: a class's disk is shared)."""
    if model.num_params() > SNAPSHOT_WEIGHTS_MAX:
        return {}
    return {k: v.detach().float().cpu().numpy().astype(np.float16) for k, v in model.state_dict().items()}


def snapshot_steps(tc: TrainConfig) -> set[int]:
    """`snapshots` steps spread evenly from 0 (the untrained model) to the last step."""
    k = tc.snapshots
    if k == 0:
        return set()
    if k == 1:
        return {tc.steps}
    return {round(i * tc.steps / (k - 1)) for i in range(k)}


class Stepper(Protocol):
    """Advances the live runs of a `fit` by one optimisation step each (one run alone, or k batched seeds)."""

    def step(self, step: int) -> tuple[list[float], Tensor, Tensor, list[int]]:
        """Train the live runs on one batch each; (learning rates, losses, grad norms before clipping, tokens
        per run). Losses and norms stay on the device (shape () for one run, (k,) for k): no host sync."""

    def model(self, j: int) -> Transformer:
        """The plain model of live run j (for evaluation, snapshots and the final weights)."""

    def keep(self, kept: list[int]) -> None:
        """Drop the live runs not listed (`kept`: indices into the live runs, in order)."""

    def state(self, j: int) -> RunState:
        """Live run j's weights, optimiser state and random streams, as CPU copies (for a checkpoint)."""


@dataclass
class FitRun:
    """One run inside a `fit`: its config and callbacks, and what the loop has counted and emitted for it."""

    cfg: RunConfig
    on_record: Callable[[Record], None]
    should_stop: Callable[[], bool]
    on_checkpoint: Optional[Callable[[Checkpoint], None]] = None
    tokens: int = 0
    train_loss: float = float("nan")  # the last logged train loss
    last_eval: Optional[EvalRecord] = None
    window: tuple[float, int] = (0.0, 0)  # (time, tokens) at its last train record, for recent throughput
    result: Optional[TrainResult] = None  # set when it stops or ends

    def resume(self, ck: Checkpoint) -> None:
        """Take the loop's counters from a checkpoint."""
        self.tokens, self.train_loss, self.last_eval = ck.tokens, ck.train_loss, ck.last_eval
        self.window = (ck.elapsed_s, ck.tokens)


class _Loop:
    """What the runs of one `fit` share (stepper, evaluation data, schedule, clock) and what it does to a
    live run: `j` is the run's index among the stepper's live runs."""

    def __init__(self, cfg: RunConfig, stepper: Stepper, device: torch.device, elapsed_s: float) -> None:
        self.stepper, self.device, self.tc = stepper, device, cfg.train
        self.evaluator = Evaluator(cfg, device)  # batched runs share their task, so their evaluation data
        self.snaps = snapshot_steps(cfg.train)
        self.log_every = max(1, cfg.train.steps // MAX_LOGGED_STEPS)
        self.t0 = time.perf_counter() - elapsed_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def evaluate(self, j: int, run: FitRun, step: int) -> None:
        run.last_eval = self.evaluator(self.stepper.model(j), step, run.tokens, self.elapsed)
        run.on_record(run.last_eval)

    def snapshot(self, j: int, run: FitRun, step: int) -> None:
        model = self.stepper.model(j)
        run.on_record(SnapshotRecord(step, probe_attention(model, run.cfg, self.device), snapshot_weights(model)))

    def checkpoint(self, j: int, run: FitRun, step: int, stop_eval: bool = False, stop_snapshot: bool = False) -> None:
        if run.on_checkpoint is not None:
            run.on_checkpoint(Checkpoint(step, run.tokens, self.elapsed(), run.train_loss,
                                         None if stop_eval else run.last_eval, self.stepper.state(j), stop_eval,
                                         stop_snapshot))

    def finish(self, j: int, run: FitRun, step: int, stopped: bool) -> None:
        """End a run: a stopped one first gets metrics and attention at the step it reached."""
        stop_eval = stop_snapshot = False
        if stopped and step > 0:
            if run.last_eval is None or run.last_eval.step != step:
                self.evaluate(j, run, step)
                stop_eval = True
            if step not in self.snaps:  # (at most one snapshot per step)
                self.snapshot(j, run, step)
                stop_snapshot = True
        self.checkpoint(j, run, step, stop_eval, stop_snapshot)
        model, wall = self.stepper.model(j), self.elapsed()
        run.result = TrainResult(step, stopped, wall, str(self.device), model.num_params(),
                                 run.tokens / max(wall, 1e-9), run.train_loss, run.last_eval,
                                 {n: v.detach().cpu().clone() for n, v in model.state_dict().items()})

    def halt(self, live: list[FitRun], step: int, stop_at: Optional[int]) -> list[FitRun]:
        """Finish the live runs asked to stop before `step`; the runs that go on."""
        halted = [j for j, run in enumerate(live) if run.should_stop() or step == stop_at]
        if not halted:
            return live
        for j in halted:
            self.finish(j, live[j], step, True)
        kept = [j for j in range(len(live)) if j not in halted]
        if kept:
            self.stepper.keep(kept)
        return [live[j] for j in kept]

    def record(self, live: list[FitRun], step: int, lrs: list[float], losses: Tensor, norms: Tensor) -> None:
        """After step `step`: train records, evaluations, snapshots and checkpoints, each where it is due."""
        last = step == self.tc.steps
        if step % self.log_every == 0 or last:
            now = self.elapsed()
            lv, nv = losses.detach().reshape(-1).tolist(), norms.reshape(-1).tolist()  # (k,): the host sync
            for j, run in enumerate(live):
                run.train_loss = lv[j]
                tps = (run.tokens - run.window[1]) / max(now - run.window[0], 1e-9)
                run.window = (now, run.tokens)
                run.on_record(StepRecord(step, lv[j], lrs[j], nv[j], run.tokens, now, tps))
        due = [(step % self.tc.eval_every == 0 or last, self.evaluate), (step in self.snaps, self.snapshot),
               (step % self.tc.eval_every == 0 and not last, self.checkpoint)]  # (the last step's: in finish)
        for is_due, action in due:
            if is_due:
                for j, run in enumerate(live):
                    action(j, run, step)


def fit(cfgs: Sequence[RunConfig], stepper: Stepper, device: torch.device,
        on_record: Sequence[Callable[[Record], None]], should_stop: Sequence[Callable[[], bool]],
        on_checkpoint: Optional[Sequence[Callable[[Checkpoint], None]]] = None,
        start: Optional[Checkpoint] = None, stop_at: Optional[int] = None) -> list[TrainResult]:
    """Train runs that share a step count, eval data and schedule length until each ends or is stopped.
    Every run gets its own records, in the order one run alone would emit them; a stopped run ends with
    metrics and attention at the step it reached. `on_checkpoint[i]`, if given, gets run i's checkpoint at
    each evaluation point and when it stops or ends. `stop_at` stops every run when it reaches that step,
    as a stop request would.

    `start` (one run, its stepper already restored from it) goes on from a checkpoint's step with its
    counters. The schedule is the config's: a larger `train.steps` than the checkpoint's run had gives the
    remaining steps the new total's learning rates (lr_at), logging interval and snapshot steps (those
    after the checkpoint); with the same total the continuation is the uninterrupted run's remainder."""
    k, tc = len(cfgs), cfgs[0].train
    if start is not None and (k != 1 or start.step > tc.steps):
        raise ValueError(f"start: a checkpoint continues one run up to train.steps (got {k} runs, checkpoint "
                         f"at step {start.step}, train.steps {tc.steps})")
    runs = [FitRun(cfg, on_record[i], should_stop[i], None if on_checkpoint is None else on_checkpoint[i])
            for i, cfg in enumerate(cfgs)]
    if start is not None:
        runs[0].resume(start)
    loop = _Loop(cfgs[0], stepper, device, start.elapsed_s if start is not None else 0.0)
    live = list(runs)  # the runs still training, in the stepper's order
    step = 0 if start is None else start.step
    if step == 0 and 0 in loop.snaps:
        for j, run in enumerate(live):
            loop.snapshot(j, run, 0)
    while step < tc.steps:
        live = loop.halt(live, step, stop_at)
        if not live:
            break
        lrs, losses, norms, toks = stepper.step(step)
        step += 1
        for run, n in zip(live, toks):
            run.tokens += n
        loop.record(live, step, lrs, losses, norms)
    for j, run in enumerate(live):
        loop.finish(j, run, step, False)
    return [run.result for run in runs]


class SoloStepper:
    """One run: its model, torch's AdamW (lab/optim.py), its own batches and learning-rate schedule."""

    def __init__(self, cfg: RunConfig, device: torch.device) -> None:
        tc = cfg.train
        self.tc, self.net = tc, build_model(cfg, device)
        self.net.train()
        # dropout masks and randomized positions' ids (lab/positional.py) come from the global generator
        self.draws = cfg.model.dropout > 0 or (cfg.model.pos_range > 0 and cfg.model.arch not in RECURRENT)
        self.device = device
        if self.draws:  # seed it per run, so a worker process (one run at a time, job after job) and a
            torch.manual_seed(tc.seed)  # notebook repeat a run exactly
        self.opt = make_optimizer(self.net, tc)
        self.next_batch = batch_source(cfg, device)
        self.params = list(self.net.parameters())  # once: model.parameters() walks every module each call
        self.clip = tc.grad_clip if tc.grad_clip > 0 else float("inf")
        self.amp = autocast(device)

    def step(self, step: int) -> tuple[list[float], Tensor, Tensor, list[int]]:
        lr = lr_at(step, self.tc)
        for g in self.opt.param_groups:
            g["lr"] = lr
        b = self.next_batch()
        loss, grad_norm = train_step(self.net, b, self.params, self.opt, self.clip, self.amp,
                                     self.tc.label_smoothing)
        return [lr], loss, grad_norm, [b.inp.numel() + (b.src.numel() if b.src is not None else 0)]

    def model(self, j: int) -> Transformer:
        return self.net

    def keep(self, kept: list[int]) -> None:
        """Nothing to drop: a stopped run alone ends the loop."""

    def state(self, j: int) -> RunState:
        return capture(self.net, self.opt, self.next_batch, self.draws, self.device)

    def restore(self, state: RunState, step: int) -> None:
        """Go on from a checkpoint's state at `step` (before the first step; lab/checkpoint.py)."""
        restore(state, step, self.net, self.opt, self.next_batch, self.draws, self.device)


def train(
    cfg: RunConfig,
    on_record: Optional[Callable[[Record], None]] = None,
    should_stop: Optional[Callable[[], bool]] = None,
    threads: Optional[int] = None,
    *,
    on_checkpoint: Optional[Callable[[Checkpoint], None]] = None,
    resume: Optional[Checkpoint] = None,
    stop_at: Optional[int] = None,
) -> TrainResult:
    """Train a model for `cfg.train.steps` steps (or until `should_stop()` returns True, or step `stop_at`).
    `on_checkpoint` gets its checkpoints (lab/checkpoint.py); `resume` goes on from one (see `fit` for the
    schedule of a continuation to a larger total)."""
    device = resolve_device(cfg.train.device)
    if device.type == "cpu":
        set_threads(threads or cfg.train.threads or os.cpu_count() or 1)
    stepper = SoloStepper(cfg, device)
    if resume is not None:
        stepper.restore(resume.state, resume.step)
    return fit([cfg], stepper, device, [on_record or (lambda r: None)], [should_stop or (lambda: False)],
               None if on_checkpoint is None else [on_checkpoint], resume, stop_at)[0]
