"""Positional encodings: one class per technique, one registry keyed by the config literal.

A position can enter the model in three places, and each class overrides only its own:
  - `embed`:     added to the residual stream after the token embedding (sinusoidal, learned)
  - `rotate`:    applied to queries and keys inside self-attention (RoPE)
  - `attn_bias`: added to attention scores inside self-attention (ALiBi)
The model calls every hook unconditionally; there is no `if pos == "rope"` outside this file.
Cross-attention (encoder-decoder) gets no positional hooks: its queries and keys come from
different sequences, so only the absolute encodings of each stream carry position there.

Each hook reads the position ids 0..T-1 unless it is given others (`positions`, a (T,) tensor): `Placed`
reads an encoding at other ids for one forward pass, which is how training with randomized positions
(Ruoss et al. 2023: an ordered random subset of 0..L-1, so a model meets position numbers beyond its
training lengths) and the shuffled-positions intervention (lab/interventions.py) move positions.

For the PCA view each class offers `table(n)` (per-position vectors, where they exist) and
`relative_pattern(n)` (what the relative encodings impose instead).
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch
import torch.nn as nn
from torch import Tensor

from lab.config import ModelConfig

# Token embeddings and learned positions start at the RMS of the sinusoidal table (1/sqrt 2),
# so every absolute encoding enters the residual stream at the same scale as the tokens.
EMBED_STD = 1 / math.sqrt(2)


class PositionalEncoding(nn.Module):
    """Base class: every hook is a no-op. Also the "none" (NoPE) encoding."""

    name = "none"
    adds_vectors = False  # whether `embed` adds a vector per position (TransformerLens's hook_pos_embed)
    explanation = "No positional information: attention is permutation-invariant except for the causal mask."
    # Why the PCA view has no table to project (None where a table exists).
    table_note: Optional[str] = (
        "NoPE adds nothing: a causal decoder can only infer positions from the mask itself "
        "(how many tokens it can see), so there is no table and no pattern to draw."
    )

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def embed(self, x: Tensor, positions: Optional[Tensor] = None) -> Tensor:
        """x: (B, T, d_model) token embeddings -> the residual stream input; `positions`: (T,) ids to read
        instead of 0..T-1."""
        return x

    def rotate(self, q: Tensor, k: Tensor, positions: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        """q: (B, H, Tq, d_head), k: (B, H, Tk, d_head); `positions`: (T,) ids of both (self-attention)."""
        return q, k

    def attn_bias(self, t_q: int, t_k: int, causal: bool, device: torch.device,
                  positions: Optional[Tensor] = None) -> Optional[Tensor]:
        """Additive score bias of shape (H, Tq, Tk), with -inf where masked; None = no bias."""
        return None

    def rows(self) -> int:
        """How many position ids the encoding's tables hold without computing more (n_ctx, or the
        randomized range when it is longer)."""
        return max(self.cfg.n_ctx, self.cfg.pos_range)

    def table(self, n: int) -> Optional[Tensor]:
        """(n, d_model) vectors added at positions 0..n-1, or None where there are none."""
        return None

    def relative_pattern(self, n: int) -> Optional[Tensor]:
        """(H, n, n) pattern the encoding imposes between query i and key j, or None."""
        return None


class Sinusoidal(PositionalEncoding):
    """Fixed sine/cosine table (Vaswani et al. 2017, "Attention Is All You Need", sec. 3.5).

    PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)), interleaved.
    Positions beyond n_ctx are computed on the fly, so longer inputs still get a value.
    """

    name = "sinusoidal"
    adds_vectors = True
    explanation = "A fixed sine/cosine table added to the embeddings; PE[p]·PE[p+k] depends on k only."
    table_note = None

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.register_buffer("pe", sinusoidal_table(self.rows(), cfg.d_model), persistent=False)

    def embed(self, x: Tensor, positions: Optional[Tensor] = None) -> Tensor:
        if positions is None:
            return x + self.table(x.shape[1]).to(x.dtype)  # (T, d) broadcasts over batch
        return x + self.table(int(positions.max()) + 1)[positions].to(x.dtype)  # (T, d): the rows of those ids

    def table(self, n: int) -> Tensor:
        if n <= self.pe.shape[0]:
            return self.pe[:n]
        return sinusoidal_table(n, self.cfg.d_model).to(self.pe.device)


def sinusoidal_table(n: int, d: int) -> Tensor:
    pos = torch.arange(n, dtype=torch.float64)[:, None]  # (n, 1)
    inv = torch.pow(10000.0, -torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv)
    pe[:, 1::2] = torch.cos(pos * inv)
    return pe.float()


class Learned(PositionalEncoding):
    """A trained vector per absolute position (GPT-2, Radford et al. 2019; BERT).

    Positions never seen in training keep their random initial vectors, which is why
    this encoding rarely generalises beyond the training length.
    """

    name = "learned"
    adds_vectors = True
    explanation = "One trained vector per position, added to the embeddings; limited to n_ctx positions."
    table_note = None

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        # n_ctx rows; with randomized positions, one per id of their range (Ruoss et al. 2023's table of L)
        self.weight = nn.Parameter(torch.randn(self.rows(), cfg.d_model) * EMBED_STD)

    def embed(self, x: Tensor, positions: Optional[Tensor] = None) -> Tensor:
        t = x.shape[1]
        last = t if positions is None else int(positions.max()) + 1
        if last > self.weight.shape[0]:
            raise ValueError(f"sequence length {last} exceeds model.n_ctx={self.weight.shape[0]} for 'learned'")
        return x + (self.weight[:t] if positions is None else self.weight[positions])  # (T, d)

    def table(self, n: int) -> Tensor:
        return self.weight[: min(n, self.weight.shape[0])].detach()


class Rotary(PositionalEncoding):
    """Rotary position embedding (Su et al. 2021, RoFormer, eqs. 12-16).

    theta_i = 10000^(-2(i-1)/d_head); the pair (x_i, x_{i+d/2}) of each query and key is rotated
    by m * theta_i at position m, so q_m·k_n depends on m - n only. We use the split-halves
    layout (GPT-NeoX) rather than RoFormer's interleaved pairs: equally correct, not
    weight-compatible. Values are not rotated. cos/sin tables are cached up to n_ctx.
    """

    name = "rope"
    explanation = "Rotates queries and keys by an angle proportional to position: scores depend on offsets only."
    table_note = (
        "RoPE adds no vector to the residual stream: it rotates each query and key by an angle "
        "proportional to its position, so there is no table to project. Shown instead: how a query "
        "at position i scores a key at j when both carry the same content, which depends on i - j only."
    )

    def __init__(self, cfg: ModelConfig, base: float = 10000.0) -> None:
        super().__init__(cfg)
        self.base = base
        cos, sin = self._tables(self.rows())
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.register_buffer("sin_signed", _signed(sin), persistent=False)

    def _tables(self, n: int) -> tuple[Tensor, Tensor]:
        dh = self.cfg.d_head
        inv = self.base ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)  # (dh/2,)
        ang = torch.arange(n, dtype=torch.float64)[:, None] * inv  # (n, dh/2)
        ang = torch.cat([ang, ang], dim=-1)  # (n, dh): the same angle for both halves of a pair
        return ang.cos().float(), ang.sin().float()

    def rotate(self, q: Tensor, k: Tensor, positions: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        n = max(q.shape[-2], k.shape[-2]) if positions is None else int(positions.max()) + 1
        if n <= self.cos.shape[0]:
            cos, sin = self.cos, self.sin_signed
        else:
            cos, sin = (t.to(q.device) for t in self._tables(n))
            sin = _signed(sin)
        if positions is not None:  # (T, dh): the angles of those ids, in their order
            cos, sin = cos[positions], sin[positions]
        return _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)

    def relative_pattern(self, n: int) -> Tensor:
        """Score of a fixed all-ones query/key pair per head offset: cos-sum over the frequencies."""
        dh = self.cfg.d_head
        inv = self.base ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
        rel = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # (n, n): i - j
        pat = torch.cos(rel[..., None].double() * inv).mean(-1).float()  # (n, n)
        return pat.expand(self.cfg.n_heads, n, n).clone()


def _signed(sin: Tensor) -> Tensor:
    """sin with its first half negated, so that rotate_half(x) * sin == roll(x, dh/2) * _signed(sin)."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def _apply_rotary(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin, with rotate_half(x) = [-x2, x1] written as a roll (one op
    forward and backward instead of two slices, a negation and a cat)."""
    t = x.shape[-2]
    half = x.shape[-1] // 2
    return x * cos[:t].to(x.dtype) + x.roll(half, dims=-1) * sin_signed[:t].to(x.dtype)


class ALiBi(PositionalEncoding):
    """Attention with Linear Biases (Press et al. 2021, "Train Short, Test Long").

    No position vectors: the score of query i and key j gets -m_h * |i - j| (for causal
    attention j <= i, so this is the paper's -m_h * (i - j)). Slopes follow the official code,
    including its rule for head counts that are not powers of two. "alibi" means ALiBi only:
    no absolute encoding hides underneath.
    """

    name = "alibi"
    explanation = "Adds -slope·distance to attention scores: a per-head recency bias, no position vectors."
    table_note = (
        "ALiBi adds no vector to the residual stream: it subtracts slope x distance from each attention "
        "score, so there is no table to project. Shown instead: the bias it adds, one slope per head."
    )

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(cfg.n_heads)), persistent=False)
        self._cache: dict[tuple, Tensor] = {}

    def attn_bias(self, t_q: int, t_k: int, causal: bool, device: torch.device,
                  positions: Optional[Tensor] = None) -> Tensor:
        if positions is not None:  # -m_h |p_i - p_j| between those ids (drawn anew each step: not cached)
            dist = (positions[:, None] - positions[None, :]).abs().float()  # (T, T)
            bias = -self.slopes.to(device)[:, None, None] * dist.to(device)  # (H, T, T)
            if causal:
                bias = bias.masked_fill(torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(1), float("-inf"))
            return bias
        key = (t_q, t_k, causal, str(device))
        bias = self._cache.get(key)
        if bias is None:
            bias = self.relative_pattern_rect(t_q, t_k).to(device)  # (H, Tq, Tk)
            if causal:
                future = torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(1)
                bias = bias.masked_fill(future, float("-inf"))
            if len(self._cache) > 16:
                self._cache.clear()
            self._cache[key] = bias
        return bias

    def relative_pattern_rect(self, t_q: int, t_k: int) -> Tensor:
        dist = (torch.arange(t_q)[:, None] - torch.arange(t_k)[None, :]).abs().float()  # (Tq, Tk)
        return -self.slopes.cpu()[:, None, None] * dist  # (H, Tq, Tk)

    def relative_pattern(self, n: int) -> Tensor:
        return self.relative_pattern_rect(n, n)


def alibi_slopes(n_heads: int) -> list[float]:
    """Head slopes of ALiBi, as in the official implementation (ofirpress/attention_with_linear_biases)."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]


class Placed:
    """An encoding read at other position ids than 0..T-1 for one forward pass: `ids(t)` gives the (t,) ids
    of a sequence of t tokens, drawn once per length and pass, so the embedding and every layer read the
    same ones. Self-attention only: where queries and keys differ in length (cross-attention gets no
    positional hooks anyway) the encoding's own ids apply.

    - Randomized positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length Generalization
      of Transformers", sec. 3): in training, ids are an ordered random subset of 0..L-1 (`random_ids`),
      so every id up to L is trained and a longer test sequence reads ids the model has met; at test the
      real positions 0..T-1 apply.
    - The shuffled-positions intervention (lab/interventions.py): token i reads position order[i].
    """

    def __init__(self, pe: PositionalEncoding, ids: Callable[[int], Tensor]) -> None:
        self.pe, self._ids, self._drawn = pe, ids, {}

    def ids(self, t: int, device: torch.device) -> Tensor:
        if t not in self._drawn:
            self._drawn[t] = self._ids(t).to(device)
        return self._drawn[t]

    def embed(self, x: Tensor) -> Tensor:
        return self.pe.embed(x, self.ids(x.shape[1], x.device))

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        if q.shape[-2] != k.shape[-2]:
            return self.pe.rotate(q, k)
        return self.pe.rotate(q, k, self.ids(q.shape[-2], q.device))

    def attn_bias(self, t_q: int, t_k: int, causal: bool, device: torch.device) -> Optional[Tensor]:
        if t_q != t_k:
            return self.pe.attn_bias(t_q, t_k, causal, device)
        return self.pe.attn_bias(t_q, t_k, causal, device, self.ids(t_q, device))


PassEncoding = Union[PositionalEncoding, Placed]  # what a forward pass's layers read (lab/model.py)


def random_ids(span: int) -> Callable[[int], Tensor]:
    """Ruoss et al. 2023's training positions: t distinct ids of 0..span-1, in increasing order (torch's
    global generator, seeded by the trainer as dropout's masks are)."""

    def ids(t: int) -> Tensor:
        if t > span:
            raise ValueError(f"Randomized positions: a sequence of {t} tokens needs a range of at least {t}, "
                             f"not {span}")
        return torch.randperm(span)[:t].sort().values  # (t,)

    return ids


REGISTRY: dict[str, type[PositionalEncoding]] = {
    cls.name: cls for cls in (Sinusoidal, Learned, Rotary, ALiBi, PositionalEncoding)
}


def build_positional(cfg: ModelConfig) -> PositionalEncoding:
    return REGISTRY[cfg.pos](cfg)
