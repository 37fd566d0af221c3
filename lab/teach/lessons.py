"""The numbers behind the Learn pages, computed live from one model (pure functions, no gradio).

A `Subject` is the model a page explains: a stored run's final weights, or the seeded
initialisation of a config (a fresh, untrained model). Every function loads its own fresh
model (`lab.views.analysis.load_model`), so nothing here touches a model a job is training.
Intermediate values of the first layer are read with forward hooks on that private instance,
so they are exactly what the model computes (tests compare them with `lab.views.analysis.attention`).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Optional

import numpy as np
import torch
from torch import Tensor

from lab.hooks import HookPoint, hooks_on
from lab.params import param_formula
from lab.views.analysis import ProbeInput, attention, load_model, parse_probe, positional_view, sampled_probe
from lab.config import RunConfig
from lab.model import Transformer
from lab.positional import sinusoidal_table
from lab.tasks.batches import Batch, get_task

LN_MIN_LAYERS = 6  # the pre/post-LN exercise uses at least this many layers, so a trend can show
LN_BATCH = 16


@dataclass(frozen=True, eq=False)
class Subject:
    cfg: RunConfig
    weights: Optional[dict[str, Tensor]]  # trained weights; None = the config's seeded initialisation
    source: str  # one line for the page: which model the pictures show
    step: Optional[int] = None  # the training step of `weights`, where known: measured sentences quote it
    # the run's history, read when a page needs it: (role scores per snapshot step, held-out loss per evaluation)
    history: Optional[Callable[[], tuple[list, list[tuple[int, float]]]]] = None

    @property
    def trained(self) -> bool:
        return self.weights is not None

    def model(self) -> Transformer:
        return load_model(self.cfg, self.weights)

    def probe(self, text: str = "") -> ProbeInput:
        """The typed input (ConfigError("probe", ...) if invalid), else the run's fixed probe."""
        return parse_probe(self.cfg, text) if text and text.strip() else sampled_probe(self.cfg)


def default_subject() -> Subject:
    cfg = RunConfig()
    m = cfg.model
    return Subject(cfg, None, f"a fresh, untrained model built from the default config ({cfg.task.name}, {m.arch}, "
                              f"{m.pos} positions, {m.norm}-LN, {m.n_layers} layers, {m.n_heads} heads, "
                              f"d_model {m.d_model})")


def train_len(cfg: RunConfig) -> int:
    """Longest sequence (decoder input or encoder input) the run trains on."""
    task = get_task(cfg.task.name)
    batch = task.batch(cfg.task, cfg.model.arch, 1, torch.Generator().manual_seed(0),
                       max(task.lengths(cfg.task, "train")), "train")
    return max(batch.inp.shape[1], batch.src.shape[1] if batch.src is not None else 0)


@contextmanager
def captured(model: Transformer, names: list[str]) -> Iterator[dict[str, Tensor]]:
    """name -> the activation at each of the model's hook points `names` (lab/hooks.py), detached, recorded
    while the block runs."""
    seen: dict[str, Tensor] = {}

    def record(x: Tensor, hook: HookPoint) -> None:
        seen[hook.name] = x.detach()
    with hooks_on(model.hook_dict, [(n, record) for n in names]):
        yield seen


