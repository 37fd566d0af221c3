"""Presets: well-formed configs, explanations that follow the numbers, and (slow) every preset run at
full size on the CPU with its fixed seeds, asserting the result the preset promises."""
from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Optional, Sequence

import numpy as np
import pytest
import torch

from lab.config import RunConfig
from lab.derived import derived_n_ctx
from lab.teach.attention_measures import previous_token_share
from lab.teach.presets.catalog import LN_RUNS, METRICS, PES, PRESETS, RESID_RUNS, SCALING_RUNS, SEEDS, Preset
from lab.records import DEC_SELF, EXACT_MATCH, LOSS, TOKEN_ACC, EvalRecord, SnapshotRecord, StepRecord
from lab.tasks.batches import get_task
from lab.tasks.shapes import headline_metrics
from tests.trained_once import ENV, on_cpu, trained_once

EXPECTED = {"hello_sort", "induction", "pre_post_ln", "short_long", "beyond", "encoder_decoder", "grokking",
            "why_attention", "why_residuals", "why_scaling", "stability", "table3", "chomsky"}


# ---- fast: well-formed -----------------------------------------------------------------------------
def test_every_preset_of_the_issue_is_there():
    assert set(PRESETS) == EXPECTED
    titles = {p.title for p in PRESETS.values()}
    assert {"Hello, sort", "Induction heads", "Pre-LN vs post-LN", "Train short, test long",
            "Positions beyond training", "Original encoder-decoder", "Grokking", "Why attention, not recurrence",
            "Why residual connections", "Why 1/√d_k", "Stability map: when post-LN needs warmup",
            "Table 3 at toy scale", "What attention cannot do: longer inputs"} == titles


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_preset_is_well_formed(key):
    p = PRESETS[key]
    assert p.key == key and p.question.strip().endswith("?") and p.reference and p.wall_s > 0
    assert p.metrics and set(p.metrics) <= set(METRICS)
    names = [c.name for c in p.runs]
    assert all(names) and len(set(names)) == len(names), names
    for cfg in p.runs:
        assert isinstance(cfg, RunConfig)
        assert RunConfig.from_json(cfg.to_json()) == cfg  # valid, shareable as JSON
        needed = get_task(cfg.task.name).max_seq_len(cfg.task, cfg.model.arch)
        assert cfg.model.n_ctx == derived_n_ctx(cfg.task, cfg.model.arch)  # the app's and the CLI's rule
        assert cfg.model.n_ctx == needed or (cfg.model.pos != "learned" and needed < cfg.model.n_ctx == 8)
        assert 15 <= cfg.train.steps / cfg.train.eval_every <= 25  # about 20 points per curve
    if len(p.runs) > 1:  # a comparison varies something other than the label
        assert len({replace(c, name="").to_json() for c in p.runs}) == len(p.runs)


def test_a_preset_opens_compare_on_the_curves_its_sentence_reads():
    """Issue 34 item 4: grokking's sentence is about training and held-out accuracy together (it opened on the
    held-out one alone); induction's telling measure is its accuracy on the predictable positions; the
    extrapolation presets read the longer lengths against the training lengths."""
    assert PRESETS["grokking"].metrics == ("held-out exact-match", "train exact-match")
    assert PRESETS["induction"].metrics == ("held-out loss", "held-out accuracy (predictable positions)")
    assert "predictable_acc" in headline_metrics("induction")
    assert PRESETS["short_long"].metrics == ("held-out loss (longer lengths)", "held-out loss")
    assert all(len(set(p.metrics)) == len(p.metrics) for p in PRESETS.values())


def test_metrics_are_the_compare_views_curves():
    from lab.views import curves as common
    assert set(METRICS) == set(common.CURVES)


