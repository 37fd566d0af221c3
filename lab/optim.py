"""The optimiser step and gradient clipping of a training step (lab.trainer.train_step), with less Python.

`FastAdamW` runs AdamW (Loshchilov & Hutter 2019, decoupled weight decay) through the same fused
kernel as `torch.optim.AdamW(fused=True)`, and `clip_grad_norm` computes the same norm and scale as
`torch.nn.utils.clip_grad_norm_` with foreach kernels; both give torch's numbers bit for bit
(tests/test_optim.py). What they leave out is per-step Python: torch's optimiser groups the tensors
by device and dtype, checks hooks and flags and rebuilds its state lists on every step, and
clip_grad_norm_ groups and validates the gradients again.

Measured (benchmarks/optim_step.py, benchmarks/RESULTS.md; torch 2.13, 1 CPU thread, 2026-11-23):
one model and optimiser stepped by `train_step` and by the same step through `clip_grad_norm_` +
`AdamW.step()` in interleaved rounds, each call timed inside the real training steps. At the
throughput benchmark's S config (the app's default model size, 23.8 ms a step on a quiet machine)
FastAdamW's step took 0.21 ms against AdamW.step's 0.43 ms: 0.22 ms, 0.93% of the step (0.8-1.2%
over five runs, loaded or quiet); clip_grad_norm 0.22 ms against clip_grad_norm_'s 0.39 ms (0.68%).
The whole step: torch / lab 1.008 (q25-q75 1.00-1.03; the control, torch / torch, 1.003), 1.00-1.02
over the runs. At M (145 ms) and L (492 ms) the savings are 0.06-0.21% of a step. (Timed in a hot
loop instead, the AdamW saving looks 3x smaller, 0.07 ms: after a forward and backward, torch's
Python around the kernel runs on cold caches.)

About 1% of the app's default step (1.6% with the clip) is why FastAdamW keeps calling torch's
*private* kernel `torch._fused_adamw_`: a borderline call, made safe by the guards below. A private
kernel has no stable contract: an upgrade can remove it, change its arguments, or move work into or
out of it (the step count, say) so that the logic copied around it goes wrong without an error. So:
(1) tests/test_optim.py checks that `torch._fused_adamw_` exists and that its operator schema still
has the argument names, order and types FastAdamW passes (FUSED_ADAMW_POSITIONAL, _KEYWORDS), and
fails saying what to do; (2) before its first direct step on a device type, FastAdamW checks the
direct call against `torch.optim.AdamW.step()` on a tiny problem, bit for bit (~3 ms, once per
process); (3) if that check fails, or a direct call raises AttributeError, TypeError or
RuntimeError, it logs one warning and steps through `opt.step()` from then on. Training never
breaks and never goes silently wrong; at worst it loses that ~1%.

`clip_grad_norm` uses `torch._foreach_norm` and `torch._foreach_mul_` (and FastAdamW
`_foreach_add_` / `_foreach_sub_` for the step counts), also underscore-named. Kept, after the
same scrutiny: the clip saves 0.7% of the S step, and these ops carry less risk. (1) They are the
ops torch's own public `clip_grad_norm_` and its foreach and fused optimisers call in 2.13, and
torch's development docs introduce a public `torch.foreach` module while keeping the private
`torch._foreach_*` names available during the migration. (2) Their meaning is fixed by definition
(a 2-norm per tensor; an in-place multiply or add per tensor), so there is no copied logic around
them to fall out of step with torch silently: a removal or a new signature raises at the first
training step. (3) The public way from the gradient list (`torch.nn.utils.get_total_norm`, then a
Python loop of `mul_`) would launch one kernel per tensor on a GPU instead of one. A schema test in
tests/test_optim.py covers them too.
"""
from __future__ import annotations

import logging
import math

import torch
from torch import Tensor

log = logging.getLogger(__name__)

# What FastAdamW passes to torch._fused_adamw_ (aten::_fused_adamw_.default): these positional lists,
# then these keywords. tests/test_optim.py checks them against the installed torch's operator schema.
FUSED_ADAMW_POSITIONAL = ("self", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "state_steps")
FUSED_ADAMW_KEYWORDS = ("lr", "beta1", "beta2", "weight_decay", "eps", "amsgrad", "maximize", "grad_scale",
                        "found_inf")


def clip_grad_norm(grads: list[Tensor], max_norm: float) -> Tensor:
    """Scale `grads` in place so that their joint 2-norm is at most `max_norm` (nothing to scale when
    it is infinite); return the norm before scaling, as a tensor (no host sync)."""
    norms = torch._foreach_norm(grads)  # one 2-norm per tensor (aten::_foreach_norm.Scalar)
    total = torch.linalg.vector_norm(torch.stack(norms))
    if math.isfinite(max_norm):
        # as clip_grad_norm_: multiply by min(1, max_norm / (norm + 1e-6)) without branching on the value
        torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))  # aten::_foreach_mul_.Tensor
    return total


