"""lab.views.plots: every builder returns a fresh Figure with the expected axes; PNG export; no pyplot
(global state) and no gradio anywhere in lab/."""
from __future__ import annotations

import ast
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from lab.params import COMPONENTS, param_breakdown
from lab.views.analysis import attention, load_model, positional_view, sampled_probe
from lab.config import ModelConfig, RunConfig, TaskConfig
from lab.views.plots import KIND_TITLES, attention_grid, params_figure, pca_figure, \
    positional_figure, to_png
from tests.helpers import tiny_config
from lab.records import CROSS, ENC_SELF

LAB = Path(__file__).resolve().parents[1] / "lab"
PNG = b"\x89PNG\r\n\x1a\n"
PLOTS = tiny_config(task="reverse", n_layers=2, n_ctx=40)


def patterns(n_layers: int, n_heads: int, tq: int, tk: int) -> np.ndarray:
    x = np.random.default_rng(0).normal(size=(n_layers, n_heads, tq, tk))
    e = np.exp(x)
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def images(fig: Figure) -> list:
    return [ax for ax in fig.axes if ax.images]


def cells(fig: Figure, n_layers: int, n_heads: int, tq: int, tk: int) -> np.ndarray:
    """The (n_layers, n_heads, tq, tk) patterns read back from an attention grid's one mosaic image."""
    (ax,) = images(fig)
    img = np.asarray(ax.images[0].get_array(), dtype=np.float32)
    gap_r = (img.shape[0] - n_layers * tq) // max(1, n_layers - 1)
    gap_c = (img.shape[1] - n_heads * tk) // max(1, n_heads - 1)
    return np.array([[img[la * (tq + gap_r):la * (tq + gap_r) + tq, h * (tk + gap_c):h * (tk + gap_c) + tk]
                      for h in range(n_heads)] for la in range(n_layers)])


@pytest.mark.parametrize("n_layers,n_heads", [(1, 1), (2, 3), (3, 4)])
def test_attention_grid_has_one_heatmap_per_layer_and_head(n_layers, n_heads):
    pats = patterns(n_layers, n_heads, 5, 7)
    q, k = [f"q{i}" for i in range(5)], [f"k{i}" for i in range(7)]
    fig = attention_grid(pats, q, k, title="demo")
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 2  # the mosaic and its colorbar
    np.testing.assert_array_equal(cells(fig, n_layers, n_heads, 5, 7), pats)  # each cell drawn as given
    (ax,) = images(fig)
    img = np.asarray(ax.images[0].get_array())
    assert np.isnan(img).sum() == img.size - pats.size  # everything else is gap
    assert [t.get_text() for t in ax.get_xticklabels()] == k * n_heads  # token labels under every head
    assert [t.get_text() for t in ax.get_yticklabels()] == q * n_layers  # and beside every layer
    heads = [t.get_text() for t in ax.child_axes[0].get_xticklabels()]
    layers = [t.get_text() for t in ax.child_axes[1].get_yticklabels()]
    assert heads == [f"head {h}" for h in range(n_heads)] and layers == [f"layer {la}" for la in range(n_layers)]
    assert fig._suptitle.get_text() == "demo"
    assert to_png(fig).startswith(PNG)


def test_attention_grid_thins_long_tick_labels():
    labels = [str(i) for i in range(60)]
    fig = attention_grid(patterns(1, 1, 60, 60), labels, labels)
    shown = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert 1 < len(shown) <= 24 and shown[0] == "0"


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_attention_grid_from_a_real_model(arch):
    cfg = tiny_config(PLOTS, arch=arch)
    p = sampled_probe(cfg)
    for kind, pat in attention(load_model(cfg), p.batch).items():
        q = p.dec_labels if kind != ENC_SELF else p.src_labels
        k = p.src_labels if kind in (ENC_SELF, CROSS) else p.dec_labels
        fig = attention_grid(pat, q, k, title=KIND_TITLES[kind])
        np.testing.assert_array_equal(cells(fig, 2, 2, len(q), len(k)), pat)


@pytest.mark.parametrize("pos", ["sinusoidal", "learned"])
def test_positional_figure_for_tables(pos):
    view = positional_view(tiny_config(PLOTS, pos=pos))
    fig = positional_figure(view, title=pos)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 4  # PCA scatter, similarity heatmap, and a colorbar for each
    scatter = fig.axes[0]
    np.testing.assert_allclose(scatter.collections[0].get_offsets(), view.pca)
    assert "PC1" in scatter.get_xlabel() and "%" in scatter.get_xlabel()
    np.testing.assert_allclose(images(fig)[0].images[0].get_array(), view.similarity)
    assert to_png(fig).startswith(PNG)