# ---- fast: explanations follow the numbers ----------------------------------------------------------
def summ(loss=1.0, em=0.0, ood_loss=None, ood_em=0.0, train_loss=None) -> dict:
    ood = None if ood_loss is None else {LOSS: ood_loss, TOKEN_ACC: 0.5, EXACT_MATCH: ood_em}
    return {"train_loss": loss if train_loss is None else train_loss, "steps": 100, "wall_s": 1.0,
            "eval": {LOSS: loss, TOKEN_ACC: 0.5, EXACT_MATCH: em}, "ood": ood, "stopped": False}


def say(key: str, results: dict) -> str:
    text = PRESETS[key].explain(results)
    assert 20 < len(text) < 900 and "nan" not in text, text
    assert text.count(". ") + text.count("; ") <= 6, text  # short: a few sentences
    return text


def test_explain_sort():
    good, bad = say("hello_sort", {"sort": summ(0.0002, 1.0)}), say("hello_sort", {"sort": summ(0.4, 0.62)})
    assert "Solved" in good and "100%" in good and "0.0002" in good
    assert "Not solved" in bad and "62%" in bad


def test_explain_induction():
    good = say("induction", {"1 layer": summ(2.94), "2 layers": summ(0.6)})
    assert "fell to 0.60" in good and "2.94" in good and "induction head" in good
    weak = say("induction", {"1 layer": summ(2.9), "2 layers": summ(2.0)})
    none = say("induction", {"1 layer": summ(2.9), "2 layers": summ(3.1)})
    assert len({good, weak, none}) == 3 and "not by the usual margin" in weak and "No separation" in none


def test_explain_induction_quotes_the_head_that_matters():
    k = {"head": "0.0", "layer": 0, "index": 0, "intact": 0.8, "ablated": 8.02, "rise": 7.22, "median_rise": 0.41}
    text = say("induction", {"1 layer": summ(5.04), "2 layers": {**summ(0.8), "knockout": k}})
    assert ("Knocking out (zeroing) layer 0 head 0 raises its held-out loss from 0.80 to 8.02, 18x as much as the "
            "median head (+0.41; click its cell in Inspect)") in text and "ln 1000 = 6.91" in text
    assert "Knocking out" not in say("induction", {"1 layer": summ(5.04), "2 layers": summ(0.8)})
    # with the run's last attention snapshot: the head's share of attention on the previous token
    attn = np.zeros((2, 2, 5, 5))
    attn[0, 0, range(1, 5), range(4)] = 0.9  # head 0.0 looks one token back
    seen = say("induction", {"1 layer": summ(5.04), "2 layers": {**summ(0.8), "knockout": k,
                                                                "attention": {DEC_SELF: attn}}})
    assert "layer 0 head 0, which puts 90% of its attention on the previous token, raises" in seen
    assert previous_token_share(attn, 0, 1) == 0.0 and previous_token_share(None, 0, 0) is None
    small = {**k, "ablated": 1.12, "rise": 0.32, "median_rise": 0.2}
    assert "1.6x as much as the median head (+0.20" in say("induction", {"1 layer": summ(5.04), "2 layers": {
        **summ(0.8), "knockout": small}})


def test_explain_ln():
    def res(pre, post, warm):
        return dict(zip(LN_RUNS, (summ(pre), summ(post), summ(warm))))

    expected = say("pre_post_ln", res(0.12, 1.67, 0.46))
    assert "pre-LN 0.12" in expected and "1.67" in expected and "warmup keeps" in expected
    lucky = say("pre_post_ln", res(0.5, 0.3, 0.4))
    assert "did not end worse" in lucky
    no_rescue = say("pre_post_ln", res(0.1, 1.5, 1.9))
    assert "did not rescue" in no_rescue


def test_explain_short_long():
    base = {pe: summ(0.5, ood_loss=loss) for pe, loss in zip(PES, (1.2, 2.2, 3.7, 3.6, 3.8))}
    base["alibi"] = summ(1.18, ood_loss=1.21)
    text = say("short_long", base)
    assert text.index("alibi 1.21") < text.index("rope 2.20") < text.index("learned 3.70")
    assert "distance" in text and "Within the training length rope was best" in text
    base["rope"] = summ(0.5, ood_loss=0.9)
    assert "ALiBi did not extrapolate best this time (rope did)" in say("short_long", base)


