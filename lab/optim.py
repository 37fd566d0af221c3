"""The trainer's optimiser: AdamW, its weight-decay rule, and gradient clipping.

AdamW is Adam with decoupled weight decay (Loshchilov & Hutter, "Decoupled Weight Decay
Regularization", ICLR 2019; Adam: Kingma & Ba 2015). `make_optimizer` builds torch's own
`torch.optim.AdamW`, with `fused=True` where the parameters' device has torch's fused kernel (CPU,
CUDA) and the foreach kernels elsewhere; `clip_grad_norm` is `torch.nn.utils.clip_grad_norm_` with
foreach kernels (clipping by the global norm: Pascanu, Mikolov & Bengio 2013). Both stay on torch's
public API: an earlier version called torch's private fused kernel directly, and a paired benchmark
found its saving within the noise of a training step (benchmarks/RESULTS.md, "Optimiser step").

`decays` is the one weight-decay rule: the solo optimiser's parameter groups and the batched step's
own AdamW (lab/batched.py) both ask it which parameters decay.
"""
from __future__ import annotations

import torch
from torch import Tensor

from lab.config import TrainConfig

EPS = 1e-8  # AdamW's epsilon (torch's default), shared with the batched step
NO_DECAY_PREFIXES = ("tok_emb", "pos.")  # token embeddings and learned positions


def decays(name: str, ndim: int, embeddings: bool = False) -> bool:
    """Whether parameter `name` with `ndim` dimensions (without any stacking axis) gets weight decay:
    matrices do; biases and norm gains do not; embeddings (token, learned positions) only with `embeddings`
    (TrainConfig.decay_embeddings: Nanda et al. 2023 decay every weight of their grokking models, minGPT and
    GPT-2's recipe spares embeddings)."""
    return ndim >= 2 and (embeddings or not name.startswith(NO_DECAY_PREFIXES))


def param_groups(model: torch.nn.Module, weight_decay: float, embeddings: bool = False) -> list[dict]:
    """AdamW's two parameter groups for `model`: the decayed parameters, then the rest."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if decays(name, p.dim(), embeddings) else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: torch.nn.Module, tc: TrainConfig) -> torch.optim.AdamW:
    """torch's AdamW over `param_groups`: fused (one kernel for all tensors) where the device has the
    fused kernel, else foreach (one kernel per op over the tensor list)."""
    groups = param_groups(model, tc.weight_decay, tc.decay_embeddings == "yes")
    fused = all(p.device.type in ("cpu", "cuda") for p in model.parameters())
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=EPS, foreach=not fused, fused=fused)


def clip_grad_norm(params: list[Tensor], max_norm: float) -> Tensor:
    """Scale the gradients of `params` in place so that their joint 2-norm is at most `max_norm` (no
    limit when it is infinite); return the norm before scaling, as a tensor (no host sync). Parameters
    without a gradient are skipped."""
    return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
