"""Tables and figures of what a trained model answers and how interventions change it (lab/views/probing.py):
the answer token by token, held-out metrics intact vs intervened, the head importance grid (a table whose
cells are coloured like a heatmap), and the logit lens as a layers x positions picture.

Tables are pandas frames (or Stylers, where colour carries meaning); figures are fresh matplotlib Figures
(never pyplot's state) in colour-blind-safe viridis, as in lab/views/plots.py.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from pandas.io.formats.style import Styler

from lab.interventions import HeadRef
from lab.views.probing import Answer, ImportanceMap, Lens
from lab.records import CROSS, DEC_SELF, ENC_SELF, EXACT_MATCH, LOSS, TOKEN_ACC

RIGHT, WRONG, MARK = "✓", "✗", "✓/✗"
MARK_COLOURS = {RIGHT: "color: #1a7f37; font-weight: bold", WRONG: "color: #cf222e; font-weight: bold"}
ROW_PREFIX = {DEC_SELF: "", ENC_SELF: "enc ", CROSS: "cross "}  # importance rows: "layer 1", "enc layer 1"
KIND_NAMES = {DEC_SELF: "", ENC_SELF: "encoder self-attention: ", CROSS: "cross-attention: "}
MAX_LENS_LABELS = 48  # past this many positions the lens cells are too narrow for a token label


# ---- the model's answer ------------------------------------------------------------------------------
def answer_frame(answer: Answer, inputs: Sequence[str] = ()) -> pd.DataFrame:
    """One row per answer token: the model's prediction, the right answer, ✓ or ✗, the prediction's
    probability (short headers: the table shares a row with the answer under interventions). For a language
    model (next-token predictions) also the input token at that position; a position with no right answer
    has "—" and no mark."""
    rows = []
    for i, t in enumerate(answer.tokens):
        row = {"#": i + 1}
        if not answer.greedy:
            row["input"] = inputs[i] if i < len(inputs) else ""
        row.update({"predicted": t.predicted, "right": "—" if t.expected is None else t.expected,
                    MARK: "" if t.right is None else RIGHT if t.right else WRONG, "prob.": f"{t.probability:.2f}"})
        rows.append(row)
    return pd.DataFrame(rows)


def styled_answer(frame: pd.DataFrame) -> Styler:
    """The answer table with its ✓ green and ✗ red."""
    if frame.empty:
        return frame.style
    return frame.style.map(lambda v: MARK_COLOURS.get(v, ""), subset=[MARK]).hide(axis="index")


def answer_summary(answer: Answer) -> str:
    """One line: "answer right" / "2 of 8 tokens wrong" (greedy), or about the scored next-token predictions."""
    scored = answer.scored
    wrong = sum(1 for t in scored if not t.right)
    if not scored:
        return "no position of this input has a known right next token"
    if answer.greedy:
        return "answer right" if wrong == 0 else f"{wrong} of {len(scored)} tokens wrong"
    what = "next-token predictions" if len(scored) > 1 else "next-token prediction"
    return f"all {len(scored)} scored {what} right" if wrong == 0 else f"{wrong} of {len(scored)} scored {what} wrong"


# ---- held-out metrics, intact and intervened --------------------------------------------------------
METRIC_ROWS = (("loss", LOSS, "{:.3f}"), ("token accuracy", TOKEN_ACC, "{:.1%}"),
               ("exact-match", EXACT_MATCH, "{:.1%}"),
               ("accuracy (predictable positions)", "predictable_acc", "{:.1%}"))
SPLIT_NAMES = {"eval": "training lengths", "ood": "longer lengths"}


def metrics_frame(report: dict) -> pd.DataFrame:
    """`ablation_report`'s result as rows (metric at training lengths, then at longer ones where the task has
    them) and columns intact / with interventions: the metrics the report quotes for its task (a text run's
    loss alone, induction's loss and accuracy on the predictable positions), else loss, token accuracy and
    exact-match."""
    keys = report.get("quoted") or (LOSS, TOKEN_ACC, EXACT_MATCH)
    rows = []
    for split, where in SPLIT_NAMES.items():
        intact, ablated = report["intact"].get(split), report["ablated"].get(split)
        if intact is None:
            continue
        for name, key, fmt in (r for k in keys for r in METRIC_ROWS if r[1] == k and k in intact):
            rows.append({"held-out metric": f"{name} ({where})", "intact": fmt.format(intact[key]),
                         "with interventions": fmt.format(ablated[key])})
    return pd.DataFrame(rows)


# ---- head importance ---------------------------------------------------------------------------------
TOP_MARK = "★ "  # before the value of the importance grid's cell that the sentence above it quotes


def importance_rows(maps: Sequence[ImportanceMap]) -> list[tuple[str, int]]:
    """(kind, layer) of each grid row, in order."""
    return [(m.kind, layer) for m in maps for layer in range(m.loss.shape[0])]


def importance_frame(maps: Sequence[ImportanceMap]) -> Styler:
    """A layers x heads grid per attention kind: each cell the change in held-out loss when that head alone
    is knocked out, and the accuracy then (`ImportanceMap.beside`: exact-match, induction's accuracy on the
    predictable positions, none for text), coloured by the loss change (viridis, shared by every kind). The
    cell of the head whose knockout raises the loss most, the one `importance_sentence` (and the induction
    preset's sentence) quotes, is starred (`TOP_MARK`)."""
    rows = importance_rows(maps)
    n_heads = maps[0].loss.shape[1]
    rise = np.concatenate([m.loss - m.intact_loss for m in maps])  # (rows, heads)
    beside = [m.beside() for m in maps]
    acc = None if None in beside else np.concatenate([b[1] for b in beside])  # (rows, heads)
    heads = [f"head {h}" for h in range(n_heads)]
    top_cell = np.unravel_index(int(np.argmax(rise)), rise.shape)  # (row, head) of the largest rise

    def cell(r: int, h: int) -> str:
        mark = TOP_MARK if (r, h) == top_cell else ""
        return mark + f"{rise[r, h]:+.2f}" + ("" if acc is None else f" · {acc[r, h]:.0%}")

    frame = pd.DataFrame([[f"{ROW_PREFIX[k]}layer {layer}"] + [cell(r, h) for h in range(n_heads)]
                          for r, (k, layer) in enumerate(rows)], columns=["layer"] + heads)
    top = max(float(rise.max()), 1e-9)
    cmap = colormaps["viridis"]

    def css(value: float) -> str:
        rgba = cmap(float(np.clip(value / top, 0.0, 1.0)))
        luminance = 0.2126 * rgba[0] + 0.7152 * rgba[1] + 0.0722 * rgba[2]
        return f"background-color: {to_hex(rgba)}; color: {'#000000' if luminance > 0.45 else '#ffffff'}"

    colours = pd.DataFrame([[css(v) for v in row] for row in rise], columns=heads)  # (rows, heads) CSS
    return frame.style.apply(lambda _: colours, axis=None, subset=heads).hide(axis="index")


def head_at(row_label: str, column: str) -> Optional[HeadRef]:
    """The head of the grid cell in row `row_label` ("layer 1", "enc layer 0") and column `column`
    ("head 2"); None for the label column or anything else."""
    row = re.fullmatch(r"(?:(enc|cross) )?layer (\d+)", str(row_label).strip())
    col = re.fullmatch(r"head (\d+)", str(column).strip())
    if row is None or col is None:
        return None
    kind = {"enc": ENC_SELF, "cross": CROSS, None: DEC_SELF}[row.group(1)]
    return HeadRef(kind, int(row.group(2)), int(col.group(1)))


def importance_sentence(maps: Sequence[ImportanceMap], step: Optional[int] = None) -> str:
    """The measured sentence for the head whose knockout raises the loss most, over every kind (`step`: of
    the weights measured, said in the sentence)."""
    best = max(maps, key=lambda m: m.ranked()[0][1])
    text = KIND_NAMES[best.kind] + best.sentence(step)
    return text[0].upper() + text[1:] + "."


# ---- logit lens --------------------------------------------------------------------------------------
def lens_figure(lens: Lens, tokens: Sequence[str], title: str = "Logit lens") -> Figure:
    """Rows: the residual stream after the embedding and after each layer, read through the final norm and
    the head; columns: input positions. Colour: the probability of the right next token, or of the top
    token where the position has no right answer (its tick label grey and italic); each cell is labelled
    with the token the model would predict there."""
    n_rows, n_pos = lens.top_prob.shape
    known = ~np.isnan(lens.target_prob)  # (rows, T)
    value = np.where(known, lens.target_prob, lens.top_prob)  # (rows, T)
    w = max(5.0, 1.9 + 0.36 * n_pos)
    fig = Figure(figsize=(w, 1.5 + 0.42 * n_rows), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(value, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    if n_pos <= MAX_LENS_LABELS:
        for r in range(n_rows):
            for t in range(n_pos):
                ax.text(t, r, lens.top[r][t], ha="center", va="center", fontsize=7,
                        color="black" if value[r, t] > 0.55 else "white")
    ax.set_xticks(range(n_pos), [tokens[t] if t < len(tokens) else "" for t in range(n_pos)], fontsize=7)
    for t, tick in enumerate(ax.get_xticklabels()):
        if not known[-1, t]:
            tick.set_color("0.55")
            tick.set_fontstyle("italic")
    ax.set_yticks(range(n_rows), list(lens.rows), fontsize=8)
    ax.set_xlabel("input position (token); grey italic: no right next token, colour is the top token's probability",
                  fontsize=8)
    ax.tick_params(length=0)
    fig.colorbar(im, ax=ax, label="P(right next token)", shrink=0.9)
    ax.set_title(title, fontsize=10)
    return fig