def test_explain_beyond():
    res = {f"{pe} seed {s}": summ(1.0, 0.3 + 0.1 * i + 0.2 * (s == 2), ood_loss=2.0 + i, ood_em=0.0)
           for i, pe in enumerate(PES) for s in SEEDS}
    text = say("beyond", res)
    assert "no run reversed" in text and "no encoding wins reliably" in text and "best none" in text
    assert "least for alibi" in text and "most for none" in text and "20%" in text
    res["rope seed 1"] = summ(1.0, 0.9, ood_loss=1.0, ood_em=0.4)
    assert "One run reached 40%" in say("beyond", res)


def test_explain_encdec():
    good = say("encoder_decoder", {"encoder-decoder": summ(0.0003, 1.0, ood_loss=5.0, ood_em=0.08)})
    bad = say("encoder_decoder", {"encoder-decoder": summ(0.8, 0.5, ood_loss=5.0)})
    assert "anti-diagonal" in good and "100%" in good and "only 8%" in good and "Not solved" in bad
    far = say("encoder_decoder", {"encoder-decoder": summ(0.0003, 1.0, ood_loss=0.5, ood_em=0.7)})
    assert "still gets 70%" in far


def test_explain_grokking():
    def res(wd, no):
        return {"weight decay 1.0": summ(0.01, wd, train_loss=0.001), "weight decay 0": summ(30, no, train_loss=0.1)}

    grok = say("grokking", res(1.0, 0.41))
    assert "100% with weight decay and 41% without" in grok and "jumps" in grok and "Both fitted" in grok
    assert "generalised too" in say("grokking", res(1.0, 0.95))
    assert "did not happen" in say("grokking", res(0.4, 0.4))


def test_the_steps_a_sentence_quotes_are_the_marks_on_its_curves():
    from lab.views.curve_figures import Mark

    evals = [{"step": s, EXACT_MATCH: a, f"train_{EXACT_MATCH}": t, LOSS: 1.0}
             for s, a, t in ((100, 0.02, 0.5), (400, 0.1, 1.0), (1200, 0.95, 1.0), (1600, 1.0, 1.0))]
    wd = {**summ(0.01, 1.0, train_loss=0.001), "evals": evals}
    res = {"weight decay 1.0": wd, "weight decay 0": summ(30, 0.41, train_loss=0.1)}
    grok = PRESETS["grokking"]
    assert "passed 90% at step 1200" in grok.explain(res)
    assert grok.marks(res) == (Mark(1200, "test accuracy passes 90%: step 1,200"),)
    assert grok.marks({"weight decay 1.0": wd}) == ()  # a run without its result: no marks yet

    two = {**summ(0.6), "evals": [{"step": s, LOSS: v} for s, v in ((0, 3.0), (200, 1.2), (400, 0.6))],
           "heads": {"crossing": 300, "head": "1.0", "start": 0.02, "end": 0.6, "every": 100}}
    ind = {"1 layer": summ(2.94), "2 layers": two}
    text = PRESETS["induction"].explain(ind)
    assert "from step 200 of" in text and "formed at step 300" in text, text
    assert PRESETS["induction"].marks(ind) == (Mark(200, "2 layers below half the 1-layer loss: step 200"),
                                               Mark(300, "induction head formed: step 300"))
    assert PRESETS["hello_sort"].marks({"sort": summ(0.0002, 1.0)}) == ()  # a sentence that quotes no step


