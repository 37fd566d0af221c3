"""FastAdamW and clip_grad_norm give torch's numbers, bit for bit, with the trainer's two param groups."""
from __future__ import annotations

import math

import pytest
import torch

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.optim import FastAdamW, clip_grad_norm
from lab.tasks import get_task
from lab.trainer import build_model, lr_at, make_optimizer

CFG = RunConfig(
    model=ModelConfig(n_layers=2, n_heads=2, d_model=16, d_ff=32, n_ctx=32, pos="learned"),
    task=TaskConfig(name="reverse", max_len=5, n_symbols=5),
    train=TrainConfig(steps=12, warmup=3, lr=3e-3, weight_decay=0.1, batch_size=8, device="cpu"),
)


def batches(n: int) -> list:
    gen = torch.Generator().manual_seed(0)
    task = get_task(CFG.task.name)
    return [task.batch(CFG.task, CFG.model.arch, CFG.train.batch_size, gen) for _ in range(n)]


def trained(fast: bool, max_norm: float, skip: str | None = None) -> tuple[dict, list[float]]:
    """Weights and grad norms after 12 steps with a changing lr; `skip` names a parameter whose gradient
    is dropped on odd steps (a parameter without a gradient: torch's optimiser skips it)."""
    model = build_model(CFG)
    opt = make_optimizer(model, CFG.train)
    assert opt.defaults["fused"]
    fast_opt = FastAdamW(opt)
    params = list(model.parameters())
    norms = []
    for step, b in enumerate(batches(CFG.train.steps)):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, CFG.train)
        opt.zero_grad(set_to_none=True)
        model(b.inp, b.src, b.tgt).loss.backward()
        if skip is not None and step % 2:
            dict(model.named_parameters())[skip].grad = None
        grads = [p for p in params if p.grad is not None]
        if fast:
            norms.append(float(clip_grad_norm([p.grad for p in grads], max_norm)))
            fast_opt.step()
        else:
            norms.append(float(torch.nn.utils.clip_grad_norm_(grads, max_norm)))
            opt.step()
    return {k: v.clone() for k, v in model.state_dict().items()}, norms


@pytest.mark.parametrize("max_norm", [0.05, 1.0, math.inf])
@pytest.mark.parametrize("skip", [None, "head.weight"])
def test_fast_step_equals_torch_bit_for_bit(max_norm, skip):
    ref, ref_norms = trained(False, max_norm, skip)
    got, got_norms = trained(True, max_norm, skip)
    assert got_norms == ref_norms
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    untrained = build_model(CFG).state_dict()
    assert not torch.equal(got["head.weight"], untrained["head.weight"])  # it did train


def test_clip_scales_to_the_limit_and_returns_the_norm_before():
    grads = [torch.full((3,), 3.0), torch.full((4,), 4.0)]
    before = math.sqrt(3 * 9 + 4 * 16)
    total = clip_grad_norm(grads, 1.0)
    assert float(total) == pytest.approx(before)
    assert float(torch.linalg.vector_norm(torch.cat(grads))) == pytest.approx(1.0, rel=1e-5)
    small = [torch.full((2,), 0.1)]
    assert float(clip_grad_norm(small, 1.0)) == pytest.approx(math.sqrt(0.02))
    assert torch.equal(small[0], torch.full((2,), 0.1))  # under the limit: unchanged
    big = [torch.full((2,), 10.0)]
    clip_grad_norm(big, math.inf)
    assert torch.equal(big[0], torch.full((2,), 10.0))


def test_an_unfused_optimiser_goes_through_torch():
    model = build_model(CFG)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    fast = FastAdamW(opt)
    assert not fast.fused
    b = batches(1)[0]
    model(b.inp, b.src, b.tgt).loss.backward()
    before = model.head.weight.detach().clone()
    fast.step()
    assert opt.state[model.head.weight]["step"] == 1 and not torch.equal(before, model.head.weight)
