"""A minimal, hand-written pre-LN GPT (nanoGPT style): the throughput baseline for our model.

Token + learned position embedding; n_layers blocks of
    x = x + proj(SDPA_causal(qkv(LN(x))))      (one fused qkv Linear, F.scaled_dot_product_attention)
    x = x + fc2(GELU(fc1(LN(x))))               (d_ff = 4 * d_model unless given)
then a final LN and a bias-free head. Block Linears and LayerNorms have biases by default (nanoGPT's
`bias=True`, GPT-2, and our model); `bias=False` drops them. No dropout, no weight tying, no tricks
either way. Forward returns (logits, mean cross-entropy over all positions).
"""
from __future__ import annotations

import math

import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, bias: bool) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q = q.view(B, T, self.n_heads, d // self.n_heads).transpose(1, 2)  # (B, H, T, dh)
        k = k.view(B, T, self.n_heads, d // self.n_heads).transpose(1, 2)
        v = v.view(B, T, self.n_heads, d // self.n_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, d))


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int, bias: bool) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int, bias: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, bias=bias)
        self.attn = SelfAttention(d_model, n_heads, bias)
        self.ln2 = nn.LayerNorm(d_model, bias=bias)
        self.mlp = MLP(d_model, d_ff, bias)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(
        self, vocab_size: int, n_ctx: int, d_model: int, n_layers: int, n_heads: int, d_ff: int = 0, bias: bool = True
    ) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(n_ctx, d_model)
        self.blocks = nn.ModuleList([Block(d_model, n_heads, d_ff or 4 * d_model, bias) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model, bias=bias)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        for name, p in self.named_parameters():  # GPT-2 init
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        T = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb.weight[:T]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss
