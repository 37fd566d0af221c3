"""Presets: known results from docs/SCIENCE.md, one click each (no gradio; plain data and text).

A preset is a set of named runs, a "predict before you click" question, the Compare curve to open on,
and `explain(results)`, which reads the runs' measured summaries (`lab.engine.jobs.summary_of`) and says in
1-3 sentences what happened and why, including when the expected result did not appear.
`wall_s` is the measured wall time of the whole preset on the 2-core CPU dev machine (one intra-op
thread per run, runs one after another, with other jobs on the machine): a guide, not a promise.
Each claim is checked by a slow test in tests/test_presets.py at exactly these settings.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

from lab.config import ModelConfig, TaskConfig, TrainConfig
from lab.derived import run_config  # n_ctx: the task's longest sequence, as the app and the CLI derive it
from lab.records import EXACT_MATCH, LOSS
from lab.teach.presets import chomsky, stability
from lab.teach.attention_measures import anti_diagonal_words, knockout_sentence
from lab.teach.loss_reading import first_step, held_from
from lab.teach.presets.base import METRICS, SOLVED, Preset, Results, _ev, _n, _ood, _pct, _variant, measured
from lab.teach.presets.table3 import configs as table3_configs
from lab.teach.presets.why import (RECUR, RECUR_RUNS, RESID, RESID_RUNS, SCALING, SCALING_RUNS, _explain_recurrence,
                                   _explain_residuals, _explain_scaling, _explain_table3)
from lab.views.curve_figures import Mark
from lab.views.probing import measured_on

__all__ = ["METRICS", "SOLVED", "Preset", "Results", "measured", "PRESETS", "PES", "SEEDS", "LN_RUNS", "RESID_RUNS",
           "SCALING_RUNS", "RECUR_RUNS", "INDUCTION", "SORT", "forming_sentence", "fourier_sentence"]
PES = ("alibi", "rope", "learned", "sinusoidal", "none")
SEEDS = (1, 2)  # "Positions beyond training"


# ---- Hello, sort (minGPT's demo) --------------------------------------------------------------------
SORT = run_config(
    model=ModelConfig(n_layers=3, n_heads=3, d_model=48, d_ff=192, norm="pre", pos="learned"),
    task=TaskConfig(name="sort", min_len=6, max_len=6, n_symbols=3),
    train=TrainConfig(steps=300, batch_size=64, lr=5e-4, warmup=0, schedule="constant", weight_decay=0.1,
                      beta1=0.9, beta2=0.95, grad_clip=1.0, eval_every=15),
    name="sort",
)


def _explain_sort(r: Results) -> str:
    em, loss = _ev(r, "sort", EXACT_MATCH), _ev(r, "sort")
    if em >= SOLVED:
        step = held_from(r["sort"], EXACT_MATCH, lambda v: v >= SOLVED)
        when = (f"Solved by step {step} of {SORT.train.steps} (held-out exact-match at or above {SOLVED:.1%} from "
                "that evaluation on)" if step else "Solved")
        return (f"{when}: every held-out sequence came back sorted (exact-match {_pct(em)}, loss {_n(loss)}). "
                "Each output position only has to count how many input symbols are smaller, and attention "
                "reads the whole input at once, so three small layers are plenty.")
    return (f"Not solved this time: exact-match {_pct(em)} (loss {_n(loss)}). One wrong symbol spoils a whole "
            "sequence; try more steps.")


# ---- Induction heads -----------------------------------------------------------------------------
# 1000 symbols: a failed copy costs up to ln 1000 = 6.91 nats, and one previous-token head in layer 0 carries
# the circuit alone (with 64-512 symbols the two layer-0 heads often share it): knocking it out raises the
# held-out loss 14x to 22x as much as the median head in each of seeds 0-9 (docs/SCIENCE.md; asserted at the
# preset's seed, 0, in tests/test_presets.py).
INDUCTION = run_config(
    model=ModelConfig(n_layers=2, n_heads=2, d_model=64, d_ff=0, norm="pre", pos="learned"),
    task=TaskConfig(name="induction", min_len=24, max_len=24, n_symbols=1000),
    train=TrainConfig(steps=800, batch_size=64, lr=3e-3, warmup=30, schedule="constant", eval_every=50,
                      snapshots=16),  # every 50 steps: the induction head forms within about 150
)


def forming_sentence(h: Optional[dict[str, Any]]) -> str:
    """When the induction head formed, from the run's snapshots ('' without the measure)."""
    if not h or h.get("crossing") is None:
        return ""
    text = (f" Its induction head ({h['head']}) formed at step {h['crossing']}: its induction score on random "
            f"tokens repeated once went from {h['start']:.2f} to {h['end']:.2f}, past 0.4 there (snapshots every "
            f"{h['every']} steps)")
    if h.get("fall"):
        s0, s1, v0, v1 = h["fall"]
        text += f", as the held-out loss fell fastest (steps {s0}-{s1}, {_n(v0)} to {_n(v1)})"
    return text + ": a phase change, drawn on Learn page 13."


def _explain_induction(r: Results) -> str:
    one, two = _ev(r, "1 layer"), _ev(r, "2 layers")
    n = INDUCTION.task.n_symbols
    chance = f"guessing costs ln {n} = {math.log(n):.2f}"
    on = measured_on(INDUCTION.train.eval_samples, r["2 layers"].get("steps") or INDUCTION.train.steps)
    if two < 0.5 * one:
        step = held_from(r["2 layers"], LOSS, lambda v: v < 0.5 * one)  # "from step N on"
        when = f" (below half the 1-layer loss from step {step} of {INDUCTION.train.steps} on)" if step else ""
        return (f"The 2-layer model's held-out loss on the repeated part fell to {_n(two)} on {on}{when}; the "
                f"1-layer model's stayed at {_n(one)} ({chance}). Copying a repeat at a random offset needs an "
                "induction head: a previous-token head in layer 0 writes each token's predecessor into it, a head in "
                "layer 1 finds the earlier occurrence of the current token and copies what followed, so one layer "
                "cannot do it." + knockout_sentence(r["2 layers"]) + forming_sentence(r["2 layers"].get("heads")))
    if two < one:
        return (f"The 2-layer model ended lower ({_n(two)} against {_n(one)}; {chance}), but not by the usual "
                "margin: its induction head may not have formed yet. Look for a sudden drop in its curve.")
    return (f"No separation this time: 2 layers {_n(two)}, 1 layer {_n(one)} ({chance}). The induction head "
            "forms abruptly, and this run stopped before it did.")


def _marks_induction(r: Results) -> tuple[Mark, ...]:
    """The steps the sentence quotes: where the 2-layer loss stays below half the 1-layer's, and where its
    induction head formed."""
    one, marks = _ev(r, "1 layer"), []
    step = held_from(r["2 layers"], LOSS, lambda v: v < 0.5 * one) if _ev(r, "2 layers") < 0.5 * one else None
    if step:
        marks.append(Mark(step, f"2 layers below half the 1-layer loss: step {step:,}"))
    formed = (r["2 layers"].get("heads") or {}).get("crossing")
    if formed is not None:
        marks.append(Mark(formed, f"induction head formed: step {formed:,}"))
    return tuple(marks)


# ---- Pre-LN vs post-LN ---------------------------------------------------------------------------
LN = run_config(
    model=ModelConfig(n_layers=4, n_heads=4, d_model=128, d_ff=512, norm="pre", pos="learned"),
    task=TaskConfig(name="sort", min_len=12, max_len=12, n_symbols=10, ood_len=13),
    train=TrainConfig(steps=300, batch_size=64, lr=1e-2, warmup=0, schedule="cosine", eval_every=15,
                      eval_samples=256),
)
LN_RUNS = ("pre-LN, no warmup", "post-LN, no warmup", "post-LN, 100 warmup steps")


def _explain_ln(r: Results) -> str:
    pre, post, warm = (_ev(r, n) for n in LN_RUNS)
    head = (f"Held-out loss after 300 steps: pre-LN {_n(pre)}, post-LN without warmup {_n(post)}, "
            f"post-LN with warmup {_n(warm)} (guessing: ln 10 = 2.30). ")
    if post > pre and warm < post:
        return head + ("So at this high learning rate, 1e-2 from step 0, post-LN trains worse than pre-LN, and 100 "
                       "warmup steps bring it back (warmup keeps the first steps small); pre-LN needed none. Xiong "
                       "et al. 2020 trace this to post-LN's large gradients near the output at (Xavier) "
                       "initialisation; with this lab's small initialisation Learn page 8 measures the gradients at "
                       "initialisation about equal in both placements, so this lab shows the outcome, not that cause.")
    if post <= pre:
        return head + ("This time post-LN without warmup did not end worse than pre-LN: the failure is a "
                       "matter of luck in the first steps; try another seed.")
    return head + ("Post-LN without warmup ended worse than pre-LN, but warmup did not rescue it this time: "
                   "the learning rate is still too high for post-LN after warmup.")


# ---- Train short, test long ----------------------------------------------------------------------
SHORT_LONG = run_config(
    model=ModelConfig(n_layers=2, n_heads=4, d_model=64, d_ff=0, norm="pre", pos="alibi"),
    task=TaskConfig(name="induction", min_len=32, max_len=32, n_symbols=64, ood_len=128),
    train=TrainConfig(steps=1000, batch_size=64, lr=1e-3, warmup=50, schedule="constant", eval_every=50),
)


def _explain_short_long(r: Results) -> str:
    ood = {pe: _ood(r, pe) for pe in PES}
    order = sorted(PES, key=lambda pe: ood[pe])
    listing = ", ".join(f"{pe} {_n(ood[pe])}" for pe in order)
    text = f"Loss past the training length (33 to 128 tokens): {listing}. "
    if order[0] == "alibi":
        text += (f"ALiBi's stayed close to its loss within the training length ({_n(_ev(r, 'alibi'))}): its "
                 "bias depends only on the distance between tokens, so longer inputs look like the short ones "
                 "it trained on; the others meet positions or distances past 32 that training never showed them.")
    else:
        text += (f"ALiBi did not extrapolate best this time ({order[0]} did): at this size the ranking can "
                 "change with the seed or the number of steps.")
    best_in = min(PES, key=lambda pe: _ev(r, pe))
    if best_in != order[0]:
        text += (f" Within the training length {best_in} was best ({_n(_ev(r, best_in))}): fitting and "
                 "extrapolating are different skills.")
    return text


# ---- Positions beyond training (an exploration) --------------------------------------------------
BEYOND = run_config(
    model=ModelConfig(n_layers=2, n_heads=4, d_model=64, d_ff=256, norm="pre", pos="rope"),
    task=TaskConfig(name="reverse", min_len=1, max_len=16, ood_len=24),
    train=TrainConfig(steps=800, batch_size=64, lr=3e-3, eval_every=40, eval_samples=256),
)


def _explain_beyond(r: Results) -> str:
    def mean(pe: str, f: Callable[[str], float]) -> float:
        return sum(f(f"{pe} seed {s}") for s in SEEDS) / len(SEEDS)

    in_em = {pe: mean(pe, lambda n: _ev(r, n, EXACT_MATCH)) for pe in PES}
    out_em = max(_ood(r, f"{pe} seed {s}", EXACT_MATCH) for pe in PES for s in SEEDS)
    spread = max(abs(_ev(r, f"{pe} seed {SEEDS[0]}", EXACT_MATCH) - _ev(r, f"{pe} seed {SEEDS[1]}", EXACT_MATCH))
                 for pe in PES)
    best = max(PES, key=lambda pe: in_em[pe])
    ood_loss = {pe: mean(pe, lambda n: _ood(r, n)) for pe in PES}
    lo, hi = min(PES, key=ood_loss.get), max(PES, key=ood_loss.get)
    if out_em < 0.05:
        first = f"Past length 16 no run reversed whole sequences (best exact-match {_pct(out_em)}), "
    else:
        first = f"One run reached {_pct(out_em)} exact-match past length 16 (check its other seed), "
    return (first + f"while within the training lengths they reached {_pct(min(in_em.values()))} to "
            f"{_pct(max(in_em.values()))} (mean over seeds; best {best}, but two seeds of one PE differ by up to "
            f"{_pct(spread)}). Loss past training grew least for {lo} ({_n(ood_loss[lo])}) and most for {hi} "
            f"({_n(ood_loss[hi])}); at this size no encoding wins reliably, so treat any ranking as a hypothesis.")


# ---- Original encoder-decoder --------------------------------------------------------------------
ENCDEC = run_config(
    model=ModelConfig(arch="encoder-decoder", n_layers=2, n_heads=4, d_model=64, d_ff=256, norm="pre",
                      pos="sinusoidal"),
    task=TaskConfig(name="reverse", min_len=1, max_len=8),
    train=TrainConfig(steps=1000, batch_size=64, lr=3e-3, eval_every=50),
    name="encoder-decoder",
)


