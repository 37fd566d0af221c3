"""Batched seed repeats: k runs that share every shape, trained as one model with stacked parameters.

Model ensembling with `torch.func` (functional_call + vmap; the technique of the functorch
"model ensembling" tutorial, after JAX's vmap): every parameter gets a leading axis of size k,
one vmapped forward/backward trains all k at once, and each run is stored exactly as if it had
trained alone. What makes each run indistinguishable from its solo twin:
  - init: each slice is `build_model(cfg_i)`, seeded from its own train.seed;
  - data: each run draws its batches from its own `torch.Generator(seed)`, in the same order as
    `lab.trainer.train`; a step's batches are right-padded to the longest one (tokens that no
    earlier position can see in a causal decoder, with targets ignored by the loss);
  - optimiser: AdamW (Loshchilov & Hutter 2019) written out per slice, with the gradient clipped
    by each run's own global norm and each run's own learning-rate schedule (runs may differ
    in lr as well as seed);
  - eval and attention snapshots run the trainer's own `evaluate` / `probe_attention` on a
    plain model loaded with the run's slice.
Results match solo training to float32 round-off (tests/test_batched.py), not bit for bit.
Limits: decoder-only and no dropout (per-run dropout masks cannot match the solo runs), one device.
"""
from __future__ import annotations

import dataclasses
import math
import time
import warnings
from typing import Any, Callable, Optional

import torch
from torch import Tensor
from torch.func import functional_call, vmap

from lab.config import RunConfig
from lab.records import EvalRecord, Record, SnapshotRecord, StepRecord
from lab.tasks import IGNORE_INDEX, Batch
from lab.trainer import (MAX_LOGGED_STEPS, TrainResult, autocast, batch_source, build_model, device_eval_batches,
                         evaluate, lr_at, probe_attention, resolve_device, set_threads, snapshot_steps, to_device)

EPS = 1e-8  # torch.optim.AdamW's default, as make_optimizer uses


def batch_key(cfg: RunConfig) -> Optional[str]:
    """Runs with equal keys can train as one batched model (they may differ in seed, lr and
    name); None for a config that cannot be batched at all."""
    if cfg.model.arch != "decoder" or cfg.model.dropout > 0:
        return None
    plain = dataclasses.replace(cfg, name="", train=dataclasses.replace(cfg.train, seed=0, lr=1.0))
    return plain.to_json()


def _decays(name: str, dim: int) -> bool:
    """make_optimizer's rule: weight decay on matrices, not on biases, norms or embeddings."""
    return dim >= 2 and not name.startswith(("tok_emb", "pos."))


def _pad(t: Tensor, length: int, value: int) -> Tensor:
    return torch.nn.functional.pad(t, (0, length - t.shape[1]), value=value)  # (B, length)


