"""The Transformer: attention, one block for both norm placements, decoder-only and encoder-decoder.

Vocabulary follows TransformerLens: d_model, n_heads, n_layers, d_head, d_ff (d_mlp), n_ctx;
"pattern" = post-softmax attention weights. Training runs the fused
`scaled_dot_product_attention`; with `need_weights=True` the explicit softmax path runs and
its patterns come back in `ModelOutput.attention` (never stored on the module), so a
trainer thread and an inspector can use the same class safely.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lab.config import GATED, RECURRENT, ModelConfig
from lab.fields import ConfigError
from lab.positional import EMBED_STD, PositionalEncoding, build_positional
from lab.records import CROSS, DEC_SELF, ENC_SELF, AttentionKind
from lab.tasks.shapes import IGNORE_INDEX


@dataclass
class ModelOutput:
    logits: Tensor  # (B, T, vocab)
    loss: Optional[Tensor] = None  # mean cross-entropy over targets != IGNORE_INDEX
    # AttentionKind (lab/records.py) -> (n_layers, B, n_heads, Tq, Tk); only with need_weights
    attention: dict[AttentionKind, Tensor] = field(default_factory=dict)


def make_norm(cfg: ModelConfig, dim: int) -> nn.Module:
    """The config's norm over the last `dim` features: LayerNorm (Ba et al. 2016) or RMSNorm (Zhang &
    Sennrich 2019: x / sqrt(mean(x^2) + eps) * g, no centring, no bias), both with eps 1e-5."""
    return nn.LayerNorm(dim) if cfg.norm_type == "layernorm" else nn.RMSNorm(dim, eps=1e-5)


class Attention(nn.Module):
    """Multi-head scaled dot-product attention (Vaswani et al. 2017, sec. 3.2).

    `in_proj` stacks Wq, Wk, Wv by rows, as `torch.nn.MultiheadAttention.in_proj_weight` does, each
    d_model -> n_heads * d_head (d_head = d_model / n_heads unless set: Table 3, row B), and `out_proj`
    maps the heads' n_heads * d_head back to d_model. Self-attention takes all three from x;
    cross-attention takes Q from x and K, V from memory. Scores are divided by sqrt(d_head) unless the
    scaling is removed; with QK-norm each head's queries and keys are normalised first (Dehghani et al.
    2023), before any rotary encoding.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.d_head, self.p_drop = cfg.n_heads, cfg.d_head, cfg.dropout
        self.inner = cfg.n_heads * cfg.d_head
        self.in_proj = nn.Linear(cfg.d_model, 3 * self.inner)
        self.out_proj = nn.Linear(self.inner, cfg.d_model)
        self.scale = 1.0 / math.sqrt(self.d_head) if cfg.scale == "sqrt" else 1.0
        self.sdpa_scale = None if cfg.scale == "sqrt" else 1.0  # None: the kernel's own 1/sqrt(d_head)
        self.q_norm = make_norm(cfg, self.d_head) if cfg.qk_norm == "on" else None
        self.k_norm = make_norm(cfg, self.d_head) if cfg.qk_norm == "on" else None

    def heads(self, x: Tensor, memory: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
        """Each head's queries (from x), keys and values (from memory, else x), QK-normed when it is on:
        (B, H, T, dh), (B, H, S, dh), (B, H, S, dh)."""
        B, T, _ = x.shape
        n = self.inner  # n_heads * d_head
        if memory is None:
            q, k, v = self.in_proj(x).split(n, dim=2)  # 3 x (B, T, n)
        else:
            w, b = self.in_proj.weight, self.in_proj.bias
            q = F.linear(x, w[:n], b[:n])  # (B, T, n)
            k, v = F.linear(memory, w[n:], b[n:]).split(n, dim=2)  # 2 x (B, S, n)
        S = k.shape[1]
        q = q.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, dh)
        k = k.view(B, S, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, S, dh)
        v = v.view(B, S, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, S, dh)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # each head's vectors, over dh
        return q, k, v

    def logits(self, q: Tensor, k: Tensor) -> Tensor:
        """The pre-softmax scores q.k^T, divided by sqrt(d_head) unless the scaling is removed: (B, H, T, S)."""
        return (q @ k.transpose(-2, -1)) * self.scale

    def forward(
        self,
        x: Tensor,
        memory: Optional[Tensor],
        pe: Optional[PositionalEncoding],
        causal: bool,
        need_weights: bool,
    ) -> tuple[Tensor, Optional[Tensor]]:
        B, T, _ = x.shape
        q, k, v = self.heads(x, memory)
        S = k.shape[2]
        bias = None
        if pe is not None:  # self-attention only: relative encodings act here
            q, k = pe.rotate(q, k)
            bias = pe.attn_bias(T, S, causal, x.device)  # (H, T, S) or None
        p_drop = self.p_drop if self.training else 0.0
        pattern = None
        if need_weights:
            scores = self.logits(q, k)  # (B, H, T, S)
            if bias is not None:
                scores = scores + bias
            elif causal:
                future = torch.ones(T, S, dtype=torch.bool, device=x.device).triu(1)
                scores = scores.masked_fill(future, float("-inf"))
            pattern = scores.softmax(dim=-1)  # (B, H, T, S); rows sum to 1
            y = F.dropout(pattern, p_drop, self.training) @ v  # (B, H, T, dh)
        else:
            # a 3-D (H, T, S) mask sends CPU SDPA to the slow math kernel; (1, H, T, S) keeps the fused one
            mask = None if bias is None else bias.unsqueeze(0)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p_drop, is_causal=causal and bias is None, scale=self.sdpa_scale
            )  # (B, H, T, dh)
        y = y.transpose(1, 2).reshape(B, T, self.inner)  # (B, T, H dh)
        return self.out_proj(y), pattern


