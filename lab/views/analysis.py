"""Pure functions behind the Inspect view: attention for a probe input, PE tables, PCA.

Inspection always loads a fresh model from a run's stored weights; it never touches a model
that a job is training. (Parameter counts live in lab/params.py.)
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from lab.config import ConfigError, RunConfig
from lab.model import Transformer
from lab.positional import build_positional
from lab.tasks.batches import IGNORE_INDEX, Batch, get_task, probe
from lab.records import CROSS, ENC_SELF, AttentionKind

PROBE_SOURCES = ("sampled", "typed")  # the probe input: the task's fixed sample, or one the user types
MAX_PROBE_CHARS = 1000  # characters of a typed probe (or a generation prompt) the app accepts


def load_model(cfg: RunConfig, state_dict: Optional[dict[str, torch.Tensor]] = None) -> Transformer:
    """A fresh CPU model in eval mode: stored weights if given, else the seeded initialisation."""
    from lab.trainer import build_model  # the trainer owns seeded initialisation

    model = build_model(cfg, "cpu")
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model.eval()


@dataclass(frozen=True)
class ProbeInput:
    batch: Batch  # one sample
    src_labels: list[str]  # encoder tokens (empty for decoder-only)
    dec_labels: list[str]  # decoder input tokens

    def axes(self, kind: AttentionKind) -> tuple[list[str], list[str]]:
        """The token labels of an attention pattern of `kind`: (queries, keys). Cross-attention's queries
        are the decoder's tokens and its keys the encoder's."""
        queries = self.src_labels if kind == ENC_SELF else self.dec_labels
        return queries, self.src_labels if kind in (ENC_SELF, CROSS) else self.dec_labels


def labelled(cfg: RunConfig, batch: Batch) -> ProbeInput:
    task = get_task(cfg.task.name)

    def names(t: torch.Tensor) -> list[str]:
        return [task.label(cfg.task, int(x)) for x in t[0]]

    return ProbeInput(batch, names(batch.src) if batch.src is not None else [], names(batch.inp))


def sampled_probe(cfg: RunConfig) -> ProbeInput:
    """The run's fixed probe input (the one whose attention the store snapshots)."""
    return labelled(cfg, probe(cfg.task, cfg.model.arch))


def probe_symbols(cfg: RunConfig) -> dict[str, int]:
    """The symbols a typed probe may use for this run's task (a language model's whole vocabulary):
    label -> token id."""
    task, tc = get_task(cfg.task.name), cfg.task
    n_sym = task.vocab_size(tc) if task.lm else task.prompt_symbols(tc)
    return {task.label(tc, t): t for t in range(n_sym)}


def allowed_symbols(cfg: RunConfig, shown: int = 12) -> str:
    """The first `shown` symbols of `probe_symbols`, for messages: "0, 1, 2, ..."."""
    names = list(probe_symbols(cfg))
    return ", ".join(names[:shown]) + (" ..." if len(names) > shown else "")


def parse_probe(cfg: RunConfig, text: str) -> ProbeInput:
    """A typed prompt ("3 1 2", "3,1,2" or "312") -> the task's input with the true answer.

    For language-model tasks the text is the whole sequence. Raises ConfigError("probe", ...).
    """
    task, tc = get_task(cfg.task.name), cfg.task
    as_typed = task.encode_prompt(tc, text) if text else None  # a text task reads characters, spaces included
    if as_typed is not None:
        if not as_typed:
            raise ConfigError("probe", "is empty (type some of the text's characters)")
        tokens = torch.tensor([as_typed])  # (1, n)
        if tokens.shape[1] > cfg.model.n_ctx:
            raise ConfigError("probe", f"is {tokens.shape[1]} characters long (allowed: at most the run's "
                                       f"context length, n_ctx={cfg.model.n_ctx})")
        return labelled(cfg, Batch(inp=tokens, tgt=typed_lm_targets(task.name, tokens)))
    parts = [p for p in re.split(r"[\s,]+", text.strip()) if p]
    if len(parts) == 1 and len(parts[0]) > 1:
        parts = list(parts[0])  # "312" -> "3", "1", "2"
    names = probe_symbols(cfg)
    allowed = allowed_symbols(cfg)
    if not parts:
        raise ConfigError("probe", f"is empty (type symbols of task {tc.name!r}: {allowed})")
    bad = [p for p in parts if p not in names]
    if bad:
        raise ConfigError("probe", f"{bad[0]!r} is not a symbol of task {tc.name!r} (allowed: {allowed})")
    tokens = torch.tensor([[names[p] for p in parts]])  # (1, n)
    if task.lm:
        batch = Batch(inp=tokens, tgt=typed_lm_targets(task.name, tokens))
    else:
        wrong = task.check_prompt(tc, tokens[0].tolist())
        if wrong:
            raise ConfigError("probe", wrong)
        batch = task.layout(tc, cfg.model.arch, tokens, task.solve(tc, tokens))
    longest = max(batch.inp.shape[1], batch.src.shape[1] if batch.src is not None else 0)
    if longest > cfg.model.n_ctx:
        raise ConfigError("probe", f"is {longest} tokens long (allowed: at most the run's context length, "
                                   f"n_ctx={cfg.model.n_ctx})")
    return labelled(cfg, batch)