@pytest.mark.parametrize("with_pca", [True, False])
@pytest.mark.parametrize("n_heads", [1, 2, 4, 8])
def test_positional_figure_for_alibi_shows_every_head_and_says_so(n_heads, with_pca):
    view = positional_view(tiny_config(PLOTS, pos="alibi", n_heads=n_heads), n=8)
    fig = positional_figure(view, with_pca=with_pca)  # the app draws it without the PCA: it showed 2 of 4 heads
    heatmaps = images(fig)
    assert len(heatmaps) == n_heads and len(fig.axes) == n_heads + 1  # a panel per head and one colour bar
    for h, ax in enumerate(heatmaps):
        np.testing.assert_allclose(ax.images[0].get_array(), view.relative[h])
        assert ax.get_title() == f"head {h}\nslope {-view.relative[h][1, 0]:.2g}"
    assert fig._supxlabel.get_text() == ("ALiBi score bias: its one head" if n_heads == 1
                                         else f"ALiBi score bias: all {n_heads} heads")
    assert to_png(fig).startswith(PNG)


def test_alibi_heads_share_one_colour_scale():
    """One colour bar speaks for every panel, so every panel uses its scale (each head's own scale
    made a gentle slope look as steep as the steepest)."""
    view = positional_view(tiny_config(PLOTS, pos="alibi", n_heads=4), n=8)
    fig = positional_figure(view, with_pca=False)
    limits = {ax.images[0].get_clim() for ax in images(fig)}
    assert limits == {(float(view.relative.min()), float(view.relative.max()))}


def test_past_sixteen_heads_the_figure_says_how_many_it_shows():
    cfg = RunConfig(model=ModelConfig(pos="alibi", d_model=64, n_heads=32, n_layers=1, d_ff=32, n_ctx=40),
                    task=TaskConfig(max_len=4))
    view = positional_view(cfg, n=6)
    fig = positional_figure(view, with_pca=False)
    heads = [int(ax.get_title().split()[1]) for ax in images(fig)]
    assert len(heads) == 16 and heads[0] == 0 and heads[-1] == 31 and heads == sorted(set(heads))
    assert fig._supxlabel.get_text() == "ALiBi score bias: 16 of 32 heads (evenly spaced)"


@pytest.mark.parametrize("pos", ["sinusoidal", "learned"])
def test_pca_figure_draws_every_position_of_this_view(pos):
    view = positional_view(tiny_config(PLOTS, pos=pos), n=12)
    fig = pca_figure(view, title="A · demo")
    ax = fig.axes[0]
    np.testing.assert_allclose(ax.collections[0].get_offsets(), view.pca)  # one dot per position, in order
    np.testing.assert_array_equal(ax.collections[0].get_array(), np.arange(12))  # coloured by position
    assert ax.get_title() == "PCA of 12 position vectors" and fig._suptitle.get_text() == "A · demo"
    assert ax.get_xlabel() == f"PC1 ({view.explained[0]:.0%} of variance)"
    assert {t.get_text() for t in ax.texts} == {"0", "11"}  # the first and last positions are labelled
    assert fig.axes[1].get_ylabel() == "position" and to_png(fig).startswith(PNG)


def test_pca_figure_refuses_an_encoding_without_position_vectors():
    with pytest.raises(ValueError, match="no position vectors"):
        pca_figure(positional_view(tiny_config(PLOTS, pos="rope"), n=6))


def test_positional_figure_for_rope_shows_its_single_pattern():
    view = positional_view(tiny_config(PLOTS, pos="rope", n_heads=4), n=8)
    fig = positional_figure(view)
    heatmaps = images(fig)
    assert len(heatmaps) == 1 and len(fig.axes) == 2  # every head shares it: one panel + colorbar
    assert heatmaps[0].get_title() == "every head"
    assert fig._supxlabel.get_text() == "RoPE relative score: one pattern shared by all 4 heads"
    np.testing.assert_allclose(heatmaps[0].images[0].get_array(), view.relative[0])
    assert to_png(fig).startswith(PNG)


def test_positional_figure_for_none_shows_the_note():
    view = positional_view(tiny_config(PLOTS, pos="none"))
    fig = positional_figure(view)
    assert len(fig.axes) == 1 and not fig.axes[0].axison
    text = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert " ".join(text.split()) == " ".join(view.note.split())
    assert to_png(fig).startswith(PNG)