ACTS = {"relu": F.relu, "gelu": F.gelu, "swiglu": F.silu, "geglu": F.gelu}


class FeedForward(nn.Module):
    """Position-wise feed-forward network (Vaswani et al. 2017, sec. 3.3): fc2(act(fc1(x))).

    Gated (Shazeer 2020, "GLU Variants Improve Transformer"): fc2(act(x W) * (x V)), SwiGLU with act =
    SiLU (Swish), GeGLU with act = GELU. `fc1` stacks W and V by rows (gate first), each d_model ->
    h = cfg.d_ff_hidden (2/3 of d_ff), so the layer's weights stay about 2 d_model d_ff.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h = cfg.d_ff_hidden
        self.gated = cfg.activation in GATED
        self.fc1 = nn.Linear(cfg.d_model, 2 * h if self.gated else h)
        self.fc2 = nn.Linear(h, cfg.d_model)
        self.act = ACTS[cfg.activation]
        self.p_drop = cfg.dropout

    def forward(self, x: Tensor) -> Tensor:
        z = self.fc1(x)  # (B, T, h), or (B, T, 2h) gated
        if self.gated:
            gate, value = z.chunk(2, dim=-1)  # 2 x (B, T, h)
            hidden = self.act(gate) * value
        else:
            hidden = self.act(z)
        return self.fc2(dropout(hidden, self.p_drop, self.training))


def lm_loss(logits: Tensor, targets: Optional[Tensor], label_smoothing: float = 0.0) -> Optional[Tensor]:
    """Mean cross-entropy of `logits` (B, T, vocab) over the scored positions of `targets` (B, T; the rest
    IGNORE_INDEX), with label smoothing eps (Szegedy et al. 2016, sec. 7); None without targets."""
    if targets is None:
        return None
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                           label_smoothing=label_smoothing)  # (B T, vocab) against (B T,)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """F.dropout, skipped outright when it would do nothing (p = 0, the default, or eval mode)."""
    return F.dropout(x, p, True) if p > 0 and training else x


class Block(nn.Module):
    """One encoder block (self-attention, FF) or decoder block (masked self-attention, cross, FF).

    Norm placement, written out side by side:
      pre  (Xiong et al. 2020; GPT-2):  x = x + f(LN(x))   and the stack ends with a final LN
      post (Vaswani et al. 2017):       x = LN(x + f(x))   and no final LN
      none:                             x = x + f(x)
    With residual connections off (He et al. 2016 show what they are for) the sum loses its x: pre
    x = f(LN(x)), post x = LN(f(x)), none x = f(x). LN is the config's norm type (LayerNorm or RMSNorm).
    `d_ff = 0` drops the feed-forward sublayer (attention-only, as in Olsson et al. 2022).
    """

    def __init__(self, cfg: ModelConfig, causal: bool, cross: bool) -> None:
        super().__init__()
        self.norm, self.causal, self.p_drop = cfg.norm, causal, cfg.dropout
        self.residual = cfg.residual == "on"
        self.self_attn = Attention(cfg)
        self.cross_attn = Attention(cfg) if cross else None
        self.ff = FeedForward(cfg) if cfg.d_ff > 0 else None
        n_sub = 1 + int(cross) + int(cfg.d_ff > 0)
        make = (lambda: make_norm(cfg, cfg.d_model)) if cfg.norm != "none" else nn.Identity
        self.norms = nn.ModuleList([make() for _ in range(n_sub)])

    def _in(self, x: Tensor, norm: nn.Module) -> Tensor:
        """A sublayer's input: normalised first with pre-LN."""
        return norm(x) if self.norm == "pre" else x

    def _out(self, x: Tensor, y: Tensor, norm: nn.Module) -> Tensor:
        """The residual stream after a sublayer's output y: the sum, normalised after with post-LN."""
        y = dropout(y, self.p_drop, self.training)
        out = x + y if self.residual else y
        return norm(out) if self.norm == "post" else out

    def forward(
        self, x: Tensor, memory: Optional[Tensor], pe: PositionalEncoding, need_weights: bool
    ) -> tuple[Tensor, dict[str, Tensor]]:
        patterns: dict[str, Tensor] = {}
        norms = iter(self.norms)
        norm = next(norms)
        y, patterns["self"] = self.self_attn(self._in(x, norm), None, pe, self.causal, need_weights)
        x = self._out(x, y, norm)
        if self.cross_attn is not None:
            norm = next(norms)
            y, patterns["cross"] = self.cross_attn(self._in(x, norm), memory, None, False, need_weights)
            x = self._out(x, y, norm)
        if self.ff is not None:
            norm = next(norms)
            x = self._out(x, self.ff(self._in(x, norm)), norm)
        return x, patterns


