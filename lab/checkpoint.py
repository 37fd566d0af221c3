"""Checkpoints: everything a run needs to go on training bit for bit, in one safetensors file.

The training loop (lab/trainer.py `fit`) takes a checkpoint at every evaluation point and when a run
stops or ends, and hands it to its `on_checkpoint` callback; the run store keeps the latest one per run
(lab/engine/continuation.py). `train(cfg, resume=checkpoint)` goes on from it. What it holds:
  - the model's state_dict (parameters and buffers) and AdamW's state per parameter (first and second
    moments and the step count, exactly the tensors torch's AdamW keeps, so it steps on from them with
    the numbers of the uninterrupted run);
  - every random stream the training draws from: the batch source's generators (the data stream's
    position; lab/device.py BatchSource) and, for a run with dropout or randomized positions, torch's
    global generator (and the CUDA one on a GPU). The tasks draw from torch generators only: no numpy
    or Python RNG is involved;
  - the loop's own counters: the step reached, tokens seen, wall time so far, the last logged train
    loss and the last evaluation.
Batched seed groups (lab/batched.py) leave each member the same per-run checkpoint, so any run can be
continued alone.

File format (`checkpoint.safetensors`: tensors and a text header; loading unpickles and executes nothing):

    model.<key>              the model's state_dict entries, their own shapes and dtypes
    adam.exp_avg.<param>     AdamW first moment, the parameter's shape
    adam.exp_avg_sq.<param>  AdamW second moment, the parameter's shape
    adam.step.<param>        () float32: AdamW steps taken for that parameter
    data.<i>                 (n,) uint8: the batch source's generator states, in order (CPU: one;
                             CUDA: the lengths' CPU generator, then the tokens' CUDA one)
    rng.torch                (n,) uint8: torch's global CPU generator (runs with dropout or randomized positions)
    rng.device               (n,) uint8: the CUDA generator of the run's device (CUDA runs that draw)
    header "lab_checkpoint": JSON {"format": 1, "step", "tokens", "elapsed_s", "train_loss",
                             "last_eval": {EvalRecord fields} | null, "data_kind": "cpu" | "cuda",
                             "stop_eval", "stop_snapshot"}

`stop_eval` / `stop_snapshot` say that the evaluation / attention snapshot at `step` was added because the
run stopped there (a Stop click, `--stop-at`), not by its schedule; a continuation drops them, so that a
run stopped and continued records exactly what it would have recorded uninterrupted.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save as _to_bytes
from torch import Tensor

from lab.device import BatchSource
from lab.records import EvalRecord

FORMAT = 1
HEADER_KEY = "lab_checkpoint"


@dataclass(frozen=True)
class RunState:
    """What a stepper holds for one run: weights, optimiser state and random streams (CPU copies)."""

    weights: dict[str, Tensor]  # model.state_dict()
    exp_avg: dict[str, Tensor]  # parameter name -> AdamW first moment
    exp_avg_sq: dict[str, Tensor]  # parameter name -> AdamW second moment
    adam_step: dict[str, Tensor]  # parameter name -> () float32 step count
    data: tuple[Tensor, ...]  # BatchSource.state()
    data_kind: str  # BatchSource.kind: "cpu" or "cuda"
    rng_torch: Optional[Tensor] = None  # torch.get_rng_state(), when dropout or randomized positions draw from it
    rng_device: Optional[Tensor] = None  # torch.cuda.get_rng_state(device), likewise


@dataclass(frozen=True)
class Checkpoint:
    """A run at the end of step `step`: its state and the training loop's counters."""

    step: int
    tokens: int
    elapsed_s: float
    train_loss: float  # the last logged train loss (NaN before the first log)
    last_eval: Optional[EvalRecord]
    state: RunState
    stop_eval: bool = False  # the eval at `step` was added by a stop, not by the schedule
    stop_snapshot: bool = False  # likewise the attention snapshot at `step`


def _cpu(t: Tensor) -> Tensor:
    return t.detach().to("cpu", copy=True).contiguous()


def capture(net: torch.nn.Module, opt: torch.optim.Optimizer, source: BatchSource, draws: bool,
            device: torch.device) -> RunState:
    """A solo run's state: its model, its torch AdamW's state, its batch source, and with `draws` (dropout or
    randomized positions) the generators they draw from."""
    names = {p: n for n, p in net.named_parameters()}
    moments: dict[str, dict[str, Tensor]] = {"exp_avg": {}, "exp_avg_sq": {}, "step": {}}
    for p, st in opt.state.items():
        for key, out in moments.items():
            if key in st:
                out[names[p]] = _cpu(st[key])
    rng_device = torch.cuda.get_rng_state(device) if draws and device.type == "cuda" else None
    return RunState({k: _cpu(v) for k, v in net.state_dict().items()}, moments["exp_avg"], moments["exp_avg_sq"],
                    moments["step"], source.state(), source.kind, torch.get_rng_state() if draws else None,
                    rng_device)