def test_explain_why_attention():
    def res(em_t, em_l, distance=None):
        t = {**summ(0.001, em_t), "params": 105_600, "tokens_per_s": 30_000.0,
             "evals": [{"step": 60, "elapsed_s": 3.0, EXACT_MATCH: 0.4}, {"step": 90, "elapsed_s": 6.2, EXACT_MATCH: 1.0}]}
        return {"Transformer": t, "LSTM": {**summ(1.3, em_l), "params": 105_440, "tokens_per_s": 45_000.0,
                                           "distance": distance or {}}}

    good = say("why_attention", res(1.0, 0.0, {"1": 0.98, "17": 0.5, "31": 0.2}))  # keys as JSON stores them
    assert "from step 90 on (6 s)" in good and "105,600 and 105,440" in good and "exact-match 0%" in good
    assert "right 98% of the time when the token to copy was 1 position back and 20% when it was 31 back" in good
    assert "one step at a time" in good and "bottleneck" not in good
    flat = say("why_attention", res(1.0, 0.0, {"1": 0.35, "31": 0.37}))
    assert "35%" in flat and "37% when it was 31 back, about the same at every distance" in flat and "bottleneck" in flat
    assert "Speed did not decide it: the LSTM trained at 45,000 tokens/s against the Transformer's 30,000" in good
    assert "did not solve" in say("why_attention", res(0.8, 0.1))
    assert "No separation" in say("why_attention", res(1.0, 1.0))


def test_explain_why_residuals():
    def res(*losses):
        return dict(zip(RESID_RUNS, (summ(v) for v in losses)))

    good = say("why_residuals", res(0.12, 2.28, 0.14, 2.29))
    assert "pre-LN 0.12 and post-LN 0.14; without them 2.28 and 2.29" in good and "never left guessing" in good
    assert "not by the usual margin" in say("why_residuals", res(0.12, 1.5, 0.14, 1.9))
    assert "No separation" in say("why_residuals", res(2.2, 2.28, 2.25, 2.29))


def test_explain_why_scaling():
    def res(scaled, raw):
        return dict(zip(SCALING_RUNS, (summ(scaled, 0.5), summ(raw, 0.2))))

    good = say("why_scaling", res(0.6, 1.67))
    assert "0.60 with the scaling (exact-match 50%), 1.67 without (20%)" in good and "footnote 4" in good
    assert "not by the usual margin" in say("why_scaling", res(0.6, 0.8))
    assert "did not slow learning" in say("why_scaling", res(0.6, 0.5))


def test_accuracy_by_distance_counts_each_answer_token_at_2j_plus_1():
    """A model that reverses every prompt exactly except answer token 1 (3 positions after its source)."""
    from types import SimpleNamespace

    from lab.teach.distance import accuracy_by_distance

    cfg = PRESETS["why_attention"].runs[0]
    p = cfg.task.max_len

    class Reverser(torch.nn.Module):
        def forward(self, inp, src=None):
            t = torch.arange(inp.shape[1])  # position t >= p writes answer token t - p: the prompt's token 2p - 1 - t
            pred = inp[:, torch.where(t >= p, 2 * p - 1 - t, t)]  # (B, T)
            pred[:, p + 1] = (pred[:, p + 1] + 1) % cfg.task.n_symbols  # answer token 1: wrong
            return SimpleNamespace(logits=torch.nn.functional.one_hot(pred, 64).float())  # (B, T, vocab)

    acc = accuracy_by_distance(Reverser(), cfg, n_samples=32)
    assert acc == {d: 0.0 if d == 3 else 1.0 for d in range(1, 2 * p, 2)}  # 1, 3, ..., 31


def test_explain_names_missing_runs():
    text = PRESETS["induction"].explain({"1 layer": summ(2.9)})
    assert "No final results yet" in text and "2 layers" in text
    assert "No final results yet" in PRESETS["hello_sort"].explain({"sort": {"eval": None}})
    stopped = PRESETS["hello_sort"].explain({"sort": {**summ(0.4, 0.5), "stopped": True}})
    assert stopped.endswith("(Stopped early: sort.)") and "Not solved" in stopped


