"""The Learn page on interventions: which heads a model needs, where in the stack its answer forms, and
what the answer becomes without its most important head. Drawn live from the chosen run (lab/views/
probing.py computes; this module only draws), in the colours of lab/teach/lesson_figures.py. Its numbers are
the importance map Inspect and the presets quote: the same function on the run's own held-out set.

Head knockout follows Michel et al. 2019 ("Are Sixteen Heads Really Better than One?"); the logit lens
is nostalgebraist 2020; the induction circuit the page points to is Olsson et al. 2022.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from matplotlib.figure import Figure

from lab.interventions import HeadRef, Interventions, applied, head_name
from lab.records import DEC_SELF
from lab.teach import lessons
from lab.views.analysis import ProbeInput
from lab.views.probing import (MATTERS, greedy_answer, importance_map, knockout_summary, logit_lens, measured_on,
                               median_ratio)

BLUE, RED, GREY = "#0072B2", "#D55E00", "#999999"
N_HELD_OUT: Optional[int] = None  # the run's own held-out set (probing.held_out_size), as Inspect and presets use


def versus_median(top: dict) -> str:
    """How the top head's rise compares with the median head's, from `knockout_summary`: a ratio only where the
    median head's knockout changes the loss measurably (`median_ratio`); else both rises in words."""
    ratio = median_ratio(top["rise"], top["median_rise"])
    if ratio is not None:
        times = f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x"
        return f"the median head raises it by {top['median_rise']:.2f}, so the top head costs {times} as much"
    median = top["median_rise"]
    how, digits = ("nothing measurable", 3) if median > -MATTERS else ("it lowers the loss", 2)
    return (f"knocking out the median head changes it by {median:.{digits}f} ({how}), so the rises are quoted, "
            f"not their ratio: +{top['rise']:.2f} against {median:+.{digits}f}")


def _right_probs(answer) -> np.ndarray:
    """Probability the answer gave its predicted token where it is right, 0 where wrong (nan: unscored)."""
    return np.array([np.nan if t.right is None else (t.probability if t.right else 0.0) for t in answer.tokens])


def interventions(s: lessons.Subject, probe: ProbeInput) -> tuple[Figure, str]:
    """Left: held-out loss rise per head knocked out. Middle: the logit lens of the probe. Right: the
    probe's answer intact and with the top head knocked out."""
    cfg = s.cfg
    model = s.model()
    imp = importance_map(model, cfg, n=N_HELD_OUT)  # the function, and the data, Inspect's map uses
    top = knockout_summary(imp)
    knock = Interventions(heads=(HeadRef(DEC_SELF, top["layer"], top["index"]),))
    intact = greedy_answer(model, cfg, probe.batch)
    with applied(model, knock):
        ablated = greedy_answer(model, cfg, probe.batch)
    lens = logit_lens(model, cfg, probe.batch)

    fig = Figure(figsize=(13.6, 3.8), layout="constrained")
    a1, a2, a3 = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1.6, 1.6]})
    rise = imp.loss - imp.intact_loss  # (layers, heads)
    im = a1.imshow(rise, cmap="viridis", aspect="auto")
    a1.set_title("held-out loss rise, one head knocked out", fontsize=9)
    a1.set_xlabel("head")
    a1.set_ylabel("layer")
    a1.set_xticks(range(rise.shape[1]))
    a1.set_yticks(range(rise.shape[0]))
    for (i, j), v in np.ndenumerate(rise):
        a1.text(j, i, f"{v:+.2f}", ha="center", va="center", fontsize=7,
                color="black" if v > rise.max() * 0.6 else "white")
    fig.colorbar(im, ax=a1, shrink=0.8)

    lens_data = np.where(np.isnan(lens.target_prob), lens.top_prob, lens.target_prob)  # (rows, T)
    a2.imshow(lens_data, cmap="cividis", vmin=0, vmax=1, aspect="auto")
    a2.set_title("logit lens: p(right next token) if the stack stopped here", fontsize=9)
    a2.set_yticks(range(len(lens.rows)), lens.rows, fontsize=7)
    T = lens_data.shape[1]
    step = max(1, -(-T // 24))
    a2.set_xticks(range(0, T, step), [probe.dec_labels[i] for i in range(0, T, step)], fontsize=7)
    a2.set_xlabel("probe position (its token)")
    if T <= 40:
        for (i, j), label in np.ndenumerate(np.array(lens.top, dtype=object)):
            a2.text(j, i, label, ha="center", va="center", fontsize=6,
                    color="black" if lens_data[i, j] > 0.6 else "white")

    x = np.arange(len(intact.tokens))
    a3.bar(x - 0.2, _right_probs(intact), 0.4, color=BLUE, label="intact")
    name = head_name(top["layer"], top["index"])
    a3.bar(x + 0.2, _right_probs(ablated), 0.4, color=RED, label=f"{name} knocked out")
    a3.set_ylim(0, 1.05)
    a3.set_title("the probe's answer: p(right token), 0 where wrong", fontsize=9)
    a3.set_xlabel("answer position" if intact.greedy else "position")
    a3.legend(fontsize=7, loc="lower right")

    scored_in, scored_out = intact.scored, ablated.scored
    wrong_in = sum(not t.right for t in scored_in)
    wrong_out = sum(not t.right for t in scored_out)
    probe_line = (f"On the probe, {wrong_in} of {len(scored_in)} answer tokens are wrong intact and {wrong_out} with "
                  f"{name} knocked out. The logit lens shows in which layer the right answer becomes likely.")
    if top["rise"] < MATTERS:
        return fig, (f"No single head matters to this model yet: knocking out any one changes its held-out loss "
                     f"({imp.intact_loss:.2f}, {measured_on(imp.n, s.step)}) by at most {top['rise']:.3f}. "
                     f"{probe_line} Pick a trained run, e.g. the 2-layer run of the Induction heads preset.")
    sentence = imp.sentence(s.step)
    return fig, f"{sentence[0].upper()}{sentence[1:]}; {versus_median(top)}. {probe_line}"
