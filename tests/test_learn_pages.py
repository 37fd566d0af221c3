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
