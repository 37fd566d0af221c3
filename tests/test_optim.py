"""FastAdamW and clip_grad_norm give torch's numbers, bit for bit, with the trainer's two param groups.

lab/optim.py calls torch's private fused AdamW kernel directly (it saves ~1% of a small training step,
benchmarks/optim_step.py) and torch's foreach ops. A torch upgrade that removes or changes them fails
the schema tests here, loudly, saying what to do; meanwhile FastAdamW falls back to `opt.step()` with a
warning (tested with the kernel missing, with a new signature, with other numbers, and failing later),
so training never breaks or goes silently wrong.
"""
from __future__ import annotations

import ast
import logging
import math
from pathlib import Path

import pytest
import torch

import lab.optim
from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.optim import FUSED_ADAMW_KEYWORDS, FUSED_ADAMW_POSITIONAL, FastAdamW, clip_grad_norm
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


def trained(fast: bool, max_norm: float, skip: str | None = None) -> tuple[dict, list[float], FastAdamW]:
    """Weights and grad norms after 12 steps with a changing lr, and the FastAdamW used; `skip` names a
    parameter whose gradient is dropped on odd steps (a parameter without a gradient: torch's optimiser
    skips it)."""
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
    return {k: v.clone() for k, v in model.state_dict().items()}, norms, fast_opt


@pytest.mark.parametrize("max_norm", [0.05, 1.0, math.inf])
@pytest.mark.parametrize("skip", [None, "head.weight"])
def test_fast_step_equals_torch_bit_for_bit(max_norm, skip):
    ref, ref_norms, _ = trained(False, max_norm, skip)
    got, got_norms, fast = trained(True, max_norm, skip)
    assert fast.fused  # it took the direct path (no fallback)
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




def test_the_direct_path_does_not_go_through_opt_step(monkeypatch):
    model = build_model(CFG)
    opt = make_optimizer(model, CFG.train)
    fast = FastAdamW(opt)
    b = batches(1)[0]
    model(b.inp, b.src, b.tgt).loss.backward()
    monkeypatch.setattr(opt, "step", lambda *a, **k: pytest.fail("went through opt.step()"))
    before = model.head.weight.detach().clone()
    fast.step()
    assert fast.fused and not torch.equal(before, model.head.weight)
    assert int(opt.state[model.head.weight]["step"]) == 1


# ---- the private torch API lab/optim.py uses: still there, with the arguments it passes? ----

FUSED_TO_DO = (
    "lab/optim.py's FastAdamW calls torch._fused_adamw_ (torch's private fused AdamW kernel, aten::_fused_adamw_) "
    "directly, to save ~1% of a small training step. With torch {v}, {problem}. Training still works: "
    "FastAdamW checks the direct call against torch.optim.AdamW once per process and otherwise steps through "
    "opt.step(), with a warning. To fix: read how this torch calls the kernel (_fused_adam in "
    "torch/optim/adam.py), update _direct_step and FUSED_ADAMW_POSITIONAL / FUSED_ADAMW_KEYWORDS in lab/optim.py "
    "to match, check that test_fast_step_equals_torch_bit_for_bit passes, and rerun benchmarks/optim_step.py; if "
    "the direct call no longer saves >= 1% of the S step there, make FastAdamW.step() just call opt.step().")
FOREACH_TO_DO = (
    "lab/optim.py calls torch.{name} (one of torch's underscore-named foreach ops: clip_grad_norm uses "
    "_foreach_norm and _foreach_mul_, FastAdamW _foreach_add_ and _foreach_sub_ for the step counts). With torch "
    "{v}, {problem}. Fix lab/optim.py: use the public successors in torch.foreach where this torch has them, or "
    "torch.nn.utils.get_total_norm(grads) and per-tensor in-place ops; then check that "
    "test_fast_step_equals_torch_bit_for_bit still passes and rerun benchmarks/optim_step.py.")
# name: (the overload lab/optim.py reaches, its leading argument names)
FOREACH_OPS = {"_foreach_norm": ("Scalar", ["self", "ord"]), "_foreach_mul_": ("Tensor", ["self", "other"]),
               "_foreach_add_": ("Scalar", ["self", "scalar"]), "_foreach_sub_": ("Scalar", ["self", "scalar"])}


def test_the_fused_adamw_kernel_still_takes_what_fast_adamw_passes():
    def fail(problem: str) -> None:
        pytest.fail(FUSED_TO_DO.format(v=torch.__version__, problem=problem), pytrace=False)

    if not callable(getattr(torch, "_fused_adamw_", None)):
        fail("torch._fused_adamw_ is gone")
    packet = getattr(torch.ops.aten, "_fused_adamw_", None)
    if packet is None or "default" not in packet.overloads():
        fail("the operator aten::_fused_adamw_ has no default overload any more")
    schema = packet.default._schema
    args = {a.name: a for a in schema.arguments}
    positional = [a.name for a in schema.arguments if not a.kwarg_only]
    keywords = [a.name for a in schema.arguments if a.kwarg_only]
    required = [a.name for a in schema.arguments if a.kwarg_only and not a.has_default_value()]
    if positional != list(FUSED_ADAMW_POSITIONAL):
        fail(f"its positional arguments are {positional}, FastAdamW passes {list(FUSED_ADAMW_POSITIONAL)} ({schema})")
    if set(keywords) != set(FUSED_ADAMW_KEYWORDS):
        fail(f"its keyword arguments are {keywords}, FastAdamW passes {list(FUSED_ADAMW_KEYWORDS)} ({schema})")
    if not set(required) <= set(FUSED_ADAMW_KEYWORDS):
        fail(f"it requires {sorted(set(required) - set(FUSED_ADAMW_KEYWORDS))} now ({schema})")
    want = {**{n: "List[Tensor]" for n in FUSED_ADAMW_POSITIONAL},
            **{n: "float" for n in ("lr", "beta1", "beta2", "weight_decay", "eps")},
            "amsgrad": "bool", "maximize": "bool", "grad_scale": "Optional[Tensor]", "found_inf": "Optional[Tensor]"}
    changed = {n: str(args[n].type) for n, t in want.items() if str(args[n].type) != t}
    if changed or schema.returns:
        fail(f"argument types changed: {changed or 'none'}, returns {[str(r.type) for r in schema.returns]} ({schema})")