def _explain_encdec(r: Results) -> str:
    em, ood = _ev(r, "encoder-decoder", EXACT_MATCH), _ood(r, "encoder-decoder", EXACT_MATCH)
    if em >= 0.99:
        beyond = (f"Past length 8 it manages only {_pct(ood)}: positions it never trained on do not line up."
                  if ood < 0.5 else f"Past length 8 it still gets {_pct(ood)} right.")
        where = anti_diagonal_words(r["encoder-decoder"].get("attention", {}).get("cross"))
        return (f"Reversal solved: exact-match {_pct(em)} at lengths 1-8. In Inspect, the cross-attention map "
                f"shows how: {where}. " + beyond)
    return (f"Not solved yet: exact-match {_pct(em)}. The cross-attention map will be only partly "
            "anti-diagonal; train longer.")


# ---- Grokking ------------------------------------------------------------------------------------
GROK = run_config(
    model=ModelConfig(n_layers=1, n_heads=4, d_model=128, d_ff=512, norm="none", pos="none",
                      activation="relu"),
    task=TaskConfig(name="modular_addition", modulus=97, train_fraction=0.4),
    train=TrainConfig(steps=2200, batch_size=512, lr=3e-3, warmup=10, schedule="constant", weight_decay=1.0,
                      decay_embeddings="yes", beta1=0.9, beta2=0.98, eval_every=110),
)


def fourier_sentence(f: Optional[dict[str, Any]]) -> str:
    """The embedding's share in its strongest frequencies before and after the jump ('' without the measure)."""
    if not f or not f.get("end"):
        return ""
    pts = [(f[k], w) for k, w in (("before", " (memorised)"), ("after", " (after the jump)")) if f.get(k)]
    pts += [] if f["end"] in [p for p, _ in pts] else [(f["end"], "")]
    said = ", ".join(f"{_pct(x)} at step {s}{w}" for (s, x), w in pts)
    return (f" The embedding's power in its {f['top']} strongest frequencies (random: about 17%) was {said}: " +
            ("most of it in a few key frequencies, the paper's Fourier picture." if f["end"][1] >= 0.8 else
             "still spread, not yet the paper's few key frequencies."))


def _marks_grok(r: Results) -> tuple[Mark, ...]:
    """The step the sentence quotes: test accuracy first past 90% with weight decay."""
    jump = first_step(r["weight decay 1.0"], EXACT_MATCH, lambda v: v >= 0.9)
    return (Mark(jump, f"test accuracy passes 90%: step {jump:,}"),) if jump else ()


def _explain_grok(r: Results) -> str:
    wd, no = _ev(r, "weight decay 1.0", EXACT_MATCH), _ev(r, "weight decay 0", EXACT_MATCH)
    tl_wd, tl_no = r["weight decay 1.0"]["train_loss"], r["weight decay 0"]["train_loss"]
    acc = [(r[n].get("train_set") or {}).get(EXACT_MATCH) for n in ("weight decay 1.0", "weight decay 0")]
    if None not in acc:  # accuracy on the training pairs, measured at each evaluation
        fitted = "Both fitted their training pairs" if min(acc) >= 0.95 else "Training accuracy ended"
        said = f"accuracy on the training pairs {_pct(acc[0])} with weight decay, {_pct(acc[1])} without"
    else:  # a run recorded before that was measured: its last training batch's loss
        fitted = "Both fitted their training pairs" if max(tl_wd, tl_no) < 0.3 else "Training loss ended"
        said = f"final training loss {_n(tl_wd)} with weight decay, {_n(tl_no)} without"
    fit = (f"{fitted} ({said}); on the unseen pairs, test accuracy ended at {_pct(wd)} with weight decay and "
           f"{_pct(no)} without. ")
    jump = first_step(r["weight decay 1.0"], EXACT_MATCH, lambda v: v >= 0.9)
    spectrum = fourier_sentence(r["weight decay 1.0"].get("fourier"))
    seen = next((e for e in r["weight decay 1.0"].get("evals") or () if (e.get(f"train_{EXACT_MATCH}") or 0) >= 0.95), {})
    memorised = seen.get("step")  # training accuracy first at 95% or more (test accuracy then: seen's exact_match)
    fitted_at = next((s for s, loss in r["weight decay 1.0"].get("train") or () if loss < 0.3), None)
    since = (f"training accuracy reached {_pct(seen[f'train_{EXACT_MATCH}'])} (step {memorised}, test accuracy then "
             f"{_pct(seen[EXACT_MATCH])})" if memorised else f"training loss fell below 0.3 (step {fitted_at})")
    if wd > 0.9 and no < 0.6 and jump and (memorised or fitted_at):
        fit += (f"With weight decay, test accuracy passed 90% at step {jump}, "
                f"{max(0, jump - (memorised or fitted_at))} steps after {since}. ")
    if wd > 0.9 and no < 0.6:
        return fit + ("Memorising comes first; weight decay keeps shrinking the weights until the compact, "
                      "general algorithm wins, so test accuracy jumps long after training loss fell (see the "
                      "curves). Without it nothing pushes the model off its memorised table.") + spectrum
    if wd > 0.9:
        return fit + "This time the run without weight decay generalised too: the ablation did not separate." + spectrum
    return fit + "The jump did not happen within these steps this time; grokking can take much longer." + spectrum


