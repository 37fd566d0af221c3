"""The training loop: learning, stopping within a step, reproducibility, schedule, weight decay,
records and snapshots, evaluation metrics; plus the slow end-to-end reverse runs."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn as nn

from lab.config import TRANSFORMERS, ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.model import ModelOutput
from lab.records import CROSS, DEC_SELF, ENC_SELF, EvalRecord, SnapshotRecord, StepRecord
from lab.tasks.batches import IGNORE_INDEX, eval_batches, get_task, probe
from lab.trainer import (
    build_model,
    evaluate,
    lr_at,
    make_optimizer,
    resolve_device,
    snapshot_steps,
    train,
)
from tests.helpers import tiny_config

CPU = torch.device("cpu")
RUN = tiny_config(n_ctx=16, n_symbols=5, steps=20, batch_size=16, lr=3e-3, warmup=5, eval_every=10, eval_samples=32,
                  snapshots=0, device="cpu", seed=0)


pytestmark = pytest.mark.usefixtures("one_thread")  # torch at one intra-op thread (tests/conftest.py)


def run(cfg: RunConfig, should_stop=None) -> tuple[object, list]:
    records: list = []
    result = train(cfg, on_record=records.append, should_stop=should_stop, threads=1)
    return result, records


def of(records: list, kind: type) -> list:
    return [r for r in records if isinstance(r, kind)]


# ---- learning ----------------------------------------------------------------------------------


def test_loss_falls_on_tiny_copy_run():
    cfg = RunConfig(
        model=ModelConfig(n_layers=1, n_heads=2, d_model=32, d_ff=64, n_ctx=16),
        task=TaskConfig(name="copy", max_len=4, n_symbols=5),
        train=TrainConfig(steps=150, batch_size=32, warmup=10, eval_every=50, eval_samples=128, snapshots=0,
                          device="cpu"),
    )
    initial, _, _ = evaluate(build_model(cfg), eval_batches(cfg.task, "decoder", "eval", 128), CPU)
    assert abs(initial - math.log(get_task("copy").vocab_size(cfg.task))) < 0.3
    result, records = run(cfg)
    assert result.steps_done == 150 and not result.stopped
    assert result.final_eval is not None and result.final_eval.step == 150
    assert result.final_eval.loss < initial / 2, (initial, result.final_eval.loss)
    losses = [r.loss for r in of(records, StepRecord)]
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) / 2
    assert result.final_train_loss == losses[-1]


# ---- stopping --------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 7, 18])  # 7: stops on an eval step; 18: on a snapshot step (17)
def test_stop_works_within_a_step(k):
    calls = []

    def should_stop() -> bool:
        calls.append(1)
        return len(calls) >= k

    result, records = run(tiny_config(RUN, steps=50, eval_every=3, snapshots=4), should_stop)
    assert result.stopped
    assert result.steps_done == k - 1  # checked before every step: k calls, k - 1 steps
    assert len(calls) == k
    steps = of(records, StepRecord)
    assert [r.step for r in steps] == list(range(1, k))
    if k > 1:  # a stopped run still ends with metrics and attention at the step it reached
        assert result.final_eval.step == k - 1
        assert of(records, EvalRecord)[-1].step == k - 1
        assert of(records, SnapshotRecord)[-1].step == k - 1
    else:
        assert result.final_eval is None
    snap_steps = [s.step for s in of(records, SnapshotRecord)]
    assert snap_steps == sorted(set(snap_steps))  # one snapshot per step
    assert result.state_dict.keys() == build_model(tiny_config(RUN)).state_dict().keys()


# ---- reproducibility ---------------------------------------------------------------------------


@pytest.mark.parametrize("arch", TRANSFORMERS)
def test_runs_are_reproducible_from_the_seed(arch):
    cfg = tiny_config(RUN, arch=arch, steps=15, eval_every=15)
    a, ra = run(cfg)
    b, rb = run(cfg)
    c, rc = run(replace(cfg, train=replace(cfg.train, seed=1)))
    la, lb, lc = ([r.loss for r in of(rs, StepRecord)] for rs in (ra, rb, rc))
    assert len(la) == 15
    assert la == lb
    assert a.final_eval.loss == b.final_eval.loss
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    assert la != lc
    assert not all(torch.equal(a.state_dict[k], c.state_dict[k]) for k in a.state_dict)


@pytest.mark.parametrize("arch", TRANSFORMERS)
def test_measuring_changes_nothing_a_run_learns(arch):
    """Evaluations and attention snapshots draw no random numbers and touch no weight: a run measured every 5
    steps with 3 snapshots ends with the same weights and the same final metrics, bit for bit, as the same run
    measured only at its last step (test_presets trains the presets whose tests read only final results so)."""
    cfg = tiny_config(RUN, arch=arch, steps=15, dropout=0.2)
    often, r_often = run(replace(cfg, train=replace(cfg.train, eval_every=5, snapshots=3)))
    once, r_once = run(replace(cfg, train=replace(cfg.train, eval_every=15, snapshots=0)))
    assert len(of(r_often, EvalRecord)) == 3 and len(of(r_often, SnapshotRecord)) == 3
    assert len(of(r_once, EvalRecord)) == 1 and not of(r_once, SnapshotRecord)
    assert all(torch.equal(often.state_dict[k], once.state_dict[k]) for k in often.state_dict)
    assert often.final_eval.loss == once.final_eval.loss and often.final_eval.ood_loss == once.final_eval.ood_loss
    assert often.final_eval.train_loss == once.final_eval.train_loss
    assert [r.loss for r in of(r_often, StepRecord)] == [r.loss for r in of(r_once, StepRecord)]


def test_runs_with_dropout_are_reproducible_in_one_process():
    """Dropout masks come from the global generator: a run repeats exactly whatever ran before it in
    the process (a worker process trains job after job)."""
    cfg = tiny_config(RUN, steps=10, eval_every=10, dropout=0.3)
    a, ra = run(cfg)
    torch.rand(1000)  # anything else drawing from the global generator between the two runs
    b, rb = run(cfg)
    assert [r.loss for r in of(ra, StepRecord)] == [r.loss for r in of(rb, StepRecord)]
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    no_drop, rn = run(tiny_config(RUN, steps=10, eval_every=10))
    assert [r.loss for r in of(rn, StepRecord)] != [r.loss for r in of(ra, StepRecord)]  # dropout was on


def test_build_model_is_seeded_and_leaves_global_rng_alone():
    cfg = tiny_config(RUN)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    m1 = build_model(cfg)
    after = torch.rand(1)
    m2 = build_model(cfg)
    assert torch.equal(before, after)  # model init does not consume the caller's random stream
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))
    m3 = build_model(replace(cfg, train=replace(cfg.train, seed=5)))
    assert not torch.equal(m1.tok_emb.weight, m3.tok_emb.weight)


# ---- learning-rate schedule ---------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_lr_schedule(schedule):
    tc = TrainConfig(steps=200, lr=1e-2, warmup=20, schedule=schedule, min_lr_ratio=0.1)
    lrs = [lr_at(s, tc) for s in range(tc.steps)]
    warm = lrs[:20]
    assert warm[0] == pytest.approx(1e-2 / 20)
    assert np.allclose(np.diff(warm), 1e-2 / 20)  # rises linearly...
    assert warm[-1] == pytest.approx(1e-2)  # ...to the peak
    after = lrs[20:]
    assert all(b <= a + 1e-15 for a, b in zip(after, after[1:]))  # then never rises
    if schedule == "constant":
        assert all(x == pytest.approx(1e-2) for x in after)
    else:
        assert after[0] == pytest.approx(1e-2)
        assert lrs[-1] == pytest.approx(0.1 * 1e-2)  # ends at min_lr_ratio * lr
        mid = 20 + (tc.steps - 1 - 20) / 2
        if mid.is_integer():
            assert lr_at(int(mid), tc) == pytest.approx(1e-2 * (0.1 + 0.9 * 0.5))
        if schedule == "cosine":  # cosine: slow start, compared with linear decay
            assert lrs[30] > 1e-2 * (0.1 + 0.9 * (1 - 10 / 179))
        else:
            assert np.allclose(np.diff(after), -(0.9 * 1e-2) / 179)


def test_cosine_midpoint_and_no_warmup():
    tc = TrainConfig(steps=101, lr=1.0, warmup=0, schedule="cosine", min_lr_ratio=0.0)
    assert lr_at(0, tc) == pytest.approx(1.0)
    assert lr_at(50, tc) == pytest.approx(0.5)
    assert lr_at(100, tc) == pytest.approx(0.0, abs=1e-12)


def test_trainer_uses_the_schedule():
    cfg = tiny_config(RUN, steps=12, warmup=4, schedule="cosine", min_lr_ratio=0.2, eval_every=12)
    _, records = run(cfg)
    steps = of(records, StepRecord)
    assert [r.lr for r in steps] == pytest.approx([lr_at(s, cfg.train) for s in range(12)])
    assert steps[-1].lr == pytest.approx(0.2 * cfg.train.lr)


# ---- weight decay --------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", TRANSFORMERS)
@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_weight_decay_applies_to_matrices_only(arch, pos):
    cfg = tiny_config(RUN, arch=arch, weight_decay=0.3)
    cfg = replace(cfg, model=replace(cfg.model, pos=pos, norm="pre"))
    model = build_model(cfg)
    opt = make_optimizer(model, cfg.train)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {g["weight_decay"]: [names[id(p)] for p in g["params"]] for g in opt.param_groups}
    assert set(groups) == {0.3, 0.0}
    decayed, plain = set(groups[0.3]), set(groups[0.0])
    assert decayed | plain == set(names.values()) and not decayed & plain  # each parameter once
    for n in decayed:
        assert n.endswith(("in_proj.weight", "out_proj.weight", "fc1.weight", "fc2.weight")) or n == "head.weight", n
    assert "tok_emb.weight" in plain
    assert any("norm" in n for n in plain)
    assert all(not ("norm" in n or n.endswith(".bias") or n.startswith(("tok_emb", "pos."))) for n in decayed)
    if pos == "learned":
        assert "pos.weight" in plain
    n_layers = cfg.model.n_layers * (2 if arch == "encoder-decoder" else 1)
    n_cross = cfg.model.n_layers if arch == "encoder-decoder" else 0
    assert len(decayed) == n_layers * 4 + n_cross * 2 + 1  # in/out proj, fc1/fc2 per block, cross, head
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["betas"] == (cfg.train.beta1, cfg.train.beta2)


# ---- records and snapshots -------------------------------------------------------------------------


def test_snapshot_steps():
    assert snapshot_steps(TrainConfig(steps=100, snapshots=6)) == {0, 20, 40, 60, 80, 100}
    s = snapshot_steps(TrainConfig(steps=1000, snapshots=7))
    assert len(s) == 7 and min(s) == 0 and max(s) == 1000
    assert snapshot_steps(TrainConfig(steps=10, snapshots=2)) == {0, 10}
    assert snapshot_steps(TrainConfig(steps=10, snapshots=1)) == {10}
    assert snapshot_steps(TrainConfig(steps=10, snapshots=0)) == set()
    assert snapshot_steps(TrainConfig(steps=3, snapshots=10)) == {0, 1, 2, 3}


@pytest.mark.parametrize("arch", TRANSFORMERS)
def test_records_and_snapshot_shapes(arch):
    cfg = tiny_config(RUN, arch=arch, steps=10, eval_every=4, snapshots=3)
    result, records = run(cfg)
    steps = of(records, StepRecord)
    assert [r.step for r in steps] == list(range(1, 11))  # 1-based, every step at this size
    assert all(b.tokens > a.tokens and b.elapsed_s >= a.elapsed_s for a, b in zip(steps, steps[1:]))
    assert all(math.isfinite(r.loss) and r.grad_norm > 0 and r.tokens_per_s > 0 for r in steps)
    evals = of(records, EvalRecord)
    assert [r.step for r in evals] == [4, 8, 10]  # every eval_every steps and at the last
    for r in evals:
        assert 0 <= r.token_acc <= 1 and 0 <= r.exact_match <= 1 and r.loss > 0
        assert r.ood_loss is not None and 0 <= r.ood_exact_match <= 1  # copy has longer lengths
    assert result.final_eval == evals[-1]
    snaps = of(records, SnapshotRecord)
    assert [s.step for s in snaps] == [0, 5, 10]  # 0 (untrained) and the last step included
    b = probe(cfg.task, arch)
    t_dec = b.inp.shape[1]
    t_src = None if b.src is None else b.src.shape[1]
    L, H = cfg.model.n_layers, cfg.model.n_heads
    want = {DEC_SELF: (L, H, t_dec, t_dec)}
    if arch == "encoder-decoder":
        want |= {ENC_SELF: (L, H, t_src, t_src), CROSS: (L, H, t_dec, t_src)}
    for s in snaps:
        assert {k: v.shape for k, v in s.patterns.items()} == want
        for pat in s.patterns.values():
            assert pat.dtype == np.float32
            assert np.allclose(pat.sum(-1), 1.0, atol=1e-5)
    assert not np.allclose(snaps[0].patterns[DEC_SELF], snaps[-1].patterns[DEC_SELF])  # they are live
    assert result.params == build_model(cfg).num_params()
    assert result.device == "cpu"


def test_task_without_ood_lengths_reports_none():
    cfg = RunConfig(
        model=ModelConfig(n_layers=1, n_heads=2, d_model=16, d_ff=32, n_ctx=8),
        task=TaskConfig(name="modular_addition", modulus=7, train_fraction=0.5),
        train=TrainConfig(steps=3, batch_size=8, eval_every=3, eval_samples=16, snapshots=0, device="cpu"),
    )
    result, _ = run(cfg)
    assert result.final_eval.ood_loss is None and result.final_eval.ood_exact_match is None


# ---- evaluation metrics -------------------------------------------------------------------------


class Oracle(nn.Module):
    """Returns one-hot logits of the right answers (from a lookup), wrong on chosen rows."""

    def __init__(self, batches, vocab: int, wrong_rows: int = 0) -> None:
        super().__init__()
        self.vocab, self.answers, self.wrong_rows = vocab, {}, wrong_rows
        for b in batches:
            self.answers[(b.inp.numpy().tobytes(), b.inp.shape)] = b.tgt

    def forward(self, idx, src=None, targets=None, need_weights=False):
        tgt = self.answers[(idx.numpy().tobytes(), idx.shape)].clone()
        tgt[tgt == IGNORE_INDEX] = 0
        logits = torch.nn.functional.one_hot(tgt, self.vocab).float() * 50.0  # (B, T, V)
        if self.wrong_rows:
            scored = (self.answers[(idx.numpy().tobytes(), idx.shape)] != IGNORE_INDEX).nonzero()
            col = scored[-1, 1].item()  # the last answer position
            logits[: self.wrong_rows, col] = logits[: self.wrong_rows, col].roll(1, dims=-1)
        return ModelOutput(logits=logits)


@pytest.mark.parametrize("arch", TRANSFORMERS)
def test_evaluate_on_an_oracle(arch):
    tc = TaskConfig(name="reverse", max_len=4)
    batches = eval_batches(tc, arch, "eval", 64, batch_size=16)
    vocab = get_task("reverse").vocab_size(tc)
    oracle = Oracle(batches, vocab).train()
    loss, acc, em = evaluate(oracle, batches, CPU)
    assert acc == 1.0 and em == 1.0 and loss < 1e-6
    assert oracle.training  # evaluate restores the mode
    rows = sum(b.tgt.shape[0] for b in batches)
    scored = sum(int((b.tgt != IGNORE_INDEX).sum()) for b in batches)
    loss, acc, em = evaluate(Oracle(batches, vocab, wrong_rows=2), batches, CPU)
    assert em == pytest.approx(1 - 2 * len(batches) / rows)  # one wrong token spoils the whole row
    assert acc == pytest.approx(1 - 2 * len(batches) / scored)
    assert loss == pytest.approx(2 * len(batches) * 50.0 / scored, rel=1e-4)


def test_resolve_device():
    assert resolve_device("cpu") == CPU
    assert resolve_device("auto").type in ("cpu", "cuda", "mps")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            resolve_device("cuda")


# ---- slow: the known result, reproduced -----------------------------------------------------------


@pytest.mark.science
@pytest.mark.parametrize("arch", TRANSFORMERS)
def test_reverse_is_learned_end_to_end(arch):
    """reverse, RoPE, pre-LN, 2 layers x 4 heads, d 64, 1500 steps, seed 0: solved at training lengths."""
    cfg = RunConfig(
        model=ModelConfig(arch=arch, pos="rope", norm="pre", n_layers=2, n_heads=4, d_model=64),
        task=TaskConfig(name="reverse"),
        train=TrainConfig(steps=1500, seed=0),
    )
    result = train(cfg, threads=1)
    assert result.steps_done == 1500
    assert result.final_eval.exact_match >= 0.99, result.final_eval