def generation_prompt(cfg: RunConfig, text: str) -> torch.Tensor:
    """A typed prompt for free generation -> (1, T) tokens: a text task's characters as typed (any length:
    generation crops its context), a language model's sequence, or a sequence-to-sequence task's input and
    its separator (typed or not). ConfigError("probe", ...) as `parse_probe`."""
    task, tc = get_task(cfg.task.name), cfg.task
    typed = task.encode_prompt(tc, text) if text else None
    if typed:
        return torch.tensor([typed])  # (1, T)
    if not task.lm:
        sep = task.label(tc, task.sep(tc))
        text = text.rstrip()
        text = text[: -len(sep)] if text.endswith(sep) else text  # "4,4,1|": the separator is added once
    batch = parse_probe(cfg, text).batch
    if task.lm:
        return batch.inp
    scored = (batch.tgt[0] != IGNORE_INDEX).nonzero()
    return batch.inp[:, : int(scored[0]) + 1]  # (1, prompt + SEP)


def tokens_text(cfg: RunConfig, tokens: list[int]) -> str:
    """Tokens as a reader writes them: a text task's characters as they are, else labels with spaces."""
    task = get_task(cfg.task.name)
    text = task.decode(cfg.task, tokens)
    return text if text is not None else " ".join(task.label(cfg.task, t) for t in tokens)


def typed_lm_targets(task_name: str, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token targets of a typed language-model sequence (1, n): the typed next token, except at the
    last position (unknown). For induction only the positions a repeat makes predictable are scored: the
    current token occurred before and the token after it then is the one typed next (Olsson et al. 2022)."""
    seq = tokens[0].tolist()
    tgt = [IGNORE_INDEX] * len(seq)
    for t in range(len(seq) - 1):
        if task_name != "induction" or any(seq[j] == seq[t] and seq[j + 1] == seq[t + 1] for j in range(t)):
            tgt[t] = seq[t + 1]
    return torch.tensor([tgt])  # (1, n)


@torch.no_grad()
def attention(model: Transformer, batch: Batch) -> dict[str, np.ndarray]:
    """Attention patterns of the first sample: kind -> (n_layers, n_heads, Tq, Tk)."""
    out = model(batch.inp, batch.src, need_weights=True)
    return {k: v[:, 0].float().numpy() for k, v in out.attention.items()}


# ---- positional encodings --------------------------------------------------------------
@dataclass(frozen=True)
class PositionalView:
    pos: str
    table: Optional[np.ndarray]  # (n, d_model) vectors, or None
    pca: Optional[np.ndarray]  # (n, 2) coordinates
    explained: Optional[np.ndarray]  # (2,) explained variance ratio
    similarity: Optional[np.ndarray]  # (n, n) cosine similarity of position vectors
    relative: Optional[np.ndarray]  # (H, n, n) pattern imposed by RoPE / ALiBi
    note: Optional[str]  # why there is no table, where there is none


def principal_components(x: np.ndarray, k: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """PCA of the rows of `x` (n, d) by NumPy's SVD of the centred rows (Pearson 1901; the SVD route of
    scikit-learn's PCA, without importing scikit-learn into every app process): the (n, k) coordinates on the first `k`
    components and their (k,) shares of the variance. Each component's sign makes its largest-magnitude
    loading positive, so the same table always draws the same picture."""
    centred = x - x.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)  # centred = u @ diag(s) @ vt; vt: (min(n, d), d)
    rows = np.arange(vt.shape[0])
    vt = vt * np.sign(vt[rows, np.abs(vt).argmax(axis=1)])[:, None]
    var = s ** 2
    share = var / var.sum() if var.sum() > 0 else np.zeros_like(var)
    return centred @ vt[:k].T, share[:k]  # (n, k), (k,)


def positional_view(cfg: RunConfig, state_dict: Optional[dict[str, torch.Tensor]] = None,
                    n: Optional[int] = None) -> PositionalView:
    """Everything the PCA panel shows for one run, over positions 0..n-1 (default: longest sequence).

    Trained positions come from `state_dict` (a model's, keys "pos.*"); without it, from the
    run's seeded initialisation, so the untrained view is the table the run starts from."""
    task = get_task(cfg.task.name)
    n = n or min(cfg.model.n_ctx, task.max_seq_len(cfg.task, cfg.model.arch))
    with torch.random.fork_rng(devices=[]):  # a learned table's throwaway init leaves the global RNG alone
        pe = build_positional(cfg.model)
    if state_dict is None and any(True for _ in pe.parameters()):
        state_dict = load_model(cfg).state_dict()  # the run's seeded initialisation, as at step 0
    if state_dict is not None:
        pe.load_state_dict({k[4:]: v for k, v in state_dict.items() if k.startswith("pos.")})
    table = pe.table(n)
    rel = pe.relative_pattern(n)
    if table is None:
        return PositionalView(cfg.model.pos, None, None, None, None,
                              None if rel is None else rel.numpy(), pe.table_note)
    tab = table.detach().double().numpy()
    k = min(2, tab.shape[0], tab.shape[1])
    coords, explained = principal_components(tab, k)
    unit = tab / np.maximum(np.linalg.norm(tab, axis=1, keepdims=True), 1e-12)
    return PositionalView(cfg.model.pos, tab, coords, explained, unit @ unit.T,
                          None if rel is None else rel.numpy(), None)
