"""Small frozen records passed from the trainer to its callbacks (and on to the store).

They are plain data (floats, ints, numpy arrays), so a job thread can hand them to
other threads and the store can write them without touching the live model. The names they key their
values by are declared here once: the attention kinds of a snapshot's patterns and the evaluation metrics.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

import numpy as np

AttentionKind = Literal["enc_self", "dec_self", "cross"]  # which attention a pattern or a head belongs to
ENC_SELF: AttentionKind = "enc_self"  # the encoder's self-attention (encoder-decoder only)
DEC_SELF: AttentionKind = "dec_self"  # the decoder's (causal) self-attention: every Transformer has it
CROSS: AttentionKind = "cross"  # the decoder's attention over the encoder's output (encoder-decoder only)
ATTENTION_KINDS: tuple[AttentionKind, ...] = (ENC_SELF, DEC_SELF, CROSS)  # in the order their figures stand

Metric = Literal["loss", "token_acc", "exact_match", "predictable_acc"]  # a measure at an evaluation (EvalRecord)
LOSS: Metric = "loss"  # mean cross-entropy in nats over the scored positions
TOKEN_ACC: Metric = "token_acc"  # the share of scored tokens whose argmax is right
EXACT_MATCH: Metric = "exact_match"  # the share of sequences with every scored token right
PREDICTABLE_ACC: Metric = "predictable_acc"  # the token accuracy on the predictable positions only (induction)


@dataclass(frozen=True)
class StepRecord:
    """One optimisation step (sent every `log_every` steps and at the last step)."""

    step: int  # 1-based count of optimizer steps done
    loss: float  # training loss on this step's batch (answer positions only)
    lr: float
    grad_norm: float  # global gradient norm before clipping
    tokens: int  # cumulative input tokens processed (decoder input, plus encoder input for encoder-decoder)
    elapsed_s: float  # wall seconds since training started
    tokens_per_s: float  # throughput over the recent window


@dataclass(frozen=True)
class EvalRecord:
    """Metrics at one evaluation (lab/evaluation.py): held-out at the training lengths (no prefix), held out
    beyond them (`ood_`), and on samples of the training distribution (`train_`: modular addition's training
    pairs, the text's training part; for generated tasks fresh sequences at the training lengths), so
    training and held-out curves can be drawn side by side. Losses are mean cross-entropy in nats over the
    scored positions; `predictable_acc` counts only the positions a perfect model can get right (induction:
    the repeat after its first token), None for tasks where that is every scored position. A record stored
    before a field existed reads it as None."""

    step: int
    elapsed_s: float
    tokens: int
    loss: float
    token_acc: float
    exact_match: float
    ood_loss: Optional[float] = None  # None when the task has no longer lengths
    ood_token_acc: Optional[float] = None
    ood_exact_match: Optional[float] = None
    train_loss: Optional[float] = None  # the training distribution, on half as many samples as held out
    train_token_acc: Optional[float] = None
    train_exact_match: Optional[float] = None
    predictable_acc: Optional[float] = None  # held-out, at the training lengths
    train_predictable_acc: Optional[float] = None


@dataclass(frozen=True)
class SnapshotRecord:
    """Attention patterns for the run's fixed probe input at one step, and the weights then.

    `patterns` maps an AttentionKind to an array
    of shape (n_layers, n_heads, T_query, T_key), post-softmax, float32. `weights` holds float16
    copies of the model's parameters at this step (state_dict names), so that interventions can run on
    the model as it was then; empty for models too large to keep them (lab/trainer.py).
    """

    step: int
    patterns: dict[AttentionKind, np.ndarray] = field(default_factory=dict)
    weights: dict[str, np.ndarray] = field(default_factory=dict)


Record = StepRecord | EvalRecord | SnapshotRecord