# ---- embedding -------------------------------------------------------------------------
def embedding_table(subject: Subject) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(E (V, d), one label per token id, cosine similarity between rows (V, V)); the token embedding of
    Vaswani et al. 2017, sec. 3.4 (not tied to the output head here)."""
    tc = subject.cfg.task
    task = get_task(tc.name)
    table = subject.model().tok_emb.weight.detach().double().numpy()
    unit = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-12)
    return table, [task.label(tc, t) for t in range(table.shape[0])], unit @ unit.T


# ---- positions beyond the training length ------------------------------------------------
@dataclass(frozen=True)
class PositionsBeyond:
    train_len: int  # positions 0..train_len-1 are reached by training sequences
    n_ctx: int
    sin_next: Optional[np.ndarray]  # (n-1,) cos(p_t, p_t+1) for the sinusoidal table, past n_ctx; None: odd d
    learned_next: np.ndarray  # (n_ctx-1,) the same for a learned table
    learned_moved: np.ndarray  # (n_ctx,) |p_t(trained) - p_t(init)| of the learned table
    learned_source: str  # whose learned table it is


def _next_similarity(table: np.ndarray) -> np.ndarray:
    unit = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-12)
    return (unit[:-1] * unit[1:]).sum(1)


def positions_beyond(subject: Subject) -> PositionsBeyond:
    """Sinusoidal (Vaswani et al. 2017, sec. 3.5) against learned positions (GPT-2, Radford et al. 2019)
    past the training length: a learned row only moves where training sequences reach it."""
    cfg = subject.cfg
    n_ctx, d = cfg.model.n_ctx, cfg.model.d_model
    sin = None if d % 2 else _next_similarity(sinusoidal_table(n_ctx + max(8, n_ctx // 4), d).double().numpy())
    if cfg.model.pos == "learned":
        init = positional_view(cfg, None, n_ctx).table
        now = positional_view(cfg, subject.weights, n_ctx).table if subject.trained else init
        source = "this run's table" + ("" if subject.trained else " (untrained)")
    else:
        cfg = replace(cfg, model=replace(cfg.model, pos="learned"))
        init = now = positional_view(cfg, None, n_ctx).table
        source = f"an untrained learned table of the same size (this run uses {subject.cfg.model.pos})"
    return PositionsBeyond(train_len(subject.cfg), n_ctx, sin, _next_similarity(now),
                           np.linalg.norm(now - init, axis=1), source)


# ---- first-layer self-attention ----------------------------------------------------------
@dataclass(frozen=True)
class AttentionParts:
    """Layer 0 of the decoder's self-attention for one input, step by step: scaled dot-product
    attention with the causal mask (Vaswani et al. 2017, sec. 3.2.1 and 3.2.3)."""
    labels: list[str]  # decoder input tokens
    h: np.ndarray  # (T, d) the sublayer's input (after its LN for pre-LN)
    q: np.ndarray  # (H, T, d_k), after RoPE's rotation where used
    k: np.ndarray  # (H, T, d_k)
    v: np.ndarray  # (H, T, d_k)
    raw: np.ndarray  # (H, T, T) q.k (+ ALiBi's bias), before scaling and masking
    scores: np.ndarray  # (H, T, T) q.k / sqrt(d_k) (+ ALiBi's bias), before the mask
    future: np.ndarray  # (T, T) True where the causal mask hides key j from query i
    pattern: np.ndarray  # (H, T, T) softmax of the masked scores: the model's attention
    unscaled: np.ndarray  # (H, T, T) softmax of the masked, unscaled scores (the scaling removed)
    unit: np.ndarray  # (2, H, T, T) the same two patterns with q and k rescaled to unit-variance entries


def first_layer_attention(subject: Subject, probe: ProbeInput) -> AttentionParts:
    model, b = subject.model(), probe.batch
    block = model.decoder[0]
    attn = block.self_attn
    points = ["blocks.0.hook_resid_pre"] + [f"blocks.0.attn.hook_{n}" for n in "qkv"]
    with torch.no_grad(), captured(model, points) as seen:
        model(b.inp, b.src)
        stream = seen["blocks.0.hook_resid_pre"]  # (1, T, d)
        h = block.ln1(stream) if block.norm == "pre" else stream  # what the attention reads
    T = h.shape[1]
    q, k, v = (seen[f"blocks.0.attn.hook_{n}"].transpose(1, 2) for n in "qkv")  # (1, T, H, dk) -> (1, H, T, dk)
    if attn.q_norm is not None:  # QK-norm: as the model does, before any rotation
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = model.pos.rotate(q, k)
    raw = q @ k.transpose(-2, -1)  # (1, H, T, T)
    bias = model.pos.attn_bias(T, T, False, h.device)  # (H, T, T) or None
    bias = 0.0 if bias is None else bias
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = raw * attn.scale + bias  # the model's own scaling (1/sqrt(dk), or none when it is removed)
    pattern = scores.masked_fill(future, float("-inf")).softmax(-1)
    unscaled = (raw + bias).masked_fill(future, float("-inf")).softmax(-1)
    # what the paper's argument assumes (unit-variance entries): an untrained model's q and k are tiny,
    # so with or without the scaling its softmax is near uniform and the difference cannot be seen
    unit_raw = (q / q.std().clamp(min=1e-12)) @ (k / k.std().clamp(min=1e-12)).transpose(-2, -1)  # (1, H, T, T)
    unit = torch.stack([(s + bias).masked_fill(future, float("-inf")).softmax(-1)
                        for s in (unit_raw / math.sqrt(attn.d_head), unit_raw)])  # (2, 1, H, T, T)
    np_ = lambda t: t[0].double().numpy()  # noqa: E731  drop the batch dim
    return AttentionParts(probe.dec_labels, np_(h), np_(q), np_(k), np_(v), np_(raw + bias), np_(scores),
                          future.numpy(), np_(pattern), np_(unscaled), unit[:, 0].double().numpy())


def dot_product_spread(d_ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
                       n: int = 4096, seed: int = 0, keys: int = 16, rows: int = 512) -> dict[str, np.ndarray]:
    """Standard deviation of q.k and of q.k/sqrt(d_k) for q, k with independent N(0, 1) entries, and the mean
    entropy (nats) of one query's softmax over `keys` such keys, with and without the scaling (`rows`
    queries): the argument for the scaling (Vaswani et al. 2017, sec. 3.2.1, footnote 4). Uniform attention
    over `keys` keys has entropy ln(keys); a one-hot row has 0."""
    gen = torch.Generator().manual_seed(seed)
    raw, scaled, h_raw, h_scaled = [], [], [], []
    for dk in d_ks:
        q, k = torch.randn(n, dk, generator=gen, dtype=torch.float64), torch.randn(n, dk, generator=gen,
                                                                                    dtype=torch.float64)
        dots = (q * k).sum(1)
        raw.append(float(dots.std()))
        scaled.append(float((dots / math.sqrt(dk)).std()))
        qs = torch.randn(rows, 1, dk, generator=gen, dtype=torch.float64)
        ks = torch.randn(rows, keys, dk, generator=gen, dtype=torch.float64)
        scores = (qs * ks).sum(-1)  # (rows, keys)
        for out, s_ in ((h_raw, scores), (h_scaled, scores / math.sqrt(dk))):
            p = torch.softmax(s_, -1)
            out.append(float(-(p * p.clamp_min(1e-300).log()).sum(-1).mean()))
    return {"d_k": np.array(d_ks), "unscaled": np.array(raw), "scaled": np.array(scaled),
            "entropy_unscaled": np.array(h_raw), "entropy_scaled": np.array(h_scaled), "keys": keys}


# ---- what leaks without the causal mask ------------------------------------------------------
@dataclass(frozen=True)
class Leak:
    changed: int  # the decoder input position whose token was changed
    masked: np.ndarray  # (T,) largest |change| of the logits at each position, with the mask
    unmasked: np.ndarray  # (T,) the same with the decoder's causal mask removed


@torch.no_grad()
def causal_leak(subject: Subject, probe: ProbeInput, position: Optional[int] = None) -> Leak:
    """Change one decoder token; see which positions' logits move, with and without the causal mask
    (Vaswani et al. 2017, sec. 3.2.3: masking keeps the model auto-regressive)."""
    model, b = subject.model(), probe.batch
    t = b.inp.shape[1] // 2 if position is None else position
    other = b.inp.clone()
    other[0, t] = (other[0, t] + 1) % model.vocab_size  # (1, T): a different token at t

    def change() -> np.ndarray:
        a, c = model(b.inp, b.src).logits, model(other, b.src).logits  # (1, T, vocab)
        return (a - c).abs().amax(-1)[0].double().numpy()

    masked = change()
    for block in model.decoder:  # this private copy only: every decoder block sees the future
        block.causal = False
    return Leak(t, masked, change())


# ---- pre-LN vs post-LN at initialisation ---------------------------------------------------
@dataclass(frozen=True)
class NormPlacement:
    n_layers: int
    grad: dict[tuple[str, str], np.ndarray]  # (init "xavier"/"lab", norm "pre"/"post") -> (L,) grad norms
    stream: dict[tuple[str, str], np.ndarray]  # (init, norm) -> (L + 1,) RMS of the residual stream
    # entering each decoder layer, then leaving the last


def norm_placement(cfg: RunConfig) -> NormPlacement:
    """Gradient norm of each decoder layer's weight matrices after one backward pass at init, and the
    residual stream's size, for pre-LN and post-LN models that differ only in the norm placement
    (Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture", sec. 3)."""
    from lab.trainer import build_model  # the trainer owns seeded initialisation

    n_layers = max(cfg.model.n_layers, LN_MIN_LAYERS)
    task = get_task(cfg.task.name)
    batch = task.batch(cfg.task, cfg.model.arch, LN_BATCH, torch.Generator().manual_seed(cfg.train.seed))
    grad: dict[tuple[str, str], np.ndarray] = {}
    stream: dict[tuple[str, str], np.ndarray] = {}
    for init in ("xavier", "lab"):
        for norm in ("pre", "post"):
            model = build_model(replace(cfg, model=replace(cfg.model, norm=norm, n_layers=n_layers))).eval()
            if init == "xavier":  # the same weights for both placements: one generator, one order
                gen = torch.Generator().manual_seed(cfg.train.seed)
                for mod in model.modules():
                    if isinstance(mod, torch.nn.Linear):
                        torch.nn.init.xavier_uniform_(mod.weight, generator=gen)
            grad[(init, norm)], stream[(init, norm)] = _layer_grads(model, batch)
    return NormPlacement(n_layers, grad, stream)


def _layer_grads(model: Transformer, b: Batch) -> tuple[np.ndarray, np.ndarray]:
    n = len(model.decoder)
    with captured(model, ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(n)]) as seen:
        model(b.inp, b.src, targets=b.tgt).loss.backward()
    rms = [float(seen["blocks.0.hook_resid_pre"].pow(2).mean().sqrt())]
    rms += [float(seen[f"blocks.{i}.hook_resid_post"].pow(2).mean().sqrt()) for i in range(n)]
    norms = [math.sqrt(sum(float(p.grad.pow(2).sum()) for p in blk.parameters() if p.dim() == 2 and p.grad is not None))
             for blk in model.decoder]
    return np.array(norms), np.array(rms)