class Transformer(nn.Module):
    """Decoder-only (GPT-style, causal) or encoder-decoder (Vaswani et al. 2017) Transformer.

    One token embedding is shared by encoder and decoder (one vocabulary); the output head is a
    separate matrix (no weight tying). Decoder-only reads `idx` = prompt SEP answer; the
    encoder-decoder reads the prompt as `src` and the shifted answer as `idx`.
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        if cfg.arch in RECURRENT:  # it once built a decoder for them without a word
            raise ConfigError("model.arch", f"{cfg.arch!r} is a recurrent baseline, not a Transformer: build it with "
                              "lab.recurrent.RecurrentLM (lab.trainer.build_model picks the right one)")
        self.cfg, self.vocab_size = cfg, vocab_size
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.pos = build_positional(cfg)
        enc_dec = cfg.arch == "encoder-decoder"
        self.encoder = nn.ModuleList([Block(cfg, causal=False, cross=False) for _ in range(cfg.n_layers)]) if enc_dec else None
        self.decoder = nn.ModuleList([Block(cfg, causal=True, cross=enc_dec) for _ in range(cfg.n_layers)])
        final = (lambda: make_norm(cfg, cfg.d_model)) if cfg.norm == "pre" else nn.Identity
        self.enc_norm = final() if enc_dec else None
        self.dec_norm = final()
        self.head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith(("out_proj.weight", "fc2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=EMBED_STD)

    def _stack(self, blocks: nn.ModuleList, x: Tensor, memory: Optional[Tensor], need_weights: bool):
        patterns: dict[str, list[Tensor]] = {}
        for block in blocks:
            x, p = block(x, memory, self.pos, need_weights)
            for kind, pat in p.items():
                if pat is not None:
                    patterns.setdefault(kind, []).append(pat)
        return x, {k: torch.stack(v) for k, v in patterns.items()}  # (L, B, H, Tq, Tk)

    def forward(
        self,
        idx: Tensor,
        src: Optional[Tensor] = None,
        targets: Optional[Tensor] = None,
        need_weights: bool = False,
        label_smoothing: float = 0.0,
    ) -> ModelOutput:
        """Logits for every position; with `targets`, the mean cross-entropy over scored positions, with
        `label_smoothing` eps: (1 - eps) * CE + eps * mean over the vocabulary of -log p (Szegedy et al.
        2016, sec. 7; Vaswani et al. 2017, sec. 5.4). With `need_weights`, every attention pattern."""
        attention: dict[AttentionKind, Tensor] = {}
        memory = None
        if self.encoder is not None:
            if src is None:
                raise ValueError("an encoder-decoder model needs `src`")
            h = dropout(self.pos.embed(self.tok_emb(src)), self.cfg.dropout, self.training)  # (B, S, d)
            h, enc = self._stack(self.encoder, h, None, need_weights)
            memory = self.enc_norm(h)
            attention.update({ENC_SELF: enc["self"]} if enc else {})
        x = dropout(self.pos.embed(self.tok_emb(idx)), self.cfg.dropout, self.training)  # (B, T, d)
        x, dec = self._stack(self.decoder, x, memory, need_weights)
        if dec:
            attention[DEC_SELF] = dec["self"]
            if "cross" in dec:
                attention[CROSS] = dec["cross"]
        logits = self.head(self.dec_norm(x))  # (B, T, vocab)
        return ModelOutput(logits=logits, loss=lm_loss(logits, targets, label_smoothing), attention=attention)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
