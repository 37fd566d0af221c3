"""Recurrent baselines: the plain RNN, the LSTM and the GRU that "Attention Is All You Need" argues against.

Vaswani et al. (2017, sec. 1 and 4) discard recurrence because a recurrent layer computes h_t from
h_{t-1}: O(n) sequential operations per layer, against O(1) for self-attention, and a path of length n
between the first and the last position. These models let a student measure both claims on the same
tasks: an embedding, stacked recurrent layers of width d_model, and a linear head, reading the same
decoder-only `prompt | answer` sequence as the Transformer, so every task, loss and metric applies.

- RNN: Elman (1990), h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh), as torch.nn.RNN. Delétang et al.
  (2023) found this plain recurrence generalizes to longer inputs on regular tasks (parity, even pairs,
  cycle navigation) where a Transformer does not.
- LSTM: Hochreiter & Schmidhuber (1997), with the forget gate of Gers et al. (2000), as torch.nn.LSTM.
- GRU: Cho et al. (2014), as torch.nn.GRU.

Each layer is its own single-layer torch module (rather than one `nn.LSTM(num_layers=L)`), so an
intervention can skip a layer; with dropout between layers (not after the last) the stack computes
exactly what torch's multi-layer module computes with the same weights, and has the same parameters.
"""
from __future__ import annotations

from typing import Optional

import torch.nn as nn
from torch import Tensor

from lab.config import GATES, ModelConfig
from lab.model import ModelOutput, dropout, lm_loss
from lab.positional import EMBED_STD

CELLS: dict[str, type[nn.RNNBase]] = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


def layer_params(cell: str, d: int) -> int:
    """Closed form for one recurrent layer of width d reading width d: each gate (the RNN's one update) has
    an input matrix (d x d), a recurrent matrix (d x d) and torch's two bias vectors (b_ih, b_hh):
    gates * (2 d^2 + 2 d)."""
    return GATES[cell] * (2 * d * d + 2 * d)


class RecurrentLM(nn.Module):
    """A recurrent language model over the decoder-only sequence: embedding -> L recurrent layers -> head.

    No positional encoding: the recurrence itself orders the tokens. The output head is a separate
    matrix without bias, as the Transformer's. `skipped` holds layers an intervention skips (the layer
    passes its input through unchanged); it is empty in training.
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int, cell: Optional[str] = None) -> None:
        super().__init__()
        self.cell = cell or cfg.arch
        if self.cell not in CELLS:
            raise ValueError(f"Architecture: a recurrent model is one of {', '.join(CELLS)}, not {self.cell!r}")
        self.cfg, self.vocab_size = cfg, vocab_size
        d = cfg.d_model
        self.tok_emb = nn.Embedding(vocab_size, d)
        self.layers = nn.ModuleList([CELLS[self.cell](d, d, batch_first=True) for _ in range(cfg.n_layers)])
        self.head = nn.Linear(d, vocab_size, bias=False)
        nn.init.normal_(self.tok_emb.weight, std=EMBED_STD)
        nn.init.normal_(self.head.weight, std=0.02)  # recurrent weights keep torch's uniform(+-1/sqrt(d))
        self.skipped: frozenset[int] = frozenset()

    def forward(
        self,
        idx: Tensor,
        src: Optional[Tensor] = None,
        targets: Optional[Tensor] = None,
        need_weights: bool = False,
        label_smoothing: float = 0.0,
    ) -> ModelOutput:
        """Logits for every position of `idx` (B, T), and with `targets` the mean cross-entropy over
        scored positions, as the Transformer's forward. There is no attention to return: `need_weights`
        is accepted and gives an empty dict; `src` is refused (no encoder-decoder recurrent model)."""
        if src is not None:
            raise ValueError("Architecture: a recurrent model reads prompt | answer as one sequence (no `src`)")
        x = self.tok_emb(idx)  # (B, T, d)
        for i, layer in enumerate(self.layers):
            if i > 0:  # torch's multi-layer RNN applies dropout to each layer's output but the last
                x = dropout(x, self.cfg.dropout, self.training)
            if i not in self.skipped:
                x, _ = layer(x)  # (B, T, d): h_t of every step
        x = dropout(x, self.cfg.dropout, self.training)
        logits = self.head(x)  # (B, T, vocab)
        return ModelOutput(logits=logits, loss=lm_loss(logits, targets, label_smoothing), attention={})

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def recurrent_params(cell: str, d: int, n_layers: int, vocab: int) -> dict[str, int]:
    """Parameter count per component from the sizes alone: embeddings V d, recurrent layers
    L * gates * (2 d^2 + 2 d), head d V."""
    return {"embeddings": vocab * d, "recurrent": n_layers * layer_params(cell, d), "head": d * vocab}