# ---- slow: each preset at full size on the CPU ------------------------------------------------------
def _train_one(cfg: RunConfig, folder: str) -> tuple[dict, list, dict]:
    """One preset run at 1 intra-op thread (in a pool process), or the session's earlier training of it
    (tests/trained_once.py): (summary, records, weights)."""
    t = trained_once(cfg, folder)
    return t.summary, t.records, t.weights


_POOL: list = []


def pool():
    """Worker processes, one per core this test process has to itself: a preset's runs train side by side,
    each exactly as it would alone (seeded, 1 thread). Under `-n 2` the other core is the other worker's,
    so one process (two would leave the browser tests' servers a third of a core each)."""
    if not _POOL:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        cores = 1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1)
        _POOL.append(ProcessPoolExecutor(max(1, cores),
                                         mp_context=multiprocessing.get_context("spawn")))
    return _POOL[0]


def measured_at_the_end(cfg: RunConfig) -> RunConfig:
    """`cfg` evaluated once, at its last step, with no attention snapshots: the same training (measuring
    touches neither the weights nor any random stream, so the final weights and the final metrics are bit
    for bit the preset's own: tests/test_trainer.py checks it), without the ~20 evaluations that draw its
    curves (up to half of a preset run's time)."""
    return replace(cfg, train=replace(cfg.train, eval_every=cfg.train.steps, snapshots=0))


class Ran:
    """All runs of a preset: summaries by name, plus each run's records and weights."""

    def __init__(self, preset: Preset, runs: Optional[Sequence[RunConfig]] = None, curves: bool = False) -> None:
        """`runs`: a subset of the preset's runs (by default all of them), at exactly their settings. Without
        `curves`, only the final metrics and weights are read: each run is measured at its end only."""
        self.summaries, self.records, self.weights = {}, {}, {}
        self.preset, self.curves = preset, curves
        self.add(runs if runs is not None else preset.runs)

    def add(self, runs: Sequence[RunConfig]) -> None:
        """Train `runs` (the preset's own configs) and redo the explanation with them."""
        assert all(cfg in self.preset.runs for cfg in runs)
        cfgs = [on_cpu(cfg if self.curves else measured_at_the_end(cfg)) for cfg in runs]
        for cfg, d in zip(cfgs, pool().map(_train_one, cfgs, [os.environ[ENV]] * len(cfgs))):
            self.summaries[cfg.name], self.records[cfg.name], self.weights[cfg.name] = d
        self.text = self.preset.explain(self.summaries)
        walls = {n: round(s["wall_s"], 1) for n, s in self.summaries.items()}
        print(f"\n[{self.preset.key}] wall {sum(walls.values()):.0f} s {walls}\n{self.text}")  # shown with -s

    def ev(self, name: str, key: str = "loss") -> float:
        return self.summaries[name]["eval"][key]

    def ood(self, name: str, key: str = "loss") -> float:
        return self.summaries[name]["ood"][key]


@pytest.fixture(autouse=True, scope="module")
def one_thread_and_shared_trainings(one_thread, trained_folder):
    """Torch at one intra-op thread (tests/conftest.py) for the module, the session's shared trainings (ENV
    names their folder)."""
    yield


@pytest.fixture(autouse=True, scope="session")
def pool_shut_down_at_the_end():
    """The pool lives as long as the test process: each science test is a group of its own (tests/conftest.py), so a
    worker can take another module's tests between two of these, and a pool started again each time would import
    torch again each time."""
    yield
    while _POOL:
        _POOL.pop().shutdown()


@pytest.mark.science
def test_hello_sort_solves_sort():
    r = Ran(PRESETS["hello_sort"])
    assert r.ev("sort", EXACT_MATCH) == 1.0, r.summaries
    assert "Solved" in r.text