def train_batched(
    cfgs: list[RunConfig],
    on_record: Optional[list[Callable[[Record], None]]] = None,
    should_stop: Optional[list[Callable[[], bool]]] = None,
    threads: Optional[int] = None,
) -> list[TrainResult]:
    """Train k compatible configs (equal `batch_key`) together; one TrainResult per config."""
    keys = {batch_key(c) for c in cfgs}
    if None in keys or len(keys) != 1:
        raise ValueError("configs: batched runs must be decoder-only, without dropout, and differ only in "
                         "train.seed, train.lr and name")
    k, cfg0 = len(cfgs), cfgs[0]
    emit = on_record or [lambda r: None] * k
    stop = should_stop or [lambda: False] * k
    tc0 = cfg0.train
    device = resolve_device(tc0.device)
    if device.type == "cpu":
        set_threads(threads or tc0.threads or 1)
    models = [build_model(c, device) for c in cfgs]  # each seeded from its own train.seed
    shell = models[0]  # runs the stacked parameters; its own values are never used
    names = [n for n, _ in shell.named_parameters()]
    params = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in models]).requires_grad_()
              for n in names}  # name -> (k, *shape)
    buffers = dict(shell.named_buffers())
    state = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in params.items()}  # AdamW m, v
    wd = {n: (tc0.weight_decay if _decays(n, p.dim() - 1) else 0.0) for n, p in params.items()}
    sources = [batch_source(c, device) for c in cfgs]  # each run's own batches, as it would get alone
    evals = device_eval_batches(cfg0, device)  # batched runs are decoder-only and share their eval data
    snaps = snapshot_steps(tc0)
    log_every = max(1, tc0.steps // MAX_LOGGED_STEPS)
    clip = tc0.grad_clip if tc0.grad_clip > 0 else float("inf")
    amp = autocast(device)
    live = list(range(k))  # slices still training, in stack order
    results: dict[int, TrainResult] = {}
    tokens, loss_val, last_eval = [0] * k, [float("nan")] * k, [None] * k
    window = [(0.0, 0)] * k

    def one(p: dict[str, Tensor], inp: Tensor, tgt: Tensor) -> Tensor:
        return functional_call(shell, (p, buffers), (inp, None, tgt)).loss

    def solo(j: int) -> torch.nn.Module:
        """The plain model of stack slice j (run live[j]), for eval, snapshots and the weights."""
        m = models[live[j]]
        with torch.no_grad():
            for n, p in m.named_parameters():
                p.copy_(params[n][j])
        return m

    def do_eval(j: int, step: int) -> EvalRecord:
        i, m = live[j], solo(j)
        loss, acc, em = evaluate(m, evals["eval"], device)
        ood = evaluate(m, evals["ood"], device) if evals["ood"] else (None, None, None)
        rec = EvalRecord(step, time.perf_counter() - t0, tokens[i], loss, acc, em, *ood)
        emit[i](rec)
        return rec

    def finish(j: int, step: int, stopped: bool) -> None:
        i = live[j]
        if stopped and step > 0:  # as train(): end with metrics and attention at the step reached
            if last_eval[i] is None or last_eval[i].step != step:
                last_eval[i] = do_eval(j, step)
            if step not in snaps:
                emit[i](SnapshotRecord(step, probe_attention(solo(j), cfgs[i], device)))
        m, wall = solo(j), time.perf_counter() - t0
        results[i] = TrainResult(step, stopped, wall, str(device), m.num_params(), tokens[i] / max(wall, 1e-9),
                                 loss_val[i], last_eval[i],
                                 {n: v.detach().cpu().clone() for n, v in m.state_dict().items()})

    t0 = time.perf_counter()
    if 0 in snaps:
        for j, i in enumerate(live):
            emit[i](SnapshotRecord(0, probe_attention(solo(j), cfgs[i], device)))
    step = 0
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*batching rule.*")  # CPU SDPA: vmap falls back to a loop
        while live and step < tc0.steps:
            halted = [j for j, i in enumerate(live) if stop[i]()]
            if halted:
                for j in halted:
                    finish(j, step, True)
                keep = [j for j in range(len(live)) if j not in halted]
                live = [live[j] for j in keep]
                if not live:
                    break
                idx = torch.tensor(keep, device=device)
                params = {n: p.detach()[idx].requires_grad_() for n, p in params.items()}
                state = {n: (m[idx], v[idx]) for n, (m, v) in state.items()}
            batches = [sources[i]() for i in live]
            T = max(b.inp.shape[1] for b in batches)
            inp = torch.stack([_pad(b.inp, T, 0) for b in batches])  # (k, B, T)
            tgt = torch.stack([_pad(b.tgt, T, IGNORE_INDEX) for b in batches])  # (k, B, T)
            stacked = to_device(Batch(inp, tgt), device)
            lrs = [lr_at(step, cfgs[i].train) for i in live]
            with amp:
                losses = vmap(one)(params, stacked.inp, stacked.tgt)  # (k,)
            for p in params.values():
                p.grad = None
            losses.sum().backward()  # slices are independent: each gets its own run's gradient
            lr_t = torch.tensor(lrs)  # (k,); on CUDA a pinned, asynchronous copy: no host sync per step
            lr_t = lr_t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else lr_t
            norms = _adamw_step(params, state, wd, lr_t, step + 1, tc0.beta1, tc0.beta2, clip)
            step += 1
            for j, (i, b) in enumerate(zip(live, batches)):
                tokens[i] += b.inp.numel()
            last = step == tc0.steps
            if step % log_every == 0 or last:
                now = time.perf_counter() - t0
                lv, nv = losses.detach().cpu().tolist(), norms.cpu().tolist()
                for j, i in enumerate(live):
                    loss_val[i] = lv[j]
                    tps = (tokens[i] - window[i][1]) / max(now - window[i][0], 1e-9)
                    window[i] = (now, tokens[i])
                    emit[i](StepRecord(step, lv[j], lrs[j], nv[j], tokens[i], now, tps))
            if step % tc0.eval_every == 0 or last:
                for j, i in enumerate(live):
                    last_eval[i] = do_eval(j, step)
            if step in snaps:
                for j, i in enumerate(live):
                    emit[i](SnapshotRecord(step, probe_attention(solo(j), cfgs[i], device)))
    for j in range(len(live)):
        finish(j, step, False)
    return [results[i] for i in range(k)]


@torch.no_grad()
def _adamw_step(params: dict[str, Tensor], state: dict[str, tuple[Tensor, Tensor]], wd: dict[str, float],
                lr: Tensor, t: int, b1: float, b2: float, clip: float) -> Tensor:
    """Per-slice gradient clipping by global norm, then AdamW with per-slice learning rates `lr` (k,),
    for stacked (k, ...) parameters. Returns the (k,) pre-clipping gradient norms."""
    grads = {n: p.grad for n, p in params.items()}
    first = next(iter(params.values()))
    k = first.shape[0]
    sq = torch.zeros(k, device=first.device)
    for g in grads.values():
        sq += g.pow(2).reshape(k, -1).sum(1)
    norms = sq.sqrt()  # (k,)
    coef = (clip / (norms + 1e-6)).clamp(max=1.0)  # as clip_grad_norm_
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    for n, p in params.items():
        shape = (k,) + (1,) * (p.dim() - 1)
        g = grads[n] * coef.view(shape)
        m, v = state[n]
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        if wd[n]:
            p.mul_(1 - lr.view(shape) * wd[n])
        denom = (v.sqrt() / math.sqrt(bc2)).add_(EPS)
        p.sub_((lr / bc1).view(shape) * m / denom)
    return norms


def execute_group(
    store: Any,
    run_ids: list[str],
    should_stop: dict[str, Callable[[], bool]],
    threads: Optional[int] = None,
    on_record: Optional[dict[str, Callable[[Record], None]]] = None,
) -> list[tuple[str, str, Optional[str]]]:
    """execute_run for a batched group: every run is recorded in the store as if trained alone.
    Returns (run_id, final state, error) per run; a failure fails every run of the group."""
    from lab.engine.jobs import error_line, run_recorder, summary_of
    from lab.engine.store import now_iso

    for rid in run_ids:
        state = store.status(rid).get("state")
        if state != "queued":
            raise ValueError(f"run_id: {rid!r} is {state}, not queued; only a queued run can start")
    try:
        cfgs = [store.config(rid) for rid in run_ids]
        for rid in run_ids:
            store.set_status(rid, "running", started_at=now_iso(), step=0, error=None)

        recorders = [run_recorder(store, r, (on_record or {}).get(r)) for r in run_ids]
        results = train_batched(cfgs, recorders, [should_stop[r] for r in run_ids], threads)
        done = []
        for rid, res in zip(run_ids, results):
            store.save_weights(rid, res.state_dict)
            store.write_summary(rid, summary_of(res))
            state = "stopped" if res.stopped else "completed"
            store.set_status(rid, state, step=res.steps_done, finished_at=now_iso())
            done.append((rid, state, None))
        return done
    except Exception as exc:
        error = error_line(exc)
        for rid in run_ids:
            try:
                if store.status(rid).get("state") in ("queued", "running"):
                    store.set_status(rid, "failed", error=error, finished_at=now_iso())
            except Exception:
                pass
        return [(rid, "failed", error) for rid in run_ids]
