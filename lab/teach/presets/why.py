"""The paper's own questions as presets: why attention and not recurrence, why residual connections, why
1/sqrt(d_k), and Table 3 at toy scale (its runs: lab/teach/presets/table3.py). Each explanation is written from
the measured result and says so when the toy result differs from the paper's argument (what each measured:
benchmarks/RESULTS.md, "The presets as measured"). Registered with the others in lab/teach/presets/catalog.py.
"""
from __future__ import annotations

import math
from typing import Optional

from lab.config import ModelConfig, TaskConfig, TrainConfig
from lab.derived import run_config  # n_ctx: the task's longest sequence, as the app and the CLI derive it
from lab.records import EXACT_MATCH
from lab.teach import length_scan
from lab.teach.distance import near_and_far
from lab.teach.loss_reading import held_from
from lab.teach.presets.base import SOLVED, Results, _ev, _n, _pct
from lab.teach.presets.table3 import ROWS as TABLE3_ROWS
from lab.teach.presets.table3 import SAME, SPREAD, table


# ---- Why attention, not recurrence ---------------------------------------------------------------
# About the same size: 105,600 parameters (the Transformer) and 105,440 (the LSTM: each layer's 4 gates hold
# (d + d) x d weights, so d = 80 matches 2 Transformer layers of d = 64 with d_ff = 256).
RECUR = run_config(
    model=ModelConfig(n_layers=2, n_heads=4, d_model=64, d_ff=256, norm="pre", pos="learned"),
    task=TaskConfig(name="reverse", min_len=16, max_len=16, n_symbols=10),
    train=TrainConfig(steps=600, batch_size=64, lr=3e-3, warmup=50, eval_every=30),
)
RECUR_RUNS = ("Transformer", "LSTM")


def _solved_at(run: dict) -> tuple[Optional[int], Optional[float]]:
    """(step, seconds) from which held-out exact-match stayed at or above SOLVED, or (None, None)."""
    step = held_from(run, EXACT_MATCH, lambda v: v >= SOLVED)
    at = next((e for e in run.get("evals") or () if e.get("step") == step), {})
    return step, at.get("elapsed_s")


def _explain_recurrence(r: Results) -> str:
    t, lstm = (r[n] for n in RECUR_RUNS)
    em_t, em_l = _ev(r, "Transformer", EXACT_MATCH), _ev(r, "LSTM", EXACT_MATCH)
    step, secs = _solved_at(t)
    size = f"{t.get('params', 0):,} and {lstm.get('params', 0):,} parameters"
    speed = ""
    if t.get("tokens_per_s") and lstm.get("tokens_per_s"):
        tps = f"{lstm['tokens_per_s']:,.0f} tokens/s against the Transformer's {t['tokens_per_s']:,.0f}"
        speed = (f" Speed did not decide it: the LSTM trained at {tps}" if lstm["tokens_per_s"] >= t["tokens_per_s"]
                 else f" The LSTM was also slower: {tps}")
    far = ""
    if lstm.get("distance"):
        d0, a0, d1, a1 = near_and_far(lstm["distance"])
        far = (f" The LSTM's answer tokens were right {_pct(a0)} of the time when the token to copy was {d0} position "
               f"back and {_pct(a1)} when it was {d1} back")
        far += (": it must carry each token through its state, one step at a time, while attention reads any "
                "earlier position in one step." if a1 < a0 - 0.2 else
                ", about the same at every distance: its one state vector must hold all 16 symbols when the answer "
                "starts (the bottleneck attention removed: Bahdanau et al. 2015).")
    scan = length_scan.sentence()
    speed += (f"; {scan}" if speed else f" {scan[0].upper()}{scan[1:]}") if scan else ("." if speed else "")
    if em_t >= 0.99 and em_l < 0.5:
        when = f" from step {step} on ({secs:.0f} s)" if step and secs else ""
        return (f"The Transformer reversed every held-out sequence of 16 symbols{when}; the LSTM, at about the same "
                f"size ({size}), reached exact-match {_pct(em_l)} in {lstm.get('steps') or RECUR.train.steps} steps." + far + speed)
    if em_t > em_l:
        return (f"The Transformer did better (exact-match {_pct(em_t)} against the LSTM's {_pct(em_l)}, {size}) but "
                "did not solve the task this time; train longer." + far)
    return (f"No separation this time: exact-match {_pct(em_t)} (Transformer) and {_pct(em_l)} (LSTM), {size}. "
            "The paper's argument is about long paths; at this length the LSTM kept up." + far)


