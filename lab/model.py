"""The Transformer: attention, one block for both norm placements, decoder-only and encoder-decoder.

Vocabulary follows TransformerLens: d_model, n_heads, n_layers, d_head, d_ff (d_mlp), n_ctx;
"pattern" = post-softmax attention weights. Training runs the fused
`scaled_dot_product_attention`; with `need_weights=True` the explicit softmax path runs and
its patterns come back in `ModelOutput.attention` (never stored on the module), so a
trainer thread and an inspector can use the same class safely.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, ContextManager, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lab.activation_cache import ActivationCache, NamesFilter, Tokens, hooked, run_with_cache, run_with_hooks
from lab.config import GATED, RECURRENT, ModelConfig
from lab.fields import ConfigError
from lab.hooks import HookFn, HookPoint, name_hook_points
from lab.positional import EMBED_STD, PassEncoding, Placed, build_positional, random_ids
from lab.records import CROSS, DEC_SELF, ENC_SELF, AttentionKind
from lab.tasks.shapes import IGNORE_INDEX


@dataclass(frozen=True)
class LensConfig(ModelConfig):
    """A built model's config: its ModelConfig with the vocabulary size the task gave it, so that
    TransformerLens's names all read from `model.cfg` (d_model, d_head, n_heads, n_layers, d_mlp, d_vocab,
    n_ctx, act_fn, normalization_type, positional_embedding_type: lab/config.py)."""

    d_vocab: int = 0

    @classmethod
    def of(cls, cfg: ModelConfig, d_vocab: int) -> "LensConfig":
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(ModelConfig)}, d_vocab=d_vocab)


@dataclass
class ModelOutput:
    logits: Tensor  # (B, T, vocab)
    loss: Optional[Tensor] = None  # mean cross-entropy over targets != IGNORE_INDEX
    # AttentionKind (lab/records.py) -> (n_layers, B, n_heads, Tq, Tk); only with need_weights
    attention: dict[AttentionKind, Tensor] = field(default_factory=dict)


class LayerNorm(nn.LayerNorm):
    """LayerNorm (Ba et al. 2016) with TransformerLens's hook points: `hook_scale` (B, T, 1) = sqrt(var + eps)
    of the centred input, `hook_normalized` (B, T, d) = centred input / scale, before the gain and bias."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.hook_scale, self.hook_normalized = HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        if not (self.hook_scale.active or self.hook_normalized.active):
            return super().forward(x)
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())  # (B, T, 1)
        return self.hook_normalized(x / scale) * self.weight + self.bias


class RMSNorm(nn.RMSNorm):
    """RMSNorm (Zhang & Sennrich 2019: x / sqrt(mean(x^2) + eps) * g, no centring, no bias) with the same
    hook points as `LayerNorm`: `hook_scale` (B, T, 1), `hook_normalized` (B, T, d) before the gain."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim, eps=1e-5)
        self.hook_scale, self.hook_normalized = HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        if not (self.hook_scale.active or self.hook_normalized.active):
            return super().forward(x)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())  # (B, T, 1)
        return self.hook_normalized(x / scale) * self.weight


def make_norm(cfg: ModelConfig, dim: int) -> nn.Module:
    """The config's norm over the last `dim` features: LayerNorm (Ba et al. 2016) or RMSNorm (Zhang &
    Sennrich 2019), both with eps 1e-5 and TransformerLens's hook points."""
    return LayerNorm(dim) if cfg.norm_type == "layernorm" else RMSNorm(dim)


def _heads_hooked(hook: HookPoint, x: Tensor) -> Tensor:
    """x (B, H, T, dh) through `hook` in TransformerLens's layout (B, T, H, dh), only when a function is on it."""
    return hook(x.transpose(1, 2)).transpose(1, 2) if hook.active else x


