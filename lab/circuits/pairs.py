"""Clean and corrupted inputs for activation patching: typed by the user, or made from the run's task.

A patching experiment compares two inputs that differ in one place and get different answers (Meng et
al. 2022; Wang et al. 2022; Heimersheim and Nanda 2024, "How to use and interpret activation patching"):
- induction (Olsson et al. 2022): random distinct tokens, then the same tokens again, cut so the last token
  asks "what followed me before?"; the corruption changes the token that followed its earlier occurrence,
  so an induction head copies a different answer;
- a sequence task (reverse, sort, ...): its probe's prompt and separator; the corruption swaps two tokens
  of the prompt (for reverse, the first answer token is the prompt's last, so the swap changes it) or
  changes one (a swap leaves a sum, a sort or a parity as it was);
- any other language model: one earlier token replaced.
Where the task gives no natural place, the place is searched: every candidate corruption runs in one
batched forward and the one that moves the clean answer's logit most is kept. No gradio here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lab.config import ConfigError, RunConfig
from lab.tasks.batches import get_task
from lab.tasks.shapes import IGNORE_INDEX
from lab.views.analysis import generation_prompt, sampled_probe, tokens_text

MAX_CANDIDATES = 256  # corruptions tried in one batched forward when the task names no place


@dataclass(frozen=True)
class Pair:
    """Two inputs of one length (token ids, (1, T) each) and what the corruption changed, in words."""
    clean: Tensor
    corrupt: Tensor
    how: str


def _label(cfg: RunConfig, tok: int) -> str:
    return get_task(cfg.task.name).label(cfg.task, int(tok))


def induction_pair(cfg: RunConfig, seed: int = 0) -> Pair:
    """[A B C ... | A B ...]: `half` distinct random tokens, then the first half - 1 of them again; the
    answer is the token after the last one's earlier occurrence. The corruption replaces that token (at
    position half - 1) by one that does not occur, so copying gives another answer."""
    vocab = get_task(cfg.task.name).vocab_size(cfg.task)
    length = min(cfg.model.n_ctx, cfg.task.max_len - 1)  # the longest input it trained on
    half = max(3, min(16, (length + 1) // 2))
    rng = np.random.default_rng(seed)
    tokens = rng.choice(vocab, size=half + 1, replace=False)  # half distinct tokens and one spare
    first, spare = tokens[:half], int(tokens[half])
    clean = torch.tensor([[*first, *first[: half - 1]]], dtype=torch.long)  # (1, 2 * half - 1)
    corrupt = clean.clone()
    corrupt[0, half - 1] = spare
    how = (f"position {half - 1}: {_label(cfg, first[half - 1])} became {_label(cfg, spare)}. It is the token that "
           f"followed the earlier {_label(cfg, first[half - 2])}, the last token: an induction head copies it.")
    return Pair(clean, corrupt, how)


def _candidates(cfg: RunConfig, clean: Tensor, scored_from: int, seed: int) -> tuple[Tensor, list[str]]:
    """(n, T) corruptions of `clean` (1, T) and each one's description: for a sequence task, swaps of two
    different tokens before `scored_from` (its prompt) and single prompt tokens changed (a swap leaves a sum,
    a sort or a parity alone); for a language model, single tokens changed before the last."""
    task, tokens = get_task(cfg.task.name), clean[0].tolist()
    out: list[list[int]] = []
    words: list[str] = []
    rng = np.random.default_rng(seed)
    if not task.lm:
        for i in range(scored_from):
            for j in range(i + 1, scored_from):
                if tokens[i] != tokens[j]:
                    swapped = list(tokens)
                    swapped[i], swapped[j] = tokens[j], tokens[i]
                    out.append(swapped)
                    words.append(f"positions {i} and {j} swapped ({_label(cfg, tokens[i])} and "
                                 f"{_label(cfg, tokens[j])})")
    symbols = task.vocab_size(cfg.task) if task.lm else task.n_symbols(cfg.task)
    for p in range(len(tokens) - 1 if task.lm else scored_from):
        for r in rng.choice(symbols, size=min(8, symbols), replace=False):
            if int(r) != tokens[p]:
                changed = list(tokens)
                changed[p] = int(r)
                out.append(changed)
                words.append(f"position {p}: {_label(cfg, tokens[p])} became {_label(cfg, int(r))}")
    keep = np.random.default_rng(seed).permutation(len(out))[:MAX_CANDIDATES] if len(out) > MAX_CANDIDATES \
        else np.arange(len(out))
    return torch.tensor([out[k] for k in sorted(keep)], dtype=torch.long), [words[k] for k in sorted(keep)]


@torch.no_grad()
def task_pair(cfg: RunConfig, model: Any, seed: int = 0) -> Pair:
    """The run's task's own clean and corrupted inputs for the model (`model`: its weights at the step shown,
    used where the place to corrupt is searched)."""
    if cfg.model.arch != "decoder":
        raise ConfigError("model.arch", f"patching is measured on decoder-only models; this run is {cfg.model.arch!r}")
    if cfg.task.name == "induction":
        return induction_pair(cfg, seed)
    task, probe = get_task(cfg.task.name), sampled_probe(cfg)
    if task.lm:
        clean, scored_from = probe.batch.inp[:, : cfg.model.n_ctx], 0
    else:
        scored_from = int((probe.batch.tgt[0] != IGNORE_INDEX).nonzero()[0])  # the prompt's length
        clean = probe.batch.inp[:, : scored_from + 1]  # (1, prompt + SEP): the last position writes the answer
    candidates, words = _candidates(cfg, clean, scored_from, seed)
    if not len(candidates):
        return Pair(clean, clean.clone(), "no corruption found: every token of the input is the same")
    model.eval()
    answer = int(model(clean, None).logits[0, -1].argmax())
    logits = model(candidates, None).logits[:, -1]  # (n, vocab): each corruption's last position
    moved = logits.max(dim=-1).values - logits[:, answer]  # how far the clean answer fell below the top
    best = int(moved.argmax())
    return Pair(clean, candidates[best: best + 1], words[best])


def typed_pair(cfg: RunConfig, clean: Any, corrupt: Any) -> Pair:
    """Two typed inputs -> token ids (a sequence task's prompt gets its separator, as Generate reads it);
    ConfigError naming the box ("Clean input", "Corrupted input") for what cannot be read."""
    tokens = []
    for label, text in (("Clean input", clean), ("Corrupted input", corrupt)):
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(label, "is empty (type the symbols of an input, or press Make from task)")
        try:
            tokens.append(generation_prompt(cfg, text))
        except ConfigError as exc:
            raise ConfigError(label, str(exc).split(": ", 1)[-1]) from None
        if tokens[-1].shape[1] > cfg.model.n_ctx:
            raise ConfigError(label, f"is {tokens[-1].shape[1]} tokens long (allowed: at most the run's context "
                                     f"length, n_ctx={cfg.model.n_ctx})")
    if tokens[0].shape != tokens[1].shape:
        sep = 0 if get_task(cfg.task.name).lm else 1  # a sequence task's separator, added to both
        raise ConfigError("Corrupted input", f"has {tokens[1].shape[1] - sep} symbols and the clean input "
                                             f"{tokens[0].shape[1] - sep} (allowed: the same length, so each "
                                             "position can be patched)")
    differ = (tokens[0] != tokens[1]).nonzero()[:, 1].tolist()
    how = ("the two inputs are the same" if not differ else
           "changed at position" + ("s " if len(differ) > 1 else " ") + ", ".join(map(str, differ)))
    return Pair(tokens[0], tokens[1], how)


def pair_text(cfg: RunConfig, tokens: Tensor, drop_sep: bool = True) -> str:
    """Token ids (1, T) as the boxes show them; a sequence task's separator (added back on reading) left out."""
    ids = tokens[0].tolist()
    task = get_task(cfg.task.name)
    if drop_sep and not task.lm and ids and ids[-1] == task.sep(cfg.task):
        ids = ids[:-1]
    return tokens_text(cfg, ids)
