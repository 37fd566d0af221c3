"""Heads and layers are counted from 0 everywhere, and a sentence names a head the way Inspect labels it: the
encoder-decoder preset's explanation, Learn's heads page and Inspect's importance sentence name the head whose
block or cell, read from the figure or table Inspect draws, carries those labels. A source scan catches a
sentence that adds 1 to a layer or head index.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.interventions import HeadRef, head_name
from lab.teach import lessons
from lab.teach.lesson_figures import page_figure
from lab.teach.presets.catalog import PRESETS, measured
from lab.views.plots import KIND_TITLES, attention_grid
from lab.views.probe_plots import TOP_MARK, head_at, importance_frame, importance_sentence
from lab.views.probing import importance_map
from lab.records import CROSS, DEC_SELF, ENC_SELF, EXACT_MATCH, LOSS

REPO = Path(__file__).resolve().parents[1]


def blocks(fig) -> dict[tuple[str, str], np.ndarray]:
    """(layer label, head label) -> the (Tq, Tk) block of the attention grid drawn under those labels, read from
    the figure: the mosaic image and the tick labels of its top and right axes."""
    axes = [a for ax in fig.axes for a in (ax, *ax.child_axes)]  # the top and right axes are the image's children
    image_ax = next(ax for ax in axes if ax.images and ax.get_xlabel().startswith("key"))
    mosaic = np.asarray(image_ax.images[0].get_array(), dtype=float)
    top = next(ax for ax in axes if any(t.get_text().startswith("head ") for t in ax.get_xticklabels()))
    right = next(ax for ax in axes if any(t.get_text().startswith("layer ") for t in ax.get_yticklabels()))
    filled = ~np.isnan(mosaic)
    out = {}
    for x, head in zip(top.get_xticks(), [t.get_text() for t in top.get_xticklabels()]):
        for y, layer in zip(right.get_yticks(), [t.get_text() for t in right.get_yticklabels()]):
            r, c = int(round(y)), int(round(x))  # a pixel inside the block; walk to its edges
            r0 = r - np.argmin(filled[r::-1, c]) + 1 if not filled[:r + 1, c].all() else 0
            c0 = c - np.argmin(filled[r, c::-1]) + 1 if not filled[r, :c + 1].all() else 0
            r1 = r0 + (np.argmin(filled[r0:, c]) if not filled[r0:, c].all() else filled.shape[0] - r0)
            c1 = c0 + (np.argmin(filled[r, c0:]) if not filled[r, c0:].all() else filled.shape[1] - c0)
            out[(layer, head)] = mosaic[r0:r1, c0:c1]
    return out


def test_encoder_decoder_preset_names_the_head_inspect_labels():
    t = 5
    rng = np.random.default_rng(0)
    cross = rng.dirichlet(np.ones(t), size=(2, 4, t)).astype(np.float32)  # (layers, heads, Tq, Tk)
    cross[1, 2] = 0.05 / (t - 1)
    cross[1, 2, range(t), [t - 1 - i for i in range(t)]] = 0.95  # this head reads the input reversed
    labels = [str(i) for i in range(t)]
    fig = attention_grid(cross, labels, labels, KIND_TITLES["cross"])  # Inspect's cross-attention map
    share = {key: float(np.mean(b[range(t), [t - 1 - i for i in range(t)]])) for key, b in blocks(fig).items()}
    layer_label, head_label = max(share, key=share.get)  # the block that draws the anti-diagonal, as labelled
    summ = {"eval": {LOSS: 0.01, EXACT_MATCH: 1.0}, "ood": {LOSS: 3.0, EXACT_MATCH: 0.0}}
    text = PRESETS["encoder_decoder"].explain({"encoder-decoder": measured(summ, attention={"cross": cross})})
    assert f"{layer_label} {head_label} puts 95% of output position t's cross-attention" in text, text
    assert (layer_label, head_label) == ("layer 1", "head 2")  # counted from 0, as the array's index
    assert head_at(f"cross {layer_label}", head_label) == HeadRef("cross", 1, 2)  # the importance grid's cell


def test_learn_heads_page_names_the_head_it_draws():
    cfg = RunConfig(model=ModelConfig(n_layers=2, n_heads=3, d_model=48, d_ff=0, n_ctx=40),
                    task=TaskConfig(name="induction", min_len=16, max_len=16, n_symbols=16), train=TrainConfig(steps=5))
    torch.manual_seed(2)
    weights = {k: v + 0.5 * torch.randn_like(v) for k, v in lessons.load_model(cfg).state_dict().items()}
    fig, caption = page_figure("heads", lessons.Subject(cfg, weights, "a perturbed model"))
    entropy = {key: float(-(b * np.log(np.clip(b, 1e-12, 1))).sum(-1).mean()) for key, b in blocks(fig).items()}
    layer_label, head_label = min(entropy, key=entropy.get)
    assert f"The most focused head is {layer_label} {head_label} (" in caption, (caption, entropy)


def test_inspect_importance_sentence_names_the_cell_it_colours_most():
    cfg = RunConfig(model=ModelConfig(n_layers=2, n_heads=3, d_model=48, d_ff=0, n_ctx=40),
                    task=TaskConfig(name="induction", min_len=16, max_len=16, n_symbols=16),
                    train=TrainConfig(steps=5, eval_samples=64))
    torch.manual_seed(4)
    weights = {k: v + 0.3 * torch.randn_like(v) for k, v in lessons.load_model(cfg).state_dict().items()}
    imp = importance_map(lessons.load_model(cfg, weights), cfg)
    frame = importance_frame([imp]).data  # the grid Inspect shows: rows "layer L", columns "head H"
    cells = {(row["layer"], col): float(row[col].removeprefix(TOP_MARK).split(" · ")[0])
             for _, row in frame.iterrows() for col in frame.columns[1:]}
    layer_label, head_label = max(cells, key=cells.get)
    assert f"Knocking out {layer_label} {head_label} raises held-out loss" in importance_sentence([imp], step=5)
    # the cell the sentence quotes is starred, and no other (issue 34 item 6)
    starred = [(row["layer"], col) for _, row in frame.iterrows() for col in frame.columns[1:]
               if row[col].startswith(TOP_MARK)]
    assert starred == [(layer_label, head_label)]


@pytest.mark.parametrize("kind,words", [(DEC_SELF, "layer 0 head 1"), (CROSS, "cross-attention layer 0 head 1"),
                                        (ENC_SELF, "encoder self-attention layer 0 head 1")])
def test_head_name_counts_from_zero(kind, words):
    assert head_name(0, 1, kind) == words == HeadRef(kind, 0, 1).words


def test_no_sentence_adds_one_to_a_layer_or_head_index():
    """An f-string naming a layer or head by an index plus 1 ("layer {best[0] + 1}") counts from 1; and one form
    names a head everywhere, "layer 0 head 1" (Inspect's row and column labels), not "layer 0, head 1"."""
    plus_one = re.compile(r"(?i)(layer|head)s?[ ,:]*\{[^{}]*\+\s*1\s*\}")
    comma = re.compile(r"(?i)layer (\d+|\{[^{}]*\}), head (\d+|\{)")
    files = [p for folder in ("lab", "ui") for p in (REPO / folder).rglob("*.py")]
    files += [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in files
             for i, line in enumerate(p.read_text().splitlines(), 1) if plus_one.search(line) or comma.search(line)]
    assert not found, found