def _direct_step(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
                 steps: list[Tensor], group: dict) -> None:
    """One AdamW step of one param group through torch's fused kernel, as torch's `_fused_adam` does it
    for one device and dtype: count the step, then update params and moments in place. If the kernel
    call raises, the step count is put back, so that nothing has changed."""
    beta1, beta2 = group["betas"]
    torch._foreach_add_(steps, 1)
    try:
        torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=group["lr"], beta1=beta1,
                            beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"], amsgrad=False,
                            maximize=group["maximize"], grad_scale=None, found_inf=None)
    except BaseException:
        torch._foreach_sub_(steps, 1)
        raise


_CHECKED: dict[str, str | None] = {}  # device type -> None (the direct call gives torch's numbers) or why not


def _direct_call_problem(device: torch.device) -> str | None:
    """None if `_direct_step` gives `torch.optim.AdamW(fused=True).step()`'s numbers bit for bit on a
    tiny problem (3 steps, decay, a changing lr) on this device type; else what went wrong. Once per
    process and device type."""
    if device.type not in _CHECKED:
        try:
            init = torch.linspace(-1.0, 1.0, 7, device=device)
            ref, mine = init.clone().requires_grad_(), init.clone().requires_grad_()
            kw = {"lr": 0.01, "betas": (0.9, 0.98), "eps": 1e-8, "weight_decay": 0.1, "fused": True}
            opt = torch.optim.AdamW([ref], **kw)
            group = dict(opt.param_groups[0])
            state = [torch.zeros_like(init), torch.zeros_like(init), torch.zeros((), device=device)]
            for i in range(3):
                g = torch.linspace(0.5, -0.25 * (i + 1), 7, device=device)
                opt.param_groups[0]["lr"] = group["lr"] = 0.01 / (i + 1)
                ref.grad = g.clone()
                opt.step()
                _direct_step([mine], [g.clone()], [state[0]], [state[1]], [state[2]], group)
            st = opt.state[ref]
            same = (torch.equal(ref.detach(), mine.detach()) and torch.equal(st["exp_avg"], state[0])
                    and torch.equal(st["exp_avg_sq"], state[1]) and torch.equal(st["step"], state[2]))
            _CHECKED[device.type] = None if same else "it gives other numbers than torch.optim.AdamW.step()"
        except (AttributeError, TypeError, RuntimeError, NotImplementedError) as e:
            _CHECKED[device.type] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return _CHECKED[device.type]


_WARNED = False


def _warn_once(why: str) -> None:
    global _WARNED
    if not _WARNED:
        _WARNED = True
        log.warning("lab.optim.FastAdamW: calling torch's private fused AdamW kernel directly failed with "
                    "torch %s (%s); stepping through torch.optim.AdamW.step() instead (the same numbers, ~1%% "
                    "slower at small sizes). tests/test_optim.py says what to update.", torch.__version__, why)


class FastAdamW:
    """Steps a `torch.optim.AdamW` built with `fused=True` by calling its fused kernel directly.

    The optimiser keeps its param groups (the trainer sets each group's "lr" before a step) and its
    state (exp_avg, exp_avg_sq, step), created here exactly as torch creates them. A step where
    some parameter has no gradient, an optimiser that is not fused (MPS), a group whose parameters
    differ in device or dtype, or a torch whose kernel no longer matches (see the module docstring)
    goes through `opt.step()` unchanged.
    """

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.opt = opt
        self.params = [list(g["params"]) for g in opt.param_groups]
        self.fused = bool(opt.defaults.get("fused")) and not opt.defaults.get("amsgrad")
        kinds = [{(p.device, p.dtype) for p in ps} for ps in self.params if ps]
        if self.fused and (any(len(k) > 1 for k in kinds)
                           or any(g.get("differentiable") or g.get("capturable") for g in opt.param_groups)):
            self.fused = False  # torch would split these by device and dtype, or handle them its own way
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

    def _fall_back(self, why: str) -> None:
        self.fused = False
        _warn_once(why)

    def step(self) -> None:
        grads = [[p.grad for p in params] for params in self.params]
        if self.fused and self._lists is None:  # first direct step: does this torch's kernel still match?
            device = next((p.device for ps in self.params for p in ps), None)
            problem = None if device is None else _direct_call_problem(device)
            if problem is not None:
                self._fall_back(problem)
        if not self.fused or any(g is None for gs in grads for g in gs):
            self.opt.step()  # (torch finds and updates the same state tensors in place)
            return
        done = 0
        try:
            for group, params, gs, (exp_avgs, exp_avg_sqs, steps) in zip(
                    self.opt.param_groups, self.params, grads, self._state_lists()):
                if params:
                    _direct_step(params, gs, exp_avgs, exp_avg_sqs, steps, group)
                    done += 1
        except (AttributeError, TypeError, RuntimeError) as e:  # no such kernel, a new signature, a rejected call
            if done:  # an earlier group has stepped: stepping all again through torch would step it twice
                raise
            self._fall_back(f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            self.opt.step()
