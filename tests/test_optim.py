"""lab/optim.py: torch's AdamW with the trainer's weight-decay rule, shared with the batched step, and
gradient clipping through torch's public API."""
from __future__ import annotations

import ast
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import lab.optim
from lab.batched import BatchedStepper
from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.optim import EPS, clip_grad_norm, decays, make_optimizer
from lab.trainer import build_model

CFG = RunConfig(
    model=ModelConfig(n_layers=2, n_heads=2, d_model=16, d_ff=32, n_ctx=32, pos="learned"),
    task=TaskConfig(name="reverse", max_len=5, n_symbols=5),
    train=TrainConfig(steps=12, warmup=3, lr=3e-3, weight_decay=0.1, batch_size=8, device="cpu"),
)


def test_decays_matrices_but_not_biases_norms_or_embeddings():
    assert decays("blocks.0.attn.in_proj.weight", 2) and decays("head.weight", 2)
    assert not decays("blocks.0.attn.in_proj.bias", 1)
    assert not decays("blocks.0.norm1.weight", 1)
    assert not decays("tok_emb.weight", 2) and not decays("pos.weight", 2)
    # Decay embeddings (Nanda et al. 2023): the embeddings too, still no bias or norm gain
    assert decays("tok_emb.weight", 2, embeddings=True) and decays("pos.weight", 2, embeddings=True)
    assert not decays("blocks.0.norm1.weight", 1, embeddings=True)


def test_make_optimizer_is_torchs_fused_adamw_on_the_cpu():
    model = build_model(CFG)
    opt = make_optimizer(model, CFG.train)
    assert type(opt) is torch.optim.AdamW
    assert opt.defaults["fused"] and not opt.defaults["foreach"] and opt.defaults["eps"] == EPS
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            assert (group["weight_decay"] == CFG.train.weight_decay) == decays(names[id(p)], p.dim())


@pytest.mark.parametrize("embeddings", ["no", "yes"])
def test_the_batched_step_decays_what_the_solo_optimiser_decays(embeddings):
    cfg = replace(CFG, train=replace(CFG.train, decay_embeddings=embeddings))
    model = build_model(cfg)
    solo = {n: g["weight_decay"] for g in make_optimizer(model, cfg.train).param_groups
            for n, p in model.named_parameters() if any(p is q for q in g["params"])}
    batched = BatchedStepper([cfg, cfg], torch.device("cpu"))
    assert batched.wd == solo
    assert (solo["tok_emb.weight"] == cfg.train.weight_decay) == (embeddings == "yes")


def test_clip_scales_to_the_limit_and_returns_the_norm_before():
    def params(*grads: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.zeros_like(g, requires_grad=True) for g in grads]
        for p, g in zip(out, grads):
            p.grad = g.clone()
        return out

    big = params(torch.full((3,), 3.0), torch.full((4,), 4.0))
    assert float(clip_grad_norm(big, 1.0)) == pytest.approx(math.sqrt(3 * 9 + 4 * 16))
    assert float(torch.linalg.vector_norm(torch.cat([p.grad for p in big]))) == pytest.approx(1.0, rel=1e-5)
    small = params(torch.full((2,), 0.1))
    assert float(clip_grad_norm(small, 1.0)) == pytest.approx(math.sqrt(0.02))
    assert torch.equal(small[0].grad, torch.full((2,), 0.1))  # under the limit: unchanged
    unlimited = params(torch.full((2,), 10.0))
    clip_grad_norm(unlimited, math.inf)
    assert torch.equal(unlimited[0].grad, torch.full((2,), 10.0))
    no_grad = torch.zeros(2, requires_grad=True)  # a parameter without a gradient is skipped
    assert float(clip_grad_norm([no_grad, *params(torch.full((1,), 2.0))], 1.0)) == pytest.approx(2.0)


def test_lab_optim_calls_no_private_torch_api():
    def root(node: ast.AST) -> str:  # torch.ops.aten._x -> "torch"
        while isinstance(node, ast.Attribute):
            node = node.value
        return node.id if isinstance(node, ast.Name) else ""

    tree = ast.parse(Path(lab.optim.__file__).read_text())
    private = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and root(n) == "torch"
               and n.attr.startswith("_") and not n.attr.startswith("__")}
    assert not private, f"lab/optim.py calls private torch API {sorted(private)}"
