"""Head roles over training: for every attention head, how much of its attention goes where a known role
would put it, measured on the weights kept at each snapshot step, so a circuit can be seen forming.

The roles are those of Olsson et al. 2022 (In-context Learning and Induction Heads) and TransformerLens's
head detectors, measured on one probe: random tokens, then the same tokens again ([A B C D | A B C D]).
For a head's attention pattern a (queries x keys), each score is the mean, over the query positions where
the role is defined, of the attention mass on the keys the role reads:
- previous-token: key i - 1, queries 1..T-1;
- induction: the key after the query token's earlier occurrence (i - L + 1 for a repeat of length L),
  queries in the second half;
- duplicate-token: the query token's earlier occurrence (i - L), queries in the second half;
- first-token (an attention sink): key 0, queries 1..T-1;
- self: key i, queries 1..T-1 (query 0 can only attend to itself under the causal mask).
A score of 1 means the head puts all its attention there; uniform causal attention gives about 1/i.
No gradio here; torch only in `head_scores` (the forward pass).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from lab.records import DEC_SELF

SCORES = ("previous-token", "induction", "duplicate-token", "first-token", "self")
PROBES = 16  # repeated random sequences the scores average over
INDUCTION_FORMS = 0.4  # the induction preset's threshold: a head with a score above it reads as an induction head


def role_masks(half: int) -> dict[str, np.ndarray]:
    """For the repeated probe of 2 x `half` tokens: score -> (T, T) 0/1 mask of the keys each query's role
    reads (rows = queries), with only the query rows where the role is defined holding any 1."""
    t = 2 * half
    masks = {name: np.zeros((t, t), dtype=np.float32) for name in SCORES}
    for i in range(1, t):
        masks["previous-token"][i, i - 1] = 1
        masks["first-token"][i, 0] = 1
        masks["self"][i, i] = 1
    for i in range(half, t):
        masks["induction"][i, i - half + 1] = 1
        masks["duplicate-token"][i, i - half] = 1
    return masks


def scores_of(patterns: np.ndarray, half: int) -> dict[str, np.ndarray]:
    """Role scores of attention `patterns` (..., n_layers, n_heads, T, T) on repeated probes of 2 x `half`
    tokens: score -> (n_layers, n_heads), averaged over the leading (probe) axes and the defined queries."""
    if patterns.shape[-1] != 2 * half or patterns.shape[-2] != 2 * half:
        raise ValueError(f"patterns: expected {2 * half} x {2 * half} queries and keys, got {patterns.shape[-2:]}")
    p = patterns.reshape(-1, *patterns.shape[-4:])  # (probes, L, H, T, T)
    out = {}
    for name, mask in role_masks(half).items():
        rows = mask.sum(axis=1) > 0  # (T,) the queries where the role is defined
        mass = (p * mask).sum(axis=-1)  # (probes, L, H, T): attention on the role's keys, per query
        out[name] = mass[..., rows].mean(axis=(0, -1))  # (L, H)
    return out


def repeated_probe(vocab: int, half: int, n: int = PROBES, seed: int = 0) -> np.ndarray:
    """(n, 2 * half) token ids: `half` distinct random tokens (where the vocabulary allows), then the same again."""
    rng = np.random.default_rng(seed)
    first = np.stack([rng.choice(vocab, size=half, replace=vocab < half) for _ in range(n)])  # (n, half)
    return np.concatenate([first, first], axis=1)


@dataclass(frozen=True)
class HeadScores:
    """Role scores of one model's heads: score -> (n_layers, n_heads), at a step, on probes of 2 x `half`."""
    step: int
    half: int
    scores: dict[str, np.ndarray]

    def top(self, name: str) -> tuple[int, int, float]:
        """(layer, head, score) of the head that scores highest for `name`."""
        s = self.scores[name]
        layer, head = np.unravel_index(int(np.argmax(s)), s.shape)
        return int(layer), int(head), float(s[layer, head])


def probe_half(cfg: Any) -> int:
    """The repeat length: half of the longest input the model trained on (its task's probe, at max_len), at
    most 32 (at least 2). Not half of n_ctx: a context made room for longer evaluation lengths holds
    positions training never reached, whose learned encodings are still at their initialisation."""
    from lab.tasks.batches import probe

    trained = probe(cfg.task, cfg.model.arch).inp.shape[1]
    return max(2, min(32, trained // 2))


def head_scores(model: Any, cfg: Any, step: int, seed: int = 0) -> HeadScores:
    """Role scores of a decoder-only model's heads on PROBES repeated random sequences (lab.model.Transformer
    with its weights loaded; `cfg` its run config)."""
    import torch

    if cfg.model.arch != "decoder":
        raise ValueError(f"model.arch: head roles are measured on decoder-only models; this run is {cfg.model.arch!r}")
    half = probe_half(cfg)
    tokens = torch.from_numpy(repeated_probe(model.vocab_size, half, seed=seed))
    with torch.no_grad():
        out = model(tokens, None, need_weights=True)
    patterns = out.attention[DEC_SELF].float().numpy().transpose(1, 0, 2, 3, 4)  # (L, B, H, T, T) -> (B, L, H, T, T)
    return HeadScores(step, half, scores_of(patterns, half))


def crossing_step(series: list[HeadScores], name: str = "induction",
                  threshold: float = INDUCTION_FORMS) -> Optional[int]:
    """The first step at which some head's `name` score is above `threshold` (None if never)."""
    return next((s.step for s in series if s.top(name)[2] > threshold), None)


def steepest_fall(losses: list[tuple[int, float]]) -> Optional[tuple[int, int, float, float]]:
    """(from step, to step, loss then, loss after) of the interval between two evaluations where the loss fell
    the most per step; None with fewer than two evaluations or no fall."""
    pts = sorted((s, v) for s, v in losses if np.isfinite(v))
    best, out = 0.0, None
    for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
        rate = (v0 - v1) / max(s1 - s0, 1)
        if rate > best:
            best, out = rate, (s0, s1, v0, v1)
    return out


def scores_over_training(store: Any, run_id: str, seed: int = 0) -> list[HeadScores]:
    """Role scores at every snapshot step that kept weights, then at the final weights, in step order."""
    from lab.circuits import weights_over_training
    from lab.views.analysis import load_model

    cfg = store.config(run_id)
    return [head_scores(load_model(cfg, weights), cfg, at, seed) for at, weights in weights_over_training(store, run_id)]
