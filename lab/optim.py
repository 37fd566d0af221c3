"""The optimiser step and gradient clipping of a training step, with less Python per step.

`FastAdamW` runs AdamW (Loshchilov & Hutter 2019, decoupled weight decay) through the same fused
kernel as `torch.optim.AdamW(fused=True)`, and `clip_grad_norm` computes the same norm and scale as
`torch.nn.utils.clip_grad_norm_` with foreach kernels; both give the same numbers as torch's (a
test checks them bit for bit). What they leave out is per-step Python: torch's optimiser groups
the tensors by device and dtype, checks hooks and flags, and rebuilds its state lists on every
step, and clip_grad_norm_ groups and validates the gradients again. Profiled on the throughput
benchmark's small config (d_model 64, 2 layers, batch 64 x 32 tokens, one CPU thread): 0.35 ms for
AdamW.step and 0.27 ms for clip_grad_norm_ out of a 34 ms step; these take 0.19 and 0.14 ms.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def clip_grad_norm(grads: list[Tensor], max_norm: float) -> Tensor:
    """Scale `grads` in place so that their joint 2-norm is at most `max_norm` (nothing to scale when
    it is infinite); return the norm before scaling, as a tensor (no host sync)."""
    norms = torch._foreach_norm(grads)  # one 2-norm per tensor
    total = torch.linalg.vector_norm(torch.stack(norms))
    if math.isfinite(max_norm):
        # as clip_grad_norm_: multiply by min(1, max_norm / (norm + 1e-6)) without branching on the value
        torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


class FastAdamW:
    """Steps a `torch.optim.AdamW` built with `fused=True` by calling its fused kernel directly.

    The optimiser keeps its param groups (the trainer sets each group's "lr" before a step) and its
    state (exp_avg, exp_avg_sq, step), created here exactly as torch creates them. A step where
    some parameter has no gradient, or an optimiser that is not fused (MPS), goes through
    `opt.step()` unchanged.
    """

    def __init__(self, opt: torch.optim.AdamW) -> None:
        self.opt = opt
        self.fused = bool(opt.defaults.get("fused")) and not opt.defaults.get("amsgrad")
        self.params = [list(g["params"]) for g in opt.param_groups]
        self._lists: list[tuple[list[Tensor], list[Tensor], list[Tensor]]] | None = None

    def _state_lists(self) -> list[tuple[list[Tensor], list[Tensor], list[Tensor]]]:
        """(exp_avgs, exp_avg_sqs, steps) per group, torch's state tensors, created on first use."""
        if self._lists is None:
            out = []
            for params in self.params:
                for p in params:
                    st = self.opt.state[p]
                    if not st:  # as torch.optim.Adam._init_group with fused=True
                        st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                        st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                        st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                states = [self.opt.state[p] for p in params]
                out.append(([s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                            [s["step"] for s in states]))
            self._lists = out
        return self._lists

    def step(self) -> None:
        grads = [[p.grad for p in params] for params in self.params]
        if not self.fused or any(g is None for gs in grads for g in gs):
            self.opt.step()  # (torch finds and updates the same state tensors in place)
            return
        for group, params, gs, (exp_avgs, exp_avg_sqs, steps) in zip(
                self.opt.param_groups, self.params, grads, self._state_lists()):
            if not params:
                continue
            beta1, beta2 = group["betas"]
            torch._foreach_add_(steps, 1)
            torch._fused_adamw_(params, gs, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"],
                                beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                                maximize=group["maximize"], grad_scale=None, found_inf=None)
