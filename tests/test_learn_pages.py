"""What the Learn pages claim is visible in their pictures, on the default untrained model too."""
from __future__ import annotations

import pytest

from lab.teach import lessons
from lab.teach.lesson_figures import page_figure

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def subject() -> lessons.Subject:
    return lessons.default_subject()


def test_scaling_page_shows_the_difference_scaling_makes(subject):
    """Untrained, the model's own q.k are tiny and both pictures looked the same (0.22 against 0.23); the
    page then shows q, k at unit variance, where removing the scaling makes softmax far peakier."""
    fig, caption = page_figure("scaling", subject)
    left, right = fig.axes[1].images[0].get_array(), fig.axes[2].images[0].get_array()
    assert "unit variance" in fig.axes[1].get_title() and "unit variance" in fig.axes[2].get_title()
    assert right.max(axis=-1).mean() - left.max(axis=-1).mean() > 0.2, caption
    assert "rescaled to unit variance" in caption


def test_positional_page_panels_cover_the_same_positions(subject):
    """The similarity map covers the whole table (it covered the 32 training positions), and both line
    panels share one x-range (the sinusoidal formula goes on past the table's end, the learned table stops)."""
    fig, _ = page_figure("positional", subject)
    n_ctx = subject.cfg.model.n_ctx
    heat, next_sim, moved = fig.axes[:3]
    assert heat.images[0].get_array().shape == (n_ctx, n_ctx)
    assert next_sim.get_xlim() == moved.get_xlim() and moved.get_xlim()[1] >= n_ctx  # one x-range for both


def test_mask_page_draws_every_bar_inside_its_axes(subject):
    fig, _ = page_figure("mask", subject)
    bars = next(ax for ax in fig.axes if ax.get_title() == "largest change of the output logits")
    top = max(p.get_height() for p in bars.patches)
    assert bars.get_ylim()[1] >= 1.5 * top, (bars.get_ylim(), top)  # headroom: the tallest bar is not cut


def test_interventions_page_quotes_the_map_it_draws():
    """The caption's numbers are the importance map of the model shown; the map panel draws the same
    values; a trained induction-like model is not needed for the claim to be checkable."""
    import numpy as np
    import torch

    from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
    from lab.teach.lesson_interventions import N_HELD_OUT
    from lab.views.probing import importance_map, knockout_summary

    cfg = RunConfig(model=ModelConfig(n_layers=2, n_heads=2, d_model=32, d_ff=0, n_ctx=40),
                    task=TaskConfig(name="induction", min_len=16, max_len=16, n_symbols=16), train=TrainConfig(steps=5))
    torch.manual_seed(1)
    weights = {k: v + 0.3 * torch.randn_like(v) for k, v in lessons.load_model(cfg).state_dict().items()}
    s = lessons.Subject(cfg, weights, "a perturbed model")
    fig, caption = page_figure("interventions", s)
    imp = importance_map(s.model(), cfg, n=N_HELD_OUT)
    k = knockout_summary(imp)
    assert f"layer {k['layer']} head {k['index']} raises held-out loss from {imp.intact_loss:.2f}" in caption
    assert f"by {k['median_rise']:.2f}" in caption
    drawn = fig.axes[0].images[0].get_array()
    assert np.allclose(drawn, imp.loss - imp.intact_loss)
    assert len(fig.axes[1].get_yticklabels()) == cfg.model.n_layers + 1  # embedding + each layer


def test_interventions_page_on_an_untrained_model_says_no_head_matters_yet(subject):
    _, caption = page_figure("interventions", subject)
    assert caption.startswith("No single head matters to this model yet") and "Induction heads preset" in caption