class Attention(nn.Module):
    """Multi-head scaled dot-product attention (Vaswani et al. 2017, sec. 3.2).

    `in_proj` stacks Wq, Wk, Wv by rows, as `torch.nn.MultiheadAttention.in_proj_weight` does, each
    d_model -> n_heads * d_head (d_head = d_model / n_heads unless set: Table 3, row B), and `out_proj`
    maps the heads' n_heads * d_head back to d_model. Self-attention takes all three from x;
    cross-attention takes Q from x and K, V from memory. Scores are divided by sqrt(d_head) unless the
    scaling is removed; with QK-norm each head's queries and keys are normalised first (Dehghani et al.
    2023), before any rotary encoding.
    """

    def __init__(self, cfg: ModelConfig, rotary: bool = False) -> None:
        """`rotary`: its queries and keys are rotated (RoPE self-attention), so it has hook_rot_q and hook_rot_k."""
        super().__init__()
        self.n_heads, self.d_head, self.p_drop = cfg.n_heads, cfg.d_head, cfg.dropout
        self.inner = cfg.n_heads * cfg.d_head
        self.in_proj = nn.Linear(cfg.d_model, 3 * self.inner)
        self.out_proj = nn.Linear(self.inner, cfg.d_model)
        self.scale = 1.0 / math.sqrt(self.d_head) if cfg.scale == "sqrt" else 1.0
        self.sdpa_scale = None if cfg.scale == "sqrt" else 1.0  # None: the kernel's own 1/sqrt(d_head)
        self.q_norm = make_norm(cfg, self.d_head) if cfg.qk_norm == "on" else None
        self.k_norm = make_norm(cfg, self.d_head) if cfg.qk_norm == "on" else None
        # TransformerLens's hook points (lab/hooks.py); q, k, v, z as (B, T, H, dh), scores and pattern as
        # (B, H, Tq, Tk), result (each head's output through its slice of W_O) as (B, T, H, d_model)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_rot_q, self.hook_rot_k = (HookPoint(), HookPoint()) if rotary else (None, None)
        self.hook_attn_scores, self.hook_pattern = HookPoint(), HookPoint()
        self.hook_z, self.hook_result = HookPoint(), HookPoint()

    # ---- the weights as TransformerLens names them: views of `in_proj` and `out_proj` -------------------
    def _rows(self, i: int) -> Tensor:
        return self.in_proj.weight[i * self.inner:(i + 1) * self.inner]  # (H dh, d_model)

    @property
    def W_Q(self) -> Tensor:
        """(n_heads, d_model, d_head): q = x @ W_Q[h] + b_Q[h]."""
        return self._rows(0).unflatten(0, (self.n_heads, self.d_head)).transpose(1, 2)

    @property
    def W_K(self) -> Tensor:
        return self._rows(1).unflatten(0, (self.n_heads, self.d_head)).transpose(1, 2)

    @property
    def W_V(self) -> Tensor:
        return self._rows(2).unflatten(0, (self.n_heads, self.d_head)).transpose(1, 2)

    @property
    def b_Q(self) -> Tensor:
        """(n_heads, d_head)."""
        return self.in_proj.bias[:self.inner].unflatten(0, (self.n_heads, self.d_head))

    @property
    def b_K(self) -> Tensor:
        return self.in_proj.bias[self.inner:2 * self.inner].unflatten(0, (self.n_heads, self.d_head))

    @property
    def b_V(self) -> Tensor:
        return self.in_proj.bias[2 * self.inner:].unflatten(0, (self.n_heads, self.d_head))

    @property
    def W_O(self) -> Tensor:
        """(n_heads, d_head, d_model): the sublayer's output is sum over h of z[h] @ W_O[h], plus b_O."""
        return self.out_proj.weight.T.unflatten(0, (self.n_heads, self.d_head))

    @property
    def b_O(self) -> Tensor:
        """(d_model,)."""
        return self.out_proj.bias

    @property
    def QK(self) -> Tensor:
        """(n_heads, d_model, d_model): each head's QK circuit W_Q W_K^T (Elhage et al. 2021): the bilinear form
        of its scores (before scaling, biases, QK-norm and rotation), x_query QK x_key^T."""
        return self.W_Q @ self.W_K.transpose(1, 2)

    @property
    def OV(self) -> Tensor:
        """(n_heads, d_model, d_model): each head's OV circuit W_V W_O (Elhage et al. 2021): what a source
        position's stream writes through the head, x W_V W_O (before the value bias)."""
        return self.W_V @ self.W_O

    def heads(self, x: Tensor, memory: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
        """Each head's queries (from x), keys and values (from memory, else x), through hook_q/k/v, then
        QK-normed when it is on: (B, H, T, dh), (B, H, S, dh), (B, H, S, dh)."""
        B, T, _ = x.shape
        n = self.inner  # n_heads * d_head
        if memory is None:
            q, k, v = self.in_proj(x).split(n, dim=2)  # 3 x (B, T, n)
        else:
            w, b = self.in_proj.weight, self.in_proj.bias
            q = F.linear(x, w[:n], b[:n])  # (B, T, n)
            k, v = F.linear(memory, w[n:], b[n:]).split(n, dim=2)  # 2 x (B, S, n)
        S = k.shape[1]
        q = _heads_hooked(self.hook_q, q.view(B, T, self.n_heads, self.d_head).transpose(1, 2))  # (B, H, T, dh)
        k = _heads_hooked(self.hook_k, k.view(B, S, self.n_heads, self.d_head).transpose(1, 2))  # (B, H, S, dh)
        v = _heads_hooked(self.hook_v, v.view(B, S, self.n_heads, self.d_head).transpose(1, 2))  # (B, H, S, dh)
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
        pe: Optional[PassEncoding],
        causal: bool,
        need_weights: bool,
    ) -> tuple[Tensor, Optional[Tensor]]:
        B, T, _ = x.shape
        q, k, v = self.heads(x, memory)
        S = k.shape[2]
        bias = None
        if pe is not None:  # self-attention only: relative encodings act here
            q, k = pe.rotate(q, k)
            if self.hook_rot_q is not None:
                q, k = _heads_hooked(self.hook_rot_q, q), _heads_hooked(self.hook_rot_k, k)
            bias = pe.attn_bias(T, S, causal, x.device)  # (H, T, S) or None
        p_drop = self.p_drop if self.training else 0.0
        pattern = None
        if need_weights or self.hook_attn_scores.active or self.hook_pattern.active:
            scores = self.logits(q, k)  # (B, H, T, S)
            if bias is not None:
                scores = scores + bias
            elif causal:
                future = torch.ones(T, S, dtype=torch.bool, device=x.device).triu(1)
                scores = scores.masked_fill(future, float("-inf"))
            pattern = self.hook_pattern(self.hook_attn_scores(scores).softmax(dim=-1))  # (B, H, T, S); rows sum to 1
            y = F.dropout(pattern, p_drop, self.training) @ v  # (B, H, T, dh)
        else:
            # a 3-D (H, T, S) mask sends CPU SDPA to the slow math kernel; (1, H, T, S) keeps the fused one
            mask = None if bias is None else bias.unsqueeze(0)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p_drop, is_causal=causal and bias is None, scale=self.sdpa_scale
            )  # (B, H, T, dh)
        z = self.hook_z(y.transpose(1, 2))  # (B, T, H, dh)
        if self.hook_result.active:  # each head's share of the output: (B, T, H, d_model), summed over H
            result = self.hook_result(torch.einsum("bthd,hdm->bthm", z, self.W_O))
            return result.sum(2) + self.b_O, (pattern if need_weights else None)
        return self.out_proj(z.reshape(B, T, self.inner)), (pattern if need_weights else None)  # (B, T, H dh) in


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
        self.gated, self.hidden = cfg.activation in GATED, h
        self.fc1 = nn.Linear(cfg.d_model, 2 * h if self.gated else h)
        self.fc2 = nn.Linear(h, cfg.d_model)
        self.act = ACTS[cfg.activation]
        self.p_drop = cfg.dropout
        # TransformerLens's hook points, (B, T, h): the activation's input (gated: the gate's), the value
        # branch of a gated layer (hook_pre_linear), and what fc2 reads
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()
        self.hook_pre_linear = HookPoint() if self.gated else None

    def forward(self, x: Tensor) -> Tensor:
        z = self.fc1(x)  # (B, T, h), or (B, T, 2h) gated
        if self.gated:
            gate, value = z.chunk(2, dim=-1)  # 2 x (B, T, h)
            hidden = self.act(self.hook_pre(gate)) * self.hook_pre_linear(value)
        else:
            hidden = self.act(self.hook_pre(z))
        return self.fc2(dropout(self.hook_post(hidden), self.p_drop, self.training))

    # ---- the weights as TransformerLens names them: views of fc1 and fc2 ----------------------------------
    @property
    def W_in(self) -> Tensor:
        """(d_model, d_mlp): hook_pre = x @ W_in + b_in (a gated layer: its value branch, hook_pre_linear)."""
        return self.fc1.weight[self.hidden:].T if self.gated else self.fc1.weight.T

    @property
    def b_in(self) -> Tensor:
        return self.fc1.bias[self.hidden:] if self.gated else self.fc1.bias

    @property
    def W_gate(self) -> Tensor:
        """(d_model, d_mlp), gated layers only: hook_pre = x @ W_gate (+ its bias, `b_gate`)."""
        if not self.gated:
            raise AttributeError("W_gate: this feed-forward layer is not gated (activation relu or gelu)")
        return self.fc1.weight[:self.hidden].T

    @property
    def b_gate(self) -> Tensor:
        if not self.gated:
            raise AttributeError("b_gate: this feed-forward layer is not gated (activation relu or gelu)")
        return self.fc1.bias[:self.hidden]

    @property
    def W_out(self) -> Tensor:
        """(d_mlp, d_model): the layer's output is hook_post @ W_out + b_out."""
        return self.fc2.weight.T

    @property
    def b_out(self) -> Tensor:
        return self.fc2.bias


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
        self.self_attn = Attention(cfg, rotary=cfg.pos == "rope")
        self.cross_attn = Attention(cfg) if cross else None
        self.ff = FeedForward(cfg) if cfg.d_ff > 0 else None
        n_sub = 1 + int(cross) + int(cfg.d_ff > 0)
        make = (lambda: make_norm(cfg, cfg.d_model)) if cfg.norm != "none" else nn.Identity
        self.norms = nn.ModuleList([make() for _ in range(n_sub)])
        # TransformerLens's names of the norms, in the order of `norms` (with post-LN each comes after its sum)
        self.norm_names = ["ln1"] + (["ln_cross"] if cross else []) + (["ln2"] if self.ff is not None else [])
        # the residual stream entering the block, after self-attention, after cross-attention, leaving it; and
        # each sublayer's output (B, T, d_model), as TransformerLens names them (lab/hooks.py)
        self.hook_resid_pre, self.hook_resid_mid, self.hook_resid_post = HookPoint(), HookPoint(), HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_cross_attn_out = HookPoint() if cross else None
        self.hook_resid_mid_cross = HookPoint() if cross else None
        self.hook_mlp_out = HookPoint() if self.ff is not None else None

    # TransformerLens's names for the sublayers (the modules keep theirs: stored weights are named by them)
    @property
    def attn(self) -> Attention:
        return self.self_attn

    @property
    def mlp(self) -> Optional[FeedForward]:
        return self.ff

    @property
    def ln1(self) -> nn.Module:
        return self.norms[0]

    @property
    def ln2(self) -> Optional[nn.Module]:
        return self.norms[-1] if self.ff is not None else None

    def _in(self, x: Tensor, norm: nn.Module) -> Tensor:
        """A sublayer's input: normalised first with pre-LN."""
        return norm(x) if self.norm == "pre" else x

    def _out(self, x: Tensor, y: Tensor, norm: nn.Module) -> Tensor:
        """The residual stream after a sublayer's output y: the sum, normalised after with post-LN."""
        y = dropout(y, self.p_drop, self.training)
        out = x + y if self.residual else y
        return norm(out) if self.norm == "post" else out

    def forward(
        self, x: Tensor, memory: Optional[Tensor], pe: PassEncoding, need_weights: bool
    ) -> tuple[Tensor, dict[str, Tensor]]:
        patterns: dict[str, Tensor] = {}
        norms = iter(self.norms)
        norm = next(norms)
        x = self.hook_resid_pre(x)
        y, patterns["self"] = self.self_attn(self._in(x, norm), None, pe, self.causal, need_weights)
        x = self.hook_resid_mid(self._out(x, self.hook_attn_out(y), norm))
        if self.cross_attn is not None:
            norm = next(norms)
            y, patterns["cross"] = self.cross_attn(self._in(x, norm), memory, None, False, need_weights)
            x = self.hook_resid_mid_cross(self._out(x, self.hook_cross_attn_out(y), norm))
        if self.ff is not None:
            norm = next(norms)
            x = self._out(x, self.hook_mlp_out(self.ff(self._in(x, norm))), norm)
        return self.hook_resid_post(x), patterns


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
        self.cfg, self.vocab_size = LensConfig.of(cfg, vocab_size), vocab_size
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.pos = build_positional(cfg)
        enc_dec = cfg.arch == "encoder-decoder"
        self.encoder = nn.ModuleList([Block(cfg, causal=False, cross=False) for _ in range(cfg.n_layers)]) if enc_dec else None
        self.decoder = nn.ModuleList([Block(cfg, causal=True, cross=enc_dec) for _ in range(cfg.n_layers)])
        final = (lambda: make_norm(cfg, cfg.d_model)) if cfg.norm == "pre" else nn.Identity
        self.enc_norm = final() if enc_dec else None
        self.dec_norm = final()
        self.head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        # the token embedding (B, T, d_model) and the vector added per position (learned and sinusoidal only)
        self.hook_embed = HookPoint()
        self.hook_pos_embed = HookPoint() if self.pos.adds_vectors else None
        self.hook_src_embed = HookPoint() if enc_dec else None
        self.hook_src_pos_embed = HookPoint() if enc_dec and self.pos.adds_vectors else None
        self.hook_unembed_in, self.hook_unembed_out = HookPoint(), HookPoint()  # what the head reads; the logits
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith(("out_proj.weight", "fc2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))
        self.hook_dict = name_hook_points(self, self._lens_name)  # TransformerLens's name -> HookPoint
        # the encoding every forward pass reads instead of `pos` while set (the shuffled-positions
        # intervention, lab/interventions.py); None: `pos` at the real positions, or randomized in training
        self.pos_override: Optional[PassEncoding] = None

    def _pass_positions(self) -> PassEncoding:
        """The positional encoding one forward pass reads: an intervention's override, else in training with
        randomized positions (model.pos_range) `pos` at a fresh ordered random subset of ids (Ruoss et al.
        2023), else `pos` itself at 0..T-1."""
        if self.pos_override is not None:
            return self.pos_override
        if self.training and self.cfg.pos_range:
            return Placed(self.pos, random_ids(self.cfg.pos_range))
        return self.pos

    def _lens_name(self, path: str) -> str:
        """A hook point's module path -> its TransformerLens name: decoder.1.self_attn.hook_q ->
        blocks.1.attn.hook_q, decoder.0.norms.1.hook_scale -> blocks.0.ln2.hook_scale, dec_norm.hook_normalized
        -> ln_final.hook_normalized; an encoder-decoder's encoder under encoder.{L}. and encoder.ln_final, its
        embedding hooks encoder.hook_embed and encoder.hook_pos_embed, cross-attention under blocks.{L}.cross_attn."""
        parts = path.split(".")
        if parts[0] in ("decoder", "encoder"):
            block = (self.decoder if parts[0] == "decoder" else self.encoder)[int(parts[1])]
            rest = parts[2:]
            if rest[0] == "norms":
                rest = [block.norm_names[int(rest[1])]] + rest[2:]
            else:
                rest[0] = {"self_attn": "attn", "ff": "mlp"}.get(rest[0], rest[0])
            return ".".join(["blocks" if parts[0] == "decoder" else "encoder", parts[1]] + rest)
        if parts[0] in ("dec_norm", "enc_norm"):
            return ".".join((["ln_final"] if parts[0] == "dec_norm" else ["encoder", "ln_final"]) + parts[1:])
        return {"hook_src_embed": "encoder.hook_embed", "hook_src_pos_embed": "encoder.hook_pos_embed",
                "hook_unembed_in": "unembed.hook_in", "hook_unembed_out": "unembed.hook_out"}.get(path, path)

    # ---- TransformerLens's habits: run with the hook functions on, or caching every activation --------------
    def run_with_cache(self, tokens: Tokens, fwd_hooks: Sequence[tuple[str, HookFn]] = (),
                       names_filter: NamesFilter = None, src: Any = None) -> tuple[Tensor, ActivationCache]:
        """(logits (B, T, vocab), ActivationCache) on token ids [B, T] (lab/activation_cache.py)."""
        return run_with_cache(self, tokens, fwd_hooks, names_filter, src)

    def run_with_hooks(self, tokens: Tokens, fwd_hooks: Sequence[tuple[str, HookFn]] = (), src: Any = None) -> Tensor:
        """The logits (B, T, vocab) with each (hook point, function) of `fwd_hooks` on for one forward pass."""
        return run_with_hooks(self, tokens, fwd_hooks, src)

    def hooks(self, fwd_hooks: Sequence[tuple[str, HookFn]] = ()) -> ContextManager["Transformer"]:
        """The model with `fwd_hooks` on for a `with` block, taken off however it ends."""
        return hooked(self, fwd_hooks)

    # ---- TransformerLens's names for the modules and weights (views of the parameters) ----------------------
    @property
    def blocks(self) -> nn.ModuleList:
        """The decoder's blocks (TransformerLens's `model.blocks`)."""
        return self.decoder

    @property
    def W_E(self) -> Tensor:
        """(d_vocab, d_model): the token embedding, a row per token id: the task's symbols 0..n-1 in order,
        then its separator (lab/tasks/shapes.py `vocab_size`, `sep`; `Run.to_str_tokens` names them)."""
        return self.tok_emb.weight

    @property
    def W_pos(self) -> Tensor:
        """(n_ctx, d_model): the vector added at each position (learned: the parameter; sinusoidal: the fixed
        table); an encoding that adds no vector (rope, alibi, none) has none."""
        if not self.pos.adds_vectors:
            raise AttributeError(f"W_pos: positional encoding {self.cfg.pos!r} adds no vector to the residual stream")
        return self.pos.weight if hasattr(self.pos, "weight") else self.pos.table(self.cfg.n_ctx)

    @property
    def W_U(self) -> Tensor:
        """(d_model, d_vocab): logits = ln_final(resid) @ W_U (no bias: b_U is zeros)."""
        return self.head.weight.T

    @property
    def b_U(self) -> Tensor:
        return torch.zeros(self.vocab_size, dtype=self.head.weight.dtype, device=self.head.weight.device)

    def _stacked(self, name: str, of: str = "attn") -> Tensor:
        return torch.stack([getattr(getattr(b, of), name) for b in self.decoder])  # (n_layers, ...)

    W_Q = property(lambda self: self._stacked("W_Q"), doc="(n_layers, n_heads, d_model, d_head), a copy")
    W_K = property(lambda self: self._stacked("W_K"), doc="(n_layers, n_heads, d_model, d_head), a copy")
    W_V = property(lambda self: self._stacked("W_V"), doc="(n_layers, n_heads, d_model, d_head), a copy")
    W_O = property(lambda self: self._stacked("W_O"), doc="(n_layers, n_heads, d_head, d_model), a copy")
    b_Q = property(lambda self: self._stacked("b_Q"), doc="(n_layers, n_heads, d_head), a copy")
    b_K = property(lambda self: self._stacked("b_K"), doc="(n_layers, n_heads, d_head), a copy")
    b_V = property(lambda self: self._stacked("b_V"), doc="(n_layers, n_heads, d_head), a copy")
    b_O = property(lambda self: self._stacked("b_O"), doc="(n_layers, d_model), a copy")
    QK = property(lambda self: self._stacked("QK"), doc="(n_layers, n_heads, d_model, d_model)")
    OV = property(lambda self: self._stacked("OV"), doc="(n_layers, n_heads, d_model, d_model)")
    W_in = property(lambda self: self._stacked("W_in", "ff"), doc="(n_layers, d_model, d_mlp), a copy")
    W_out = property(lambda self: self._stacked("W_out", "ff"), doc="(n_layers, d_mlp, d_model), a copy")
    b_in = property(lambda self: self._stacked("b_in", "ff"), doc="(n_layers, d_mlp), a copy")
    b_out = property(lambda self: self._stacked("b_out", "ff"), doc="(n_layers, d_model), a copy")

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=EMBED_STD)

    def _embedded(self, tokens: Tensor, pe: PassEncoding, embed_hook: HookPoint, pos_hook: Optional[HookPoint]) -> Tensor:
        """The residual stream's input (B, T, d_model): the tokens' embedding through `embed_hook`, plus the
        positions' vectors of the pass's encoding `pe` (through `pos_hook` when a function is on it: the added
        part, TransformerLens's hook_pos_embed), then dropout."""
        emb = embed_hook(self.tok_emb(tokens))  # (B, T, d)
        x = pe.embed(emb)
        if pos_hook is not None and pos_hook.active:
            x = emb + pos_hook(x - emb)
        return dropout(x, self.cfg.dropout, self.training)

    def _stack(self, blocks: nn.ModuleList, x: Tensor, memory: Optional[Tensor], pe: PassEncoding, need_weights: bool):
        patterns: dict[str, list[Tensor]] = {}
        for block in blocks:
            x, p = block(x, memory, pe, need_weights)
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
        pe = self._pass_positions()
        if self.encoder is not None:
            if src is None:
                raise ValueError("an encoder-decoder model needs `src`")
            h = self._embedded(src, pe, self.hook_src_embed, self.hook_src_pos_embed)  # (B, S, d)
            h, enc = self._stack(self.encoder, h, None, pe, need_weights)
            memory = self.enc_norm(h)
            attention.update({ENC_SELF: enc["self"]} if enc else {})
        x = self._embedded(idx, pe, self.hook_embed, self.hook_pos_embed)  # (B, T, d)
        x, dec = self._stack(self.decoder, x, memory, pe, need_weights)
        if dec:
            attention[DEC_SELF] = dec["self"]
            if "cross" in dec:
                attention[CROSS] = dec["cross"]
        logits = self.hook_unembed_out(self.head(self.hook_unembed_in(self.dec_norm(x))))  # (B, T, vocab)
        return ModelOutput(logits=logits, loss=lm_loss(logits, targets, label_smoothing), attention=attention)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