@pytest.mark.science
@pytest.mark.shares_training("induction 2 layers")
def test_induction_needs_two_layers_and_one_head_matters_most():
    from lab.views.analysis import load_model
    from lab.views.probing import importance_map, knockout_summary

    preset = PRESETS["induction"]
    r = Ran(preset, curves=True)  # its last snapshot; the run test_browser_marks and test_head_roles read
    assert r.ev("2 layers") < 0.5 * r.ev("1 layer"), r.summaries
    assert "fell to" in r.text
    cfg = next(c for c in preset.runs if c.name == "2 layers")
    imp = importance_map(load_model(cfg, r.weights["2 layers"]), cfg)
    k = knockout_summary(imp)
    rises = sorted(float(v) for v in (imp.loss - imp.intact_loss).flat)
    print(f"\n[induction] knockout loss by head {imp.loss.round(3).tolist()}, intact {imp.intact_loss:.3f}: {k}")
    assert k["rise"] == rises[-1] and k["rise"] > 1.0, k  # the map ranks first the head that matters most
    # Measured at these settings (torch 2.13, CPU, seed 0): the previous-token head 0.1 raises the loss from
    # 0.80 to 8.02 (+7.22), the median head by +0.41 (18x); seeds 1-9: 14x to 22x. Issue 15 asks for 3x.
    assert k["rise"] >= 3 * k["median_rise"], k
    snaps = [rec for rec in r.records["2 layers"] if isinstance(rec, SnapshotRecord)]
    attn = snaps[-1].patterns[DEC_SELF]  # (layers, heads, T, T) on the probe, at the last step
    assert k["layer"] == 0 and previous_token_share(attn, 0, k["index"]) >= 0.5  # the previous-token head
    text = preset.explain({n: {**s, "knockout": k if n == "2 layers" else {}, "attention": {DEC_SELF: attn}}
                           for n, s in r.summaries.items()})
    assert f"Knocking out (zeroing) layer {k['layer']} head {k['index']}, which puts" in text, text
    assert f"to {k['ablated']:.2f}" in text and "as much as the median head" in text, text


@pytest.mark.science
def test_post_ln_needs_warmup_at_a_high_learning_rate():
    r = Ran(PRESETS["pre_post_ln"])
    pre, post, warm = (r.ev(n) for n in LN_RUNS)
    assert post > pre and warm < post, r.summaries
    assert "warmup keeps" in r.text


@pytest.mark.science
def test_alibi_extrapolates_best():
    r = Ran(PRESETS["short_long"])
    ood = {pe: r.ood(pe) for pe in PES}
    assert min(ood, key=ood.get) == "alibi", ood
    assert r.ood("alibi") < 1.2 * r.ev("alibi")  # flat past the training length
    assert "ALiBi's stayed close" in r.text


@pytest.mark.science
def test_no_position_encoding_reverses_beyond_training():
    """An exploration: only the robust part is claimed (every run learns something in range, none
    carries whole sequences past the training length)."""
    r = Ran(PRESETS["beyond"])
    for name in r.summaries:
        assert r.ev(name, EXACT_MATCH) >= 0.15, (name, r.summaries[name])
        assert r.ood(name, EXACT_MATCH) < 0.05, (name, r.summaries[name])
    assert "no run reversed" in r.text and "no encoding wins reliably" in r.text


@pytest.mark.science
def test_encoder_decoder_reverses_with_anti_diagonal_cross_attention():
    from lab.views.analysis import attention, load_model, sampled_probe

    preset = PRESETS["encoder_decoder"]
    r = Ran(preset)
    cfg = preset.runs[0]
    assert r.ev(cfg.name, EXACT_MATCH) >= 0.99, r.summaries
    probe = sampled_probe(cfg)
    cross = attention(load_model(cfg, r.weights[cfg.name]), probe.batch)["cross"]  # (layers, heads, T, S)
    n = cross.shape[-1]
    assert cross.shape[-2] == n == cfg.task.max_len
    # decoder position t predicts answer[t] = prompt[n-1-t]: it should read encoder position n-1-t
    hits = [(cross[layer].mean(0).argmax(-1) == n - 1 - np.arange(n)).mean() for layer in range(len(cross))]
    assert max(hits) >= 0.75, hits
    assert "anti-diagonal" in r.text