def test_params_figure_stacks_each_runs_components():
    cfgs = {"learned": tiny_config(PLOTS, pos="learned"), "rope": tiny_config(PLOTS, pos="rope"),
            "enc-dec": tiny_config(PLOTS, arch="encoder-decoder")}
    breakdowns = {name: param_breakdown(cfg) for name, cfg in cfgs.items()}
    fig = params_figure(breakdowns)
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    ax = fig.axes[0]
    bars = ax.patches
    assert len(bars) == len(COMPONENTS) * len(breakdowns)
    ends = {}  # a run's bars end at its total
    for bar in bars:
        y = round(bar.get_y() + bar.get_height() / 2)
        ends[y] = max(ends.get(y, 0), bar.get_x() + bar.get_width())
    assert sorted(ends.values()) == sorted(float(sum(b.values())) for b in breakdowns.values())
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(COMPONENTS)
    assert to_png(fig).startswith(PNG)


def test_figures_are_independent_and_thread_safe():
    def draw(i: int) -> bytes:
        return to_png(attention_grid(patterns(1, 2, 4, 4), list("abcd"), list("abcd"), title=str(i)), dpi=40)

    with ThreadPoolExecutor(4) as pool:
        pngs = list(pool.map(draw, range(4)))
    assert all(p.startswith(PNG) for p in pngs)
    a, b = attention_grid(patterns(1, 1, 3, 3), "abc", "abc"), attention_grid(patterns(2, 2, 3, 3), "abc", "abc")
    assert a is not b and a.axes[0] is not b.axes[0]
    np.testing.assert_array_equal(cells(b, 2, 2, 3, 3), patterns(2, 2, 3, 3))


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_lab_never_imports_pyplot_or_gradio():
    files = sorted(LAB.rglob("*.py"))
    assert len(files) >= 10 and LAB / "views" / "plots.py" in files
    for path in files:
        mods = _imported_modules(path)
        assert not {m for m in mods if m.startswith(("matplotlib.pyplot", "matplotlib.pylab", "pylab"))}, path
        assert not {m for m in mods if m.split(".")[0] == "gradio"}, path
        text = path.read_text(encoding="utf-8")
        assert "import_module(\"matplotlib.pyplot" not in text and "plt." not in text, path
    assert "matplotlib.figure" in _imported_modules(LAB / "views" / "plots.py")


def test_attention_grid_hatches_the_heads_whose_output_is_removed():
    pats = patterns(2, 3, 5, 7)
    fig = attention_grid(pats, [f"q{i}" for i in range(5)], [f"k{i}" for i in range(7)], silenced={(1, 2), (0, 0)})
    (ax,) = images(fig)
    boxes = sorted((p.get_x(), p.get_y(), p.get_width(), p.get_height()) for p in ax.patches)
    gap_c = (np.asarray(ax.images[0].get_array()).shape[1] - 3 * 7) // 2
    gap_r = (np.asarray(ax.images[0].get_array()).shape[0] - 2 * 5) // 1
    assert boxes == [(-0.5, -0.5, 7, 5), (2 * (7 + gap_c) - 0.5, (5 + gap_r) - 0.5, 7, 5)], boxes
    assert all(p.get_hatch() == "//" for p in ax.patches)
    assert [t.get_text() for t in ax.texts] == ["output\nremoved"] * 2
    np.testing.assert_array_equal(cells(fig, 2, 3, 5, 7), pats)  # the patterns themselves are still drawn
    plain = attention_grid(pats, [f"q{i}" for i in range(5)], [f"k{i}" for i in range(7)])
    assert not images(plain)[0].patches


@pytest.mark.app
def test_after_the_warm_up_a_compare_figure_imports_nothing_more():
    """app.py warms plotly up before it serves: a figure drawn afterwards, from any thread, loads no module,
    so two first requests cannot meet in Python's import locks (they once failed with _DeadlockError)."""
    import subprocess
    import sys

    code = ("import sys, pandas as pd\n"
            "from lab.views.curve_figures import chart_of, curves_plot, warm_up\n"
            "warm_up()\n"
            "before = set(sys.modules)\n"
            "series = {n: pd.DataFrame({'x': [0.0, 1.0, 2.0], 'value': [2.0, 1.0, None]}) for n in ('a', 'b')}\n"
            "curves_plot(chart_of(series, {'a': 'held-out loss', 'b': 'held-out exact-match'},\n"
            "                     {'a': 'red', 'b': 'blue'}, {'a': 'dot', 'b': 'solid'}, 'step', 't')).to_plotly_json()\n"
            "print(sorted(set(sys.modules) - before))\n")
    from tests.helpers import REPO

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
