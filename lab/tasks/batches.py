"""Toy sequence tasks: a registry of seeded generators of (input, target) batches.

A task is declared once, by its shape in lab/tasks/shapes.py (name, alphabet, lengths, layout rules; the
registry SHAPES lists every task). Here each task gets the torch code that generates its prompts and
answers: a `Task` subclass names the task it generates (`class Copy(Task, task="copy")`) and holds its
shape (`Task.shape`); TASKS pairs every registered shape with its generator, and importing this module
fails if a shape has none or a generator names no shape. A task's sizes read through its generator too:
`get_task(name).vocab_size(cfg)` is its shape's.

A decoder-only model reads `prompt SEP answer` and is scored on the answer positions only (minGPT's
ignore_index convention); an encoder-decoder reads the prompt in the encoder and `SEP answer[:-1]` in the
decoder. Language-model tasks (induction, text) produce one sequence and a mask of scored positions.
Every batch uses a single length, so no padding mask is ever needed; the few answers that end early (stack
manipulation, binary addition) are padded to their length's size, and the padding is not scored. A batch is made
on its generator's device (a CUDA generator makes it on the GPU: no copy per training step).
Exact-match under teacher forcing equals greedy decoding being right: every step's argmax is the answer.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

import lab.tasks.chomsky  # noqa: F401 - registers the other tasks of Delétang et al. 2023
import lab.tasks.shapes as shapes
import lab.textdata as textdata
from lab.config import TaskConfig
from lab.tasks.generator import PROBE_SEED, Batch, Task, draw_length  # noqa: F401 - the generators' base, re-exported
from lab.tasks.shapes import IGNORE_INDEX

EVAL_SEED = 1_000_003  # held-out batches never share the training generator's stream
EVAL_SPLITS = {"train": 2, "eval": 0, "ood": 1}  # split -> offset of its fixed batches' seed from EVAL_SEED


class Copy(Task, task="copy"):
    def solve(self, cfg, prompt):
        return prompt.clone()


class Reverse(Task, task="reverse"):
    def solve(self, cfg, prompt):
        return prompt.flip(1)


class Sort(Task, task="sort"):
    def gen_prompt(self, cfg, length, n, gen, split):
        dev = gen.device
        x = torch.randint(0, cfg.n_symbols, (n, length), generator=gen, device=dev)
        # minGPT's demo: half the samples have many repeats, which make sorting harder. At least two symbols
        # wide: a one-symbol window (3 symbols) made every such sample constant ("1 1 1 1 1 1"), half of
        # each batch with nothing to sort, and hello_sort took 2.2x the steps (benchmarks/RESULTS.md)
        few = min(cfg.n_symbols, max(2, cfg.n_symbols // 3))
        base = torch.randint(0, cfg.n_symbols - few + 1, (n, 1), generator=gen, device=dev)
        rep = base + torch.randint(0, few, (n, length), generator=gen, device=dev)
        use_rep = torch.rand(n, 1, generator=gen, device=dev) < 0.5
        return torch.where(use_rep, rep, x)

    def solve(self, cfg, prompt):
        return prompt.sort(dim=1).values


class Addition(Task, task="addition"):
    """Two random `length`-digit numbers `a + b`, most significant digit first, and their sum's digits
    least significant first (minGPT's adder)."""

    def gen_prompt(self, cfg, length, n, gen, split):
        a = torch.randint(0, 10, (n, length), generator=gen, device=gen.device)
        b = torch.randint(0, 10, (n, length), generator=gen, device=gen.device)
        return torch.cat([a, torch.full((n, 1), 10, device=gen.device), b], 1)  # (n, 2L + 1), most significant first

    def solve(self, cfg, prompt):
        length = (prompt.shape[1] - 1) // 2
        a, b = prompt[:, :length].flip(1), prompt[:, length + 1:].flip(1)  # least significant first
        out, carry = [], torch.zeros(prompt.shape[0], dtype=torch.long, device=prompt.device)
        for i in range(length):
            s = a[:, i] + b[:, i] + carry
            out.append(s % 10)
            carry = s // 10
        return torch.stack(out + [carry], 1)  # (n, L + 1)


class ModularAddition(Task, task="modular_addition"):
    """Prompts `a b` drawn from one side of a fixed split of all pairs (Power et al. 2022, grokking).

    The (a, b) pairs are split once, with a fixed seed, into train_fraction for training and the
    rest held out, so test accuracy measures generalisation to unseen pairs.
    """

    def pairs(self, cfg: TaskConfig, split: str, device: torch.device = torch.device("cpu")) -> Tensor:
        return _split_pairs(cfg, split, device)

    def gen_prompt(self, cfg, length, n, gen, split):
        pairs = self.pairs(cfg, "train" if split == "train" else "test", gen.device)
        return pairs[torch.randint(0, pairs.shape[0], (n,), generator=gen, device=gen.device)]

    def solve(self, cfg, prompt):
        return (prompt.sum(1, keepdim=True)) % cfg.modulus


@functools.lru_cache(maxsize=16)  # a module-level cache: the task object is a singleton, its config hashable
def _split_pairs(cfg: TaskConfig, split: str, device: torch.device) -> Tensor:
    """ModularAddition's (a, b) pairs of one split, the same for every run of the same modulus and fraction."""
    p = cfg.modulus
    perm = torch.randperm(p * p, generator=torch.Generator().manual_seed(0))
    # at least one pair on each side: a small modulus with a high fraction must still hold one out
    n_train = min(p * p - 1, max(1, int(round(cfg.train_fraction * p * p))))
    idx = perm[:n_train] if split == "train" else perm[n_train:]
    return torch.stack([idx // p, idx % p], 1).to(device)  # (N, 2); copied to a GPU once


class Parity(Task, task="parity"):
    def gen_prompt(self, cfg, length, n, gen, split):
        return torch.randint(0, 2, (n, length), generator=gen, device=gen.device)

    def solve(self, cfg, prompt):
        return prompt.sum(1, keepdim=True) % 2


class Histogram(Task, task="histogram"):
    """Random symbols; each one's answer is its count c in the input, as the token n_symbols + c - 1
    (Weiss et al. 2021, RASP)."""

    def solve(self, cfg, prompt):
        counts = (prompt[:, :, None] == prompt[:, None, :]).sum(-1)  # (n, L)
        return cfg.n_symbols + counts - 1


class Induction(Task, task="induction"):
    """Random tokens, then a random segment repeated periodically from a random offset.

    The loss covers the repeats only; predicting them needs an induction head: find the
    previous occurrence of the current token and copy what followed it (Olsson et al. 2022).
    The offset is random because a fixed one lets a single layer solve the task by position.
    """

    def batch(self, cfg, arch, n, gen, length=None, split="train"):
        length = draw_length(cfg, gen) if length is None else length
        seq, scored = induction_sequences(cfg.n_symbols, length, n, gen)
        tgt = seq[:, 1:].masked_fill(~scored[:, 1:], IGNORE_INDEX)
        return Batch(inp=seq[:, :-1].contiguous(), tgt=tgt)

    def predictable(self, tgt: Tensor) -> Tensor:
        """The repeated part after its first token: the first repeated token follows the last token of the
        segment's first occurrence, which nothing before it predicts (a guess, 1 / n_symbols at best);
        every later one is its earlier occurrence's successor, which an induction head copies."""
        scored = tgt != IGNORE_INDEX  # (B, T)
        return scored & (scored.cumsum(1) > 1)


def induction_sequences(vocab: int, length: int, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """(seq, scored): (n, length) tokens and a mask of positions predictable from a repeat."""
    dev = gen.device
    seq = torch.randint(0, vocab, (n, length), generator=gen, device=dev)
    hi = max(2, length // 2)
    period = torch.randint(2, hi + 1, (n, 1), generator=gen, device=dev)  # (n, 1)
    start = (torch.rand(n, 1, generator=gen, device=dev) * (length - 2 * period + 1).clamp(min=1)).long()
    pos = torch.arange(length, device=dev)[None, :]  # (1, length)
    src = start + (pos - start) % period  # where each repeated position copies from
    repeated = pos >= start + period
    seq = torch.where(repeated, seq.gather(1, src.clamp(max=length - 1)), seq)
    return seq, repeated


class Text(Task, task="text"):
    """A character-level language model (Karpathy's char-rnn; minGPT's projects/chargpt): random windows of
    `length` characters, every position scored on the next character. Training windows come from the
    first 90% of the text, held-out ones from the last 10% (lab/textdata.py)."""

    def batch(self, cfg, arch, n, gen, length=None, split="train"):
        length = draw_length(cfg, gen) if length is None else length
        data = text_tokens(textdata.text_of(cfg.text), "train" if split == "train" else "eval", gen.device)
        starts = torch.randint(0, data.numel() - length + 1, (n, 1), generator=gen, device=gen.device)  # (n, 1)
        seq = data[starts + torch.arange(length, device=gen.device)]  # (n, length)
        return Batch(inp=seq[:, :-1].contiguous(), tgt=seq[:, 1:].contiguous())

    def probe_batch(self, cfg, arch):
        """The start of the held-out text, from its first line that leaves max_len characters (else its
        first character): the same window for every run on this text and length."""
        text = textdata.text_of(cfg.text)
        held = text[textdata.split_at(text):]
        start = next((i + 1 for i, c in enumerate(held) if c == "\n" and i + 1 + cfg.max_len <= len(held)), 0)
        seq = text_tokens(text, "eval", torch.device("cpu"))[None, start:start + cfg.max_len]  # (1, max_len)
        return Batch(inp=seq[:, :-1].contiguous(), tgt=seq[:, 1:].contiguous())


@functools.lru_cache(maxsize=8)
def text_tokens(text: str, split: str, device: torch.device) -> Tensor:
    """The token ids of a text's training part ("train") or held-out part ("eval"), as one (N,) tensor on
    `device` (cached: made once per text, split and device, not per batch)."""
    ids = torch.tensor(textdata.encode(text, textdata.vocabulary(text)), dtype=torch.long)
    cut = textdata.split_at(text)
    return (ids[:cut] if split == "train" else ids[cut:]).to(device)


def _registry() -> dict[str, Task]:
    """Every registered task's generator, holding its shape, in the registry's order."""
    unpaired = set(shapes.SHAPES) ^ set(Task.generators)
    if unpaired:
        raise TypeError(f"tasks without both a shape and a generator: {', '.join(sorted(unpaired))}")
    return {name: Task.generators[name](shape) for name, shape in shapes.SHAPES.items()}


TASKS: dict[str, Task] = _registry()


def get_task(name: str) -> Task:
    return TASKS[name]


def eval_batches(cfg: TaskConfig, arch: str, split: str, n_samples: int, batch_size: int = 256) -> list[Batch]:
    """Deterministic evaluation batches spread evenly over the split's lengths: held-out ones ("eval" at
    the training lengths, "ood" beyond), or "train": samples of the training distribution at the training
    lengths (modular addition's training pairs, the text's training 90%; for the generated tasks freshly
    drawn sequences, the distribution training draws from, so they measure what held-out ones do)."""
    task = get_task(cfg.name)
    lengths = task.lengths(cfg, split)
    if not lengths:
        return []
    gen = torch.Generator().manual_seed(EVAL_SEED + EVAL_SPLITS[split])
    per_len = max(1, -(-n_samples // len(lengths)))
    out = []
    for length in lengths:
        for start in range(0, per_len, batch_size):
            out.append(task.batch(cfg, arch, min(batch_size, per_len - start), gen, length,
                                  "train" if split == "train" else "eval"))
    return out


def probe(cfg: TaskConfig, arch: str) -> Batch:
    """The fixed probe input whose attention the store keeps through training: one sample at max_len."""
    return get_task(cfg.name).probe_batch(cfg, arch)