@pytest.mark.parametrize("name", sorted(FOREACH_OPS))
def test_the_foreach_ops_lab_optim_calls_still_exist(name):
    overload, leading = FOREACH_OPS[name]

    def fail(problem: str) -> None:
        pytest.fail(FOREACH_TO_DO.format(name=name, v=torch.__version__, problem=problem), pytrace=False)

    if not callable(getattr(torch, name, None)):
        fail(f"torch.{name} is gone")
    packet = getattr(torch.ops.aten, name, None)
    if packet is None or overload not in packet.overloads():
        fail(f"the operator aten::{name} has no overload {overload!r} any more "
             f"(it has {packet.overloads() if packet is not None else 'none'})")
    schema = getattr(packet, overload)._schema
    names = [a.name for a in schema.arguments]
    if names[:len(leading)] != leading or any(a.kwarg_only for a in schema.arguments[:len(leading)]):
        fail(f"aten::{name}.{overload} takes other arguments now: {schema}")
    if name == "_foreach_norm" and schema.arguments[1].default_value != 2:
        fail(f"aten::{name}.{overload}'s default norm is no longer the 2-norm: {schema}")
    if name.endswith("_") and not schema.is_mutable:
        fail(f"aten::{name}.{overload} no longer works in place: {schema}")


def test_lab_optim_calls_no_other_private_torch_api():
    """A new private torch call in lab/optim.py needs a schema test here, as the ones above."""
    def root(node: ast.AST) -> str:  # torch.ops.aten._x -> "torch"
        while isinstance(node, ast.Attribute):
            node = node.value
        return node.id if isinstance(node, ast.Name) else ""

    allowed = {"_fused_adamw_", *FOREACH_OPS}
    tree = ast.parse(Path(lab.optim.__file__).read_text())
    private = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and root(n) == "torch"
               and n.attr.startswith("_") and not n.attr.startswith("__")}
    private |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("torch")
                for a in n.names if a.name.startswith("_")}
    assert private <= allowed, (
        f"lab/optim.py calls private torch API {sorted(private - allowed)}: go through torch's public API unless "
        "benchmarks/optim_step.py shows the private call saves >= 1% of a training step; if it does, add a schema "
        "test for it here and a fallback to the public call (see lab/optim.py's docstring)")


# ---- the fallback: what a torch without the kernel, or with a changed one, does to training ----

class TorchAs:
    """`torch` as lab/optim.py would see a torch whose `_fused_adamw_` is missing or replaced; torch's own
    optimiser (the fallback and the reference) keeps the real kernel."""

    def __init__(self, kernel=None) -> None:
        self._kernel = kernel

    def __getattr__(self, name: str):
        if name == "_fused_adamw_":
            if self._kernel is None:
                raise AttributeError("module 'torch' has no attribute '_fused_adamw_'")
            return self._kernel
        return getattr(torch, name)


def changed_signature(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
                      weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None, new_required):
    raise AssertionError("not reached: the call misses `new_required`")


def counts_the_step_itself(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **kw):
    """A kernel that moved the step increment inside: the same call, other numbers, no error."""
    torch._foreach_add_(state_steps, 1)
    torch._fused_adamw_(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **kw)


def fails_after_the_first_training_step():
    calls = []

    def kernel(self, *a, **kw):
        if len(self) > 1:  # a real param group (the one-time check steps a single tensor)
            calls.append(1)
            if len(calls) > 2:  # both groups of the first step went through
                raise RuntimeError("simulated: the kernel rejects this call")
        torch._fused_adamw_(self, *a, **kw)
    return kernel


@pytest.mark.parametrize("kernel, stays_fused", [
    (None, False), (changed_signature, False), (counts_the_step_itself, False),
    (fails_after_the_first_training_step(), False), (torch._fused_adamw_, True)],
    ids=["missing", "new signature", "other numbers", "fails later", "unchanged"])
def test_without_a_matching_kernel_fast_adamw_falls_back_to_torch(kernel, stays_fused, monkeypatch, caplog):
    monkeypatch.setattr(lab.optim, "torch", TorchAs(kernel))
    monkeypatch.setattr(lab.optim, "_CHECKED", {})
    monkeypatch.setattr(lab.optim, "_WARNED", False)
    ref, ref_norms, _ = trained(False, 1.0)
    with caplog.at_level(logging.WARNING, logger="lab.optim"):
        got, got_norms, fast = trained(True, 1.0)
        trained(True, 1.0)  # a second run in the same process: no second warning
    assert fast.fused is stays_fused
    assert got_norms == ref_norms
    assert all(torch.equal(ref[k], got[k]) for k in ref), "the fallback changed the numbers"
    warnings = [r.getMessage() for r in caplog.records if r.name == "lab.optim"]
    assert len(warnings) == (0 if stays_fused else 1), warnings
    if warnings:
        assert "stepping through torch.optim.AdamW.step() instead" in warnings[0]