# ---- Why residual connections ---------------------------------------------------------------------
RESID = run_config(
    model=ModelConfig(n_layers=6, n_heads=4, d_model=64, d_ff=256, norm="pre", pos="learned"),
    task=TaskConfig(name="sort", min_len=12, max_len=12, n_symbols=10),
    train=TrainConfig(steps=200, batch_size=64, lr=3e-3, warmup=30, eval_every=10),
)
RESID_RUNS = ("pre-LN", "pre-LN, no residuals", "post-LN", "post-LN, no residuals")


def _explain_residuals(r: Results) -> str:
    pre, pre_off, post, post_off = (_ev(r, n) for n in RESID_RUNS)
    chance = math.log(RESID.task.n_symbols)
    head = (f"Held-out loss after {r[RESID_RUNS[0]].get('steps') or RESID.train.steps} steps, 6 layers deep: with residual connections pre-LN "
            f"{_n(pre)} and post-LN {_n(post)}; without them {_n(pre_off)} and {_n(post_off)} (guessing: "
            f"ln {RESID.task.n_symbols} = {chance:.2f}). ")
    if max(pre, post) < 0.5 * chance and min(pre_off, post_off) > 0.9 * chance:
        return head + ("Without the identity path x + f(x), every layer's input is the previous layer's output "
                       "alone: the signal and its gradient pass through six transformations, and the stack never "
                       "left guessing. With it, each layer adds a small correction to a stream the gradient "
                       "reaches directly, so both norm placements learn (He et al. 2016).")
    if max(pre, post) < min(0.9 * chance, pre_off, post_off):
        return head + "Residual connections helped, but not by the usual margin this time: try another seed."
    return head + "No separation this time: try another seed or more steps."


# ---- Why 1/sqrt(d_k) -------------------------------------------------------------------------------
SCALING = run_config(
    model=ModelConfig(n_layers=2, n_heads=1, d_model=128, d_ff=512, norm="pre", pos="learned"),  # d_k = 128
    task=TaskConfig(name="reverse", min_len=1, max_len=12, n_symbols=10),
    train=TrainConfig(steps=400, batch_size=64, lr=3e-3, warmup=40, eval_every=20),
)
SCALING_RUNS = ("scaled by 1/sqrt(d_k)", "scaling removed")


def _explain_scaling(r: Results) -> str:
    scaled, raw = (_ev(r, n) for n in SCALING_RUNS)
    em_s, em_r = (_ev(r, n, EXACT_MATCH) for n in SCALING_RUNS)
    steps = r[SCALING_RUNS[0]].get("steps") or SCALING.train.steps
    head = (f"With one head of d_k = 128, held-out loss after {steps} steps: {_n(scaled)} with the "
            f"scaling (exact-match {_pct(em_s)}), {_n(raw)} without ({_pct(em_r)}). ")
    if raw > 1.5 * scaled:
        return head + ("The paper's reason (footnote 4): a score is a sum of 128 products, its variance grows as "
                       "d_k, so the softmax saturates onto one key and passes almost no gradient to the others. "
                       "Learn page 4 measures that saturation for random q and k; this preset measures the slower "
                       "learning it predicts.")
    if raw > scaled:
        return head + "The scaled model learned faster, but not by the usual margin this time."
    return head + ("This time removing the scaling did not slow learning: this lab's small initialisation keeps "
                   "the first scores small either way, and the model can learn smaller q and k.")


# ---- Table 3 at toy scale (lab/teach/presets/table3.py) ------------------------------------------------------
def _explain_table3(r: Results) -> str:
    rows = table(r)
    lines = ["| Row | Variation | Paper PPL / BLEU | Measured PPL per character, mean [min, max] | Mark |",
             "|---|---|---|---|---|"]
    lines += [f"| {x['row']} | {x['variation']} | {x['paper PPL']:.2f} / {x['paper BLEU']:.1f} | "
              f"{x['measured PPL (mean [min, max])']} | {x['mark']} |" for x in rows]
    marks = [x["mark"] for x in rows[1:]]
    same, spread = marks.count(SAME), marks.count(SPREAD)
    opposite = len(marks) - same - spread
    return (f"Of the paper's {len(TABLE3_ROWS)} variations, {same} moved this toy model the paper's way, {opposite} the "
            f"opposite way and {spread} stayed within the seeds' spread (3 seeds each; held-out perplexity per "
            "character of the built-in text, where the paper measured word pieces of a translation; "
            "docs/SCIENCE.md says why and what disagrees).\n\n" + "\n".join(lines))