# ---- feed-forward ------------------------------------------------------------------------
@torch.no_grad()
def ff_units(subject: Subject, probe: ProbeInput) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(inputs W1 x + b1, outputs phi(.)) of the first decoder layer's hidden units, each (T, d_ff);
    gated: (the gate x W + b, act(gate) * (x V + c)), each (T, hidden); None for attention-only models."""
    model, b = subject.model(), probe.batch
    ff = model.decoder[0].ff
    if ff is None:
        return None
    with captured(model, ["blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_post"]) as seen:
        model(b.inp, b.src)
    # (T, hidden) each: the activation's input (gated: the gate) and what the second projection reads
    return seen["blocks.0.mlp.hook_pre"][0].double().numpy(), seen["blocks.0.mlp.hook_post"][0].double().numpy()


# ---- heads, cross-attention, output ------------------------------------------------------
def patterns(subject: Subject, probe: ProbeInput) -> dict[str, np.ndarray]:
    """kind -> (n_layers, n_heads, Tq, Tk), as the Inspect tab computes them."""
    return attention(subject.model(), probe.batch)


def as_encoder_decoder(subject: Subject) -> Subject:
    """The subject itself if it is an encoder-decoder; else an untrained one of the same shape and task
    (ConfigError if the task needs a decoder-only model)."""
    if subject.cfg.model.arch == "encoder-decoder":
        return subject
    cfg = replace(subject.cfg, model=replace(subject.cfg.model, arch="encoder-decoder"))
    return Subject(cfg, None, "an untrained encoder-decoder of the same shape and task (the selected model "
                              "is decoder-only)")


@torch.no_grad()
def next_token_probs(subject: Subject, probe: ProbeInput) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(probabilities (T, V), symbol labels, target id per position or IGNORE_INDEX where not scored)."""
    b = probe.batch
    probs = subject.model()(b.inp, b.src).logits[0].softmax(-1).double().numpy()
    tc = subject.cfg.task
    labels = [get_task(tc.name).label(tc, t) for t in range(probs.shape[1])]
    return probs, labels, b.tgt[0].numpy()


def params_by_layers(cfg: RunConfig, max_layers: int = 12) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(layer counts 1..max, component -> count at each), from the closed form in lab.views.analysis."""
    vocab = get_task(cfg.task.name).vocab_size(cfg.task)
    layers = np.arange(1, max(max_layers, cfg.model.n_layers) + 1)
    rows = [param_formula(replace(cfg.model, n_layers=int(n)), vocab) for n in layers]
    return layers, {c: np.array([r[c] for r in rows]) for c in rows[0]}