def restore(state: RunState, step: int, net: torch.nn.Module, opt: torch.optim.Optimizer, source: BatchSource,
            draws: bool, device: torch.device) -> None:
    """Put a freshly built solo run (model, torch AdamW not yet stepped, batch source) into `state`. The
    optimiser state is created as torch's fused AdamW creates it (the step count as a float32 tensor on
    the parameter's device; on the CPU for the unfused optimiser), so `opt.step()` goes on from it."""
    net.load_state_dict(state.weights)  # copies into the existing parameters: the optimiser keeps them
    fused = bool(opt.defaults.get("fused"))
    for name, p in net.named_parameters():
        if name in state.exp_avg:
            opt.state[p] = {
                "step": state.adam_step[name].to(torch.float32).to(p.device if fused else "cpu").clone(),
                "exp_avg": state.exp_avg[name].to(p.device, p.dtype).clone(),
                "exp_avg_sq": state.exp_avg_sq[name].to(p.device, p.dtype).clone(),
            }
    source.restore(state.data_kind, state.data, step)
    if draws and state.rng_torch is not None:
        torch.set_rng_state(state.rng_torch)
    if draws and state.rng_device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state.rng_device, device)


# ---- the file -------------------------------------------------------------------------------------
def _header(ck: Checkpoint) -> dict[str, Any]:
    loss = ck.train_loss if math.isfinite(ck.train_loss) else None
    ev = None if ck.last_eval is None else dataclasses.asdict(ck.last_eval)
    return {"format": FORMAT, "step": ck.step, "tokens": ck.tokens, "elapsed_s": ck.elapsed_s, "train_loss": loss,
            "last_eval": ev, "data_kind": ck.state.data_kind, "stop_eval": ck.stop_eval,
            "stop_snapshot": ck.stop_snapshot}


def to_bytes(ck: Checkpoint) -> bytes:
    """`ck` as the bytes of a safetensors file (the caller writes them atomically: lab/engine/continuation.py)."""
    s = ck.state
    tensors = {f"model.{k}": v for k, v in s.weights.items()}
    for prefix, part in (("adam.exp_avg.", s.exp_avg), ("adam.exp_avg_sq.", s.exp_avg_sq), ("adam.step.", s.adam_step)):
        tensors.update({prefix + k: v for k, v in part.items()})
    tensors.update({f"data.{i}": v for i, v in enumerate(s.data)})
    for key, value in (("rng.torch", s.rng_torch), ("rng.device", s.rng_device)):
        if value is not None:
            tensors[key] = value
    return _to_bytes({k: _cpu(v) for k, v in tensors.items()}, metadata={HEADER_KEY: json.dumps(_header(ck))})


def read_header(path: str | Path) -> dict[str, Any]:
    """The header alone (step, counters, flags): no tensor is read. ValueError if it is not a checkpoint."""
    with safe_open(str(path), "pt") as fh:
        meta = fh.metadata() or {}
    try:
        head = json.loads(meta[HEADER_KEY])
    except (KeyError, ValueError):
        raise ValueError(f"{Path(path).name}: not a run checkpoint (no {HEADER_KEY} header)") from None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise ValueError(f"{Path(path).name}: checkpoint format {head.get('format') if isinstance(head, dict) else '?'}"
                         f" is not supported (allowed: {FORMAT})")
    return head


def load(path: str | Path) -> Checkpoint:
    """The checkpoint in `path`, tensors on the CPU."""
    head = read_header(path)
    tensors = load_file(str(path))

    def part(prefix: str) -> dict[str, Tensor]:
        return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    data = part("data.")
    state = RunState(part("model."), part("adam.exp_avg."), part("adam.exp_avg_sq."), part("adam.step."),
                     tuple(data[str(i)] for i in range(len(data))), head["data_kind"], tensors.get("rng.torch"),
                     tensors.get("rng.device"))
    ev = head["last_eval"]
    loss = head["train_loss"]
    return Checkpoint(int(head["step"]), int(head["tokens"]), float(head["elapsed_s"]),
                      float("nan") if loss is None else float(loss), None if ev is None else EvalRecord(**ev), state,
                      bool(head["stop_eval"]), bool(head["stop_snapshot"]))