@pytest.mark.science
def test_attention_reverses_where_an_lstm_of_the_same_size_fails_far_back():
    from lab.teach.distance import accuracy_by_distance, near_and_far
    from lab.teach.presets.catalog import measured
    from lab.views.analysis import load_model

    preset = PRESETS["why_attention"]
    r = Ran(preset, curves=True)  # the step its sentence quotes
    t, lstm = preset.runs
    assert abs(r.summaries["Transformer"]["params"] / r.summaries["LSTM"]["params"] - 1) < 0.01  # the same size
    assert r.ev("Transformer", EXACT_MATCH) == 1.0 and r.ev("LSTM", EXACT_MATCH) < 0.5, r.summaries
    dist = accuracy_by_distance(load_model(lstm, r.weights["LSTM"]), lstm)
    _, near, _, far = near_and_far(dist)
    print(f"\n[why_attention] LSTM accuracy by distance {dist}")
    assert max(dist.values()) < 0.9, dist  # it loses tokens at every distance, the nearest included
    assert min(accuracy_by_distance(load_model(t, r.weights["Transformer"]), t).values()) == 1.0
    results = {n: measured(r.summaries[n], [e.__dict__ for e in r.records[n] if isinstance(e, EvalRecord)],
                           distance=dist if n == "LSTM" else None) for n in r.summaries}
    text = preset.explain(results)
    assert "reversed every held-out sequence" in text and "from step" in text, text
    assert f"right {100 * near:.0f}% of the time" in text and f"{100 * far:.0f}% when it was 31 back" in text, text


@pytest.mark.science
def test_deep_stacks_learn_only_with_residual_connections():
    r = Ran(PRESETS["why_residuals"])
    chance = math.log(10)
    on, off = [r.ev(n) for n in RESID_RUNS[0::2]], [r.ev(n) for n in RESID_RUNS[1::2]]
    assert max(on) < 0.5 * chance and min(off) > 0.9 * chance, r.summaries
    assert "never left guessing" in r.text


@pytest.mark.science
def test_removing_the_scaling_slows_learning_at_a_wide_head():
    r = Ran(PRESETS["why_scaling"])
    scaled, raw = (r.ev(n) for n in SCALING_RUNS)
    assert raw > 1.5 * scaled, r.summaries
    assert "footnote 4" in r.text


@pytest.mark.science
@pytest.mark.shares_training("grokking weight decay")
def test_grokking_needs_weight_decay():
    r = Ran(PRESETS["grokking"], curves=True)  # memorising before generalising; test_grokking_fourier's run
    wd, no = "weight decay 1.0", "weight decay 0"
    # it fits its training pairs before it generalises: an evaluation where the training pairs are (nearly) all
    # right and the unseen ones mostly wrong. Measured on the training pairs themselves, as the preset's sentence
    # does: with weight decay 1.0 on the embeddings too, the batch loss stays above 0.1 while it memorises
    evals = [e for e in r.records[wd] if isinstance(e, EvalRecord)]
    memorised = [e.step for e in evals if e.train_exact_match >= 0.9 and e.exact_match < 0.6]
    assert memorised, [(e.step, e.train_exact_match, e.exact_match) for e in evals]
    assert min(memorised) < min(e.step for e in evals if e.exact_match > 0.9)
    assert r.ev(wd, EXACT_MATCH) > 0.9, r.summaries
    no_train = [s.loss for s in r.records[no] if isinstance(s, StepRecord)][-25:]
    assert sum(no_train) / len(no_train) < 0.3 and r.ev(no, EXACT_MATCH) < 0.6, r.summaries
    assert not math.isnan(r.ev(no)) and "jumps" in r.text