PRESETS: dict[str, Preset] = {p.key: p for p in (
    Preset(
        "hello_sort", "Hello, sort",
        "A 3-layer Transformer sees 6 symbols from {0, 1, 2} and must write them sorted. How many of 300 "
        "steps does it need before it sorts every new sequence right?",
        "minGPT's demo notebook (Karpathy): gpt-nano, sort of length 6 over 3 symbols",
        (SORT,), ("held-out exact-match",), 6.0, _explain_sort),
    Preset(
        "induction", "Induction heads",
        "Random tokens, then a stretch repeats from a random offset. Can an attention-only model with 1 layer "
        "predict the repeat, or does it need 2?",
        "Olsson et al. 2022, In-context learning and induction heads (attention-only models)",
        (_variant(INDUCTION, "1 layer", model=dict(n_layers=1)), _variant(INDUCTION, "2 layers")),
        ("held-out loss", "held-out accuracy (predictable positions)"), 37.0, _explain_induction, knockout=("2 layers",), heads=("2 layers",),
        _marks=_marks_induction),
    Preset(
        "pre_post_ln", "Pre-LN vs post-LN",
        "At a high learning rate (1e-2) with no warmup, which trains: LayerNorm before each sublayer (pre-LN) "
        "or after the residual sum (post-LN, the original)? And does warmup save post-LN?",
        "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture (cosine decay in all three runs)",
        (_variant(LN, LN_RUNS[0]), _variant(LN, LN_RUNS[1], model=dict(norm="post")),
         _variant(LN, LN_RUNS[2], model=dict(norm="post"), train=dict(warmup=100))),
        ("held-out loss",), 125.0, _explain_ln),
    Preset(
        "short_long", "Train short, test long",
        "Each model trains on 32-token sequences and is tested on up to 128. Which positional encoding keeps "
        "its loss low past the training length?",
        "Press et al. 2021, Train Short, Test Long (ALiBi); here on the induction task's language-model loss",
        tuple(_variant(SHORT_LONG, pe, model=dict(pos=pe)) for pe in PES),
        ("held-out loss (longer lengths)", "held-out loss"), 111.0, _explain_short_long),
    Preset(
        "beyond", "Positions beyond training",
        "Reverse sequences of length 1-16, then 17-24. Which positional encoding, if any, still works past the "
        "training lengths? Do two seeds agree?",
        "Kazemnejad et al. 2023 (NoPE); Delétang et al. 2022. An exploration: at this size no PE wins reliably",
        tuple(_variant(BEYOND, f"{pe} seed {s}", model=dict(pos=pe), train=dict(seed=s)) for pe in PES for s in SEEDS),
        ("held-out exact-match (longer lengths)", "held-out exact-match"), 161.0, _explain_beyond),
    Preset(
        "encoder_decoder", "Original encoder-decoder",
        "The encoder reads a sequence, the decoder writes it backwards. Where will output position t look in "
        "the input through cross-attention?",
        "Vaswani et al. 2017, Attention Is All You Need (pre-LN here; sinusoidal positions)",
        (ENCDEC,), ("held-out exact-match",), 18.0, _explain_encdec),
    Preset(
        "grokking", "Grokking",
        "(a + b) mod 97 with 40% of the pairs for training. Training accuracy reaches ~100% early. Will accuracy "
        "on the unseen pairs ever follow, and what does weight decay have to do with it?",
        "Power et al. 2022; Nanda et al. 2023. Here 40% of pairs (not 30%) and no positional encoding "
        "(a + b is symmetric), so it groks within 2200 steps on a CPU; the embeddings are decayed too, as in "
        "Nanda et al.; the ablation uses the same 40%",
        (_variant(GROK, "weight decay 1.0"), _variant(GROK, "weight decay 0", train=dict(weight_decay=0.0))),
        ("held-out exact-match", "train exact-match"), 134.0, _explain_grok, fourier=("weight decay 1.0",),
        _marks=_marks_grok),
    Preset(
        "why_attention", "Why attention, not recurrence",
        "A Transformer and an LSTM of about the same size reverse 16 symbols. Which solves it in 600 steps, and "
        "which answer tokens does the other get wrong: the first ones written or the last?",
        "Vaswani et al. 2017, section 4 and Table 1: self-attention connects any two positions in O(1) steps, a "
        "recurrent layer in O(n); here an LSTM (Hochreiter and Schmidhuber 1997) in the decoder-only format",
        (_variant(RECUR, RECUR_RUNS[0]),
         _variant(RECUR, RECUR_RUNS[1], model=dict(arch="lstm", n_heads=1, d_model=80, d_ff=0, norm="none", pos="none"))),
        ("held-out exact-match",), 68.0, _explain_recurrence, distance=("LSTM",)),
    Preset(
        "why_residuals", "Why residual connections",
        "Four 6-layer Transformers sort 12 symbols: pre-LN and post-LN, each with and without residual "
        "connections (x + f(x), or f(x) alone). Which of the four learn in 200 steps?",
        "Vaswani et al. 2017, section 3.1 (a residual connection around each sublayer); He et al. 2016, Deep "
        "Residual Learning for Image Recognition",
        tuple(_variant(RESID, n, model=dict(norm="post" if n.startswith("post") else "pre",
                                            residual="off" if "no residuals" in n else "on")) for n in RESID_RUNS),
        ("held-out loss",), 200.0, _explain_residuals),
    Preset(
        "why_scaling", "Why 1/√d_k",
        "Two models with one attention head of width d_k = 128 learn to reverse sequences. One divides its "
        "scores by √128 as the paper does, the other does not. Which learns faster?",
        "Vaswani et al. 2017, section 3.2.1 and footnote 4: dot products grow with d_k and push the softmax "
        "into regions of small gradients",
        (_variant(SCALING, SCALING_RUNS[0]), _variant(SCALING, SCALING_RUNS[1], model=dict(scale="none"))),
        ("held-out loss",), 101.0, _explain_scaling),
    Preset(
        "stability", "Stability map: when post-LN needs warmup",
        "Pre-LN and post-LN, each at 4 learning rates x 3 warmups (24 runs, one seed). Predict: where on the map "
        "does post-LN learn nothing without warmup while pre-LN still trains, and does warmup move that edge?",
        "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture (here 200 steps, cosine decay)",
        tuple(stability.configs()), ("held-out loss",), 280.0, stability.explain),
    Preset(
        "table3", "Table 3 at toy scale",
        "The paper's Table 3 changes one thing at a time: one head or 32, a smaller d_k, a third of the layers, "
        "no dropout, learned positions; each made its translation model worse or no better. Which of them also "
        "hurt a small character-level language model?",
        "Vaswani et al. 2017, Table 3 (rows A-E), at toy scale: 3 layers of d_model 64 on the built-in text, "
        "held-out perplexity per character, 3 seeds per row (21 runs)",
        tuple(table3_configs()), ("held-out loss",), 1200.0, _explain_table3),
    Preset(
        "chomsky", "What attention cannot do: longer inputs",
        "Each model learns parity, even pairs and reverse on lengths 1-10, then meets lengths 11-20. Predict: "
        "which keep them right, the Transformers (one with randomized positions) or the RNN and the LSTM that "
        "attention replaced? And does any of them reverse the longer strings?",
        "Delétang et al. 2023, Neural Networks and the Chomsky Hierarchy (Table 2); Ruoss et al. 2023 (randomized "
        "positions). Here lengths 1-10 and 11-20, 1000 steps, 2 seeds (the paper: 1-40 and 41-500, 1M steps, the "
        "best of 10 seeds); the whole map, 9 architectures x 11 tasks x 3 seeds: python -m lab preset chomsky --full",
        tuple(chomsky.quick_configs()), ("held-out exact-match (longer lengths)",), 190.0, chomsky.explain,
        full=tuple(chomsky.full_configs())),
)}
