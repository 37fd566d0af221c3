"""The generator every toy task's batches come from: `Task`, which holds a task's shape (lab/tasks/shapes.py)
and turns a prompt and its answer into a `Batch` (`prompt SEP answer` for a decoder, scored on the answer;
the prompt in the encoder for an encoder-decoder), and `Batch` itself. The tasks' own generators subclass it:
lab/tasks/batches.py (the lab's tasks and the registry of all of them) and lab/tasks/chomsky.py (the other
tasks of Delétang et al. 2023).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch
from torch import Tensor

import lab.tasks.shapes as shapes
from lab.config import TaskConfig
from lab.tasks.shapes import IGNORE_INDEX

PROBE_SEED = 7


def draw_length(cfg: TaskConfig, gen: torch.Generator) -> int:
    """A training batch's task length, uniform over [min_len, max_len] (a sync on a GPU generator)."""
    return int(torch.randint(cfg.min_len, cfg.max_len + 1, (1,), generator=gen, device=gen.device))


@dataclass(frozen=True)
class Batch:
    inp: Tensor  # (B, T) decoder input tokens
    tgt: Tensor  # (B, T) next-token targets, IGNORE_INDEX where not scored
    src: Optional[Tensor] = None  # (B, S) encoder input (encoder-decoder only)

    def to(self, device: torch.device | str) -> "Batch":
        src = None if self.src is None else self.src.to(device, non_blocking=True)
        return Batch(self.inp.to(device, non_blocking=True), self.tgt.to(device, non_blocking=True), src)


class Task:
    """How to generate a task's batches; subclasses define the prompt and its answer. A subclass names its
    task (`class Copy(Task, task="copy")`); an instance holds the task's shape (lab/tasks/shapes.py), whose
    sizes and rules (`vocab_size`, `sep`, `lengths`, `lm`, ...) read through the generator."""

    generators: ClassVar[dict[str, type["Task"]]] = {}  # task name -> its generator class

    def __init_subclass__(cls, task: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if task:
            if task in Task.generators:
                first = Task.generators[task].__name__
                raise TypeError(f"task {task!r} has two generators: {first}, {cls.__name__}")
            Task.generators[task] = cls

    def __init__(self, shape: shapes.TaskShape) -> None:
        self.shape = shape

    def __getattr__(self, attr: str) -> Any:
        """The shape's attributes and methods, for what the generator does not define itself."""
        if attr.startswith("__") or attr == "shape":  # copying and pickling look these up before __init__
            raise AttributeError(attr)
        return getattr(self.shape, attr)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.shape.name!r})"

    def gen_prompt(self, cfg: TaskConfig, length: int, n: int, gen: torch.Generator, split: str) -> Tensor:
        return torch.randint(0, cfg.n_symbols, (n, length), generator=gen, device=gen.device)

    def solve(self, cfg: TaskConfig, prompt: Tensor) -> Tensor:
        raise NotImplementedError

    def predictable(self, tgt: Tensor) -> Optional[Tensor]:
        """(B, T) mask of the scored positions a perfect model can get right, for tasks where some scored
        positions cannot be predicted (induction); None where every scored position can be."""
        return None

    def batch(self, cfg: TaskConfig, arch: str, n: int, gen: torch.Generator,
              length: Optional[int] = None, split: str = "train") -> Batch:
        length = draw_length(cfg, gen) if length is None else length
        prompt = self.gen_prompt(cfg, length, n, gen, split)  # (n, P)
        return self.layout(cfg, arch, prompt, self.solve(cfg, prompt))

    def probe_batch(self, cfg: TaskConfig, arch: str) -> Batch:
        """The fixed probe input: one held-out sample at max_len, from its own seed."""
        gen = torch.Generator().manual_seed(PROBE_SEED)
        return self.batch(cfg, arch, 1, gen, cfg.max_len, "eval")

    def scored(self, cfg: TaskConfig, answer: Tensor) -> Optional[Tensor]:
        """(n, A) mask of the answer positions the loss and the metrics score, for tasks whose answers end
        early and are padded (their padding is not scored); None where every answer position is."""
        return None

    def layout(self, cfg: TaskConfig, arch: str, prompt: Tensor, answer: Tensor) -> Batch:
        n, p = prompt.shape
        sep = torch.full((n, 1), self.shape.sep(cfg), dtype=torch.long, device=prompt.device)
        scored = self.scored(cfg, answer)  # (n, A) or None
        if arch == "encoder-decoder":
            tgt = answer.clone() if scored is None else answer.masked_fill(~scored, IGNORE_INDEX)
            return Batch(inp=torch.cat([sep, answer[:, :-1]], 1), tgt=tgt, src=prompt)
        full = torch.cat([prompt, sep, answer], 1)  # (n, P + 1 + A)
        tgt = full[:, 1:].clone()
        tgt[:, :p] = IGNORE_INDEX  # score the answer only
        if scored is not None:
            tgt[:, p:] = tgt[:, p:].masked_fill(~scored, IGNORE_INDEX)
        return Batch(inp=full[:, :-1].contiguous(), tgt=tgt)