@pytest.mark.science
def test_the_stability_map_finds_where_post_ln_fails_without_warmup_and_pre_ln_trains():
    from lab.teach.presets import stability as s

    # the runs the map's claims and sentence read, at the preset's settings: both norms without warmup at every
    # rate, then post-LN with each warmup at the failing rates (pre-LN with warmup only fills the map: 10 to
    # 12 of the 24 runs, half the time)
    preset = PRESETS["stability"]
    r = Ran(preset, [c for c in preset.runs if c.train.warmup == 0])
    region = s.failing_region(r.summaries)
    r.add([c for c in preset.runs if c.model.norm == "post" and c.train.warmup > 0 and c.train.lr in region])
    losses = {n: round(r.ev(n), 3) for n in r.summaries}
    region = s.failing_region(r.summaries)
    assert region, losses  # some learning rate where post-LN without warmup learned nothing and pre-LN trained
    for lr in region:
        assert r.ev(s.name("post", 0, lr)) >= s.FAILS and r.ev(s.name("pre", 0, lr)) <= s.TRAINS, losses
    assert all(r.ev(s.name(n, 0, 3e-3)) <= s.TRAINS for n in s.NORMS), losses  # at a low rate both train
    assert r.ev(s.name("post", 150, region[0])) < s.FAILS, losses  # warmup moves post-LN's edge
    text = s.explain(r.summaries)  # the preset's sentence from these runs (the card waits for all 24)
    assert "that is the map's failing region" in text and "Warmup moves post-LN's edge" in text, text


@pytest.mark.science
def test_recurrence_keeps_parity_at_longer_lengths_where_attention_does_not():
    """The quick map (issue 36): trained on lengths 1-10, scored on 11-20. Parity: the RNN and the LSTM at 100%,
    both Transformers near chance (Delétang et al. 2023, Table 2: 100, 100 and 52.0); reverse (context-free):
    no architecture at 90% (the paper: 62.0, 60.9, 62.3). The page's sentence quotes those measurements."""
    from lab.teach.presets import chomsky as c

    r = Ran(PRESETS["chomsky"])
    cells = c.cells(r.summaries, c.QUICK_ROWS, c.QUICK_TASKS, c.QUICK_SEEDS)
    shown = {k: cell.text() for k, cell in cells.items()}
    assert len(cells) == len(c.QUICK_ROWS) * len(c.QUICK_TASKS), shown
    for row in ("RNN", "LSTM"):
        assert min(cells[(row, "parity")].accs) >= c.SOLVED and cells[(row, "parity")].mark == c.SAME, shown
    for row in ("Transformer, learned", "Transformer, RoPE randomized"):
        assert max(cells[(row, "parity")].accs) < 0.75, shown  # chance is 50%
    assert cells[("Transformer, learned", "parity")].mark == c.SAME
    for row in c.QUICK_ROWS:
        assert cells[(row, "reverse")].mean < c.SOLVED, shown
        assert cells[(row, "reverse")].mark in (c.SAME, c.NO_PAPER), shown
    rec_lo = min(cells[(row, t)].mean for row in ("RNN", "LSTM") for t in ("parity", "even_pairs"))
    best = max((cell for cell in cells.values() if cell.task == "reverse"), key=lambda cell: cell.mean)
    assert f"the recurrent models kept the regular tasks (even_pairs, parity) at {100 * rec_lo:.0f}%" in r.text, r.text
    assert f"(best: {best.row} on reverse, {100 * best.mean:.0f}%), as in the paper" in r.text, r.text
    assert f"{cells[('RNN', 'parity')].text()}<br>paper 100% ✓" in r.text, r.text  # the map, beside the paper
    assert f"{cells[('Transformer, learned', 'parity')].text()}<br>paper 52% ✓" in r.text, r.text
