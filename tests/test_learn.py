"""Learn tab: every page's numbers are what the model computes, every picture draws, for a trained
decoder, a trained encoder-decoder and the untrained default model (tiny configs, a few seconds)."""
from __future__ import annotations

import math
from dataclasses import replace

import gradio as gr
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from lab.teach import lesson_figures, lessons
from lab.params import param_formula
from lab.views.analysis import attention
from lab.config import ConfigError, ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.engine.jobs import JobManager
from lab.engine.recorder import record_run
from lab.teach.lesson_figures import DRAW, page_figure
from lab.teach.lesson_pages import PAGE_KEYS, PAGES, markdown, page
from lab.model import Transformer
from lab.views.plots import to_png
from lab.engine.store import RunStore
from lab.tasks.batches import get_task
from lab.trainer import train
from ui.common import AppContext
from ui.learn import NO_RUN, build_learn_tab, neighbour, page_view, subject_for
from lab.records import DEC_SELF

TINY = RunConfig(model=ModelConfig(n_layers=2, n_heads=2, d_model=16, d_ff=32, n_ctx=16),
                 task=TaskConfig(name="reverse", min_len=1, max_len=4),
                 train=TrainConfig(steps=40, batch_size=32, lr=3e-3, warmup=0, eval_every=40, eval_samples=32,
                                   snapshots=0))
TINY_ED = replace(TINY, model=replace(TINY.model, arch="encoder-decoder", pos="sinusoidal", norm="post"))


def trained(cfg: RunConfig, name: str) -> lessons.Subject:
    return lessons.Subject(cfg, train(cfg, threads=1).state_dict, name)


@pytest.fixture(scope="module")
def subjects() -> dict[str, lessons.Subject]:
    return {"decoder": trained(TINY, "tiny decoder"), "encoder-decoder": trained(TINY_ED, "tiny enc-dec"),
            "default": lessons.default_subject()}


# ---- pages -------------------------------------------------------------------------------------------
def test_pages_follow_the_data_flow():
    assert PAGE_KEYS == ("embedding", "positional", "qkv", "scaling", "mask", "softmax", "heads", "norm", "ff",
                         "cross", "output", "interventions", "circuits")
    assert [p.title.split(" · ")[0] for p in PAGES] == [str(i) for i in range(1, len(PAGES) + 1)]
    assert tuple(DRAW) == PAGE_KEYS  # one picture per page
    for p in PAGES:
        md = markdown(p)
        assert md.count("$$") == 2 and p.formula in md and p.text in md and p.exercise in md
        assert md.count("$") % 2 == 0, f"{p.key}: unbalanced inline math"
    with pytest.raises(KeyError, match="not a Learn page"):
        page("nope")


def test_neighbour_pages_clamp_at_the_ends():
    assert neighbour("embedding", -1) == "embedding" and neighbour("embedding", 1) == "positional"
    assert neighbour("circuits", 1) == "circuits" and neighbour("circuits", -1) == "interventions"
    assert neighbour(None, 1) == "positional"


# ---- numbers -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
@pytest.mark.parametrize("pos", ["learned", "rope", "alibi"])
def test_first_layer_attention_is_what_the_model_computes(arch, pos):
    cfg = replace(TINY, model=replace(TINY.model, arch=arch, pos=pos))
    s = lessons.Subject(cfg, None, "init")
    probe = s.probe()
    a = lessons.first_layer_attention(s, probe)
    model_pattern = attention(s.model(), probe.batch)[DEC_SELF][0]  # (H, T, T), layer 0
    np.testing.assert_allclose(a.pattern, model_pattern, atol=1e-5)
    T, H, dk = len(probe.dec_labels), cfg.model.n_heads, cfg.model.d_head
    assert a.q.shape == a.k.shape == a.v.shape == (H, T, dk) and a.h.shape == (T, cfg.model.d_model)
    assert np.array_equal(a.future, np.triu(np.ones((T, T), bool), 1))
    assert np.all(a.pattern[:, a.future] == 0) and np.allclose(a.pattern.sum(-1), 1)
    assert np.all(a.unscaled[:, a.future] == 0) and np.allclose(a.unscaled.sum(-1), 1)
    bias = a.scores - a.raw / math.sqrt(dk)  # ALiBi's bias survives the scaling unchanged; nothing else is added
    assert np.allclose(bias, 0, atol=1e-6) == (pos != "alibi")


def test_softmax_without_scaling_is_sharper_for_a_trained_model(subjects):
    s = subjects["decoder"]
    a = lessons.first_layer_attention(s, s.probe())
    assert a.unscaled.max(-1).mean() > a.pattern.max(-1).mean()


def test_dot_product_spread_grows_as_sqrt_dk_and_scaling_removes_it():
    spread = lessons.dot_product_spread(n=4096)
    np.testing.assert_allclose(spread["unscaled"], np.sqrt(spread["d_k"]), rtol=0.06)
    np.testing.assert_allclose(spread["scaled"], 1.0, rtol=0.06)


def test_without_the_scaling_wide_heads_attend_to_one_key():
    """The softmax's entropy over 16 random keys: unchanged by d_k with the scaling (scores of variance 1), falling
    towards one-hot (0 nats) without it, as the scores' variance grows as d_k."""
    spread = lessons.dot_product_spread()
    h, h_raw = spread["entropy_scaled"], spread["entropy_unscaled"]
    assert h.max() - h.min() < 0.1 and 2.2 < h.mean() < np.log(16)  # variance-1 scores: not uniform, never sharp
    assert np.all(np.diff(h_raw[1:]) < 0) and h_raw[0] == pytest.approx(h[0])  # d_k = 1: the same scores
    assert h_raw[spread["d_k"] == 128][0] < 0.4 and h_raw[-1] < 0.2  # nearly one-hot


@pytest.mark.parametrize("name", ["decoder", "encoder-decoder", "default"])
def test_only_the_mask_keeps_the_future_out(subjects, name):
    s = subjects[name]
    leak = lessons.causal_leak(s, s.probe())
    t = leak.changed
    assert 0 < t < len(leak.masked)
    assert np.all(leak.masked[:t] == 0), leak.masked  # exactly: earlier outputs never see a later token
    assert leak.masked[t] > 0 and leak.unmasked[t] > 0
    assert leak.unmasked[:t].min() > 0  # without the mask every earlier output moves


def test_learned_rows_past_the_training_length_never_move(subjects):
    s = subjects["decoder"]
    pb = lessons.positions_beyond(s)
    assert pb.train_len == lessons.train_len(s.cfg) == 4 + 1 + 4 - 1  # prompt, separator, answer, minus the last
    assert pb.n_ctx == 16 and pb.learned_moved.shape == (16,) and pb.learned_next.shape == (15,)
    assert np.all(pb.learned_moved[pb.train_len:] == 0)  # AdamW without decay on embeddings: untouched rows
    assert np.all(pb.learned_moved[:pb.train_len] > 0)
    assert pb.sin_next is not None and len(pb.sin_next) > pb.n_ctx  # sinusoidal goes past n_ctx
    assert np.ptp(pb.sin_next) < 1e-6  # PE[p].PE[p+1] depends on the offset only
    untrained = lessons.positions_beyond(lessons.Subject(s.cfg, None, "init"))
    assert np.all(untrained.learned_moved == 0)


def test_non_learned_runs_get_an_untrained_learned_table(subjects):
    pb = lessons.positions_beyond(subjects["encoder-decoder"])  # sinusoidal
    assert "untrained learned table" in pb.learned_source and np.all(pb.learned_moved == 0)
    assert pb.train_len == 4  # the encoder reads the prompt, the decoder SEP + answer[:-1]


def test_pre_and_post_ln_at_init(subjects):
    r = lessons.norm_placement(subjects["decoder"].cfg)
    assert r.n_layers == lessons.LN_MIN_LAYERS
    for key, g in r.grad.items():
        assert g.shape == (r.n_layers,) and np.all(np.isfinite(g)) and np.all(g > 0), key
    for init in ("xavier", "lab"):
        np.testing.assert_allclose(r.stream[(init, "post")][1:], 1.0, atol=1e-3)  # LN output, gamma 1 beta 0
        assert r.stream[(init, "pre")][0] == r.stream[(init, "post")][0]  # the same embeddings
    assert np.all(np.diff(r.stream[("xavier", "pre")]) > 0)  # pre-LN's residual stream grows with depth
    assert r.grad[("xavier", "post")][-1] > r.grad[("xavier", "pre")][-1]  # Xiong et al.: larger near the output


def test_page_8_names_the_deeper_models_it_draws_and_page_10_says_the_model_has_no_cross_attention(ctx):
    """Page 8 draws fresh models at least LN_MIN_LAYERS deep: its "model shown" line says so, not the chosen
    model's 2 layers alone; page 10 on a decoder-only model of a decoder-only task blames the model."""
    fig, shown, caption = page_view(ctx, "norm", NO_RUN, "")
    n = lessons.LN_MIN_LAYERS
    assert f"pre-LN and post-LN models {n} layers deep" in shown and "the chosen model has 2" in shown, shown
    assert caption.startswith(f"{n} layers, one backward pass"), caption
    deep = lessons.Subject(replace(TINY, model=replace(TINY.model, n_layers=n + 1)), None, "a deep model")
    assert lesson_figures.shown_on_page("norm", deep) == "a deep model"  # deep enough: the model itself
    induction = lessons.Subject(replace(TINY, model=replace(TINY.model, n_ctx=32),
                                        task=TaskConfig(name="induction", min_len=12, max_len=12)), None, "x")
    fig, caption = page_figure("cross", induction)
    text = "".join("".join(t.get_text() for ax in fig.axes for t in ax.texts).split())  # the wrapped lines, joined
    assert "decoder-only,soithasnocross-attention" in text and "task,induction" in text, text
    assert caption == "No cross-attention to draw: the chosen model is decoder-only.", caption


def test_ff_units_and_attention_only_models(subjects):
    s = subjects["decoder"]
    z, act = lessons.ff_units(s, s.probe())
    assert z.shape == (len(s.probe().dec_labels), TINY.model.d_ff)
    np.testing.assert_allclose(act, torch.nn.functional.gelu(torch.from_numpy(z)).numpy(), atol=1e-6)
    no_ff = lessons.Subject(replace(TINY, model=replace(TINY.model, d_ff=0)), None, "attention-only")
    assert lessons.ff_units(no_ff, no_ff.probe()) is None


def test_embedding_table_is_the_models(subjects):
    s = subjects["decoder"]
    table, labels, sim = lessons.embedding_table(s)
    vocab = get_task("reverse").vocab_size(TINY.task)
    assert table.shape == (vocab, 16) and len(labels) == vocab and labels[-1] == "|"
    np.testing.assert_allclose(table, s.weights["tok_emb.weight"].double().numpy())
    np.testing.assert_allclose(np.diag(sim), 1.0)


@pytest.mark.parametrize("cfg", [TINY, TINY_ED, RunConfig()], ids=["decoder", "encoder-decoder", "default"])
def test_parameter_count_against_layers_is_the_closed_form_and_the_model(cfg):
    layers, parts = lessons.params_by_layers(cfg)
    assert list(layers) == list(range(1, 13))
    vocab = get_task(cfg.task.name).vocab_size(cfg.task)
    for n in (1, 2, 5):
        mc = replace(cfg.model, n_layers=n)
        assert {c: int(v[n - 1]) for c, v in parts.items()} == param_formula(mc, vocab)
        assert sum(int(v[n - 1]) for v in parts.values()) == Transformer(mc, vocab).num_params()


# ---- pictures ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["decoder", "encoder-decoder", "default"])
@pytest.mark.parametrize("key", PAGE_KEYS)
def test_every_page_draws(subjects, name, key):
    fig, caption = page_figure(key, subjects[name])
    assert isinstance(fig, Figure) and fig.axes
    assert 20 < len(caption) < 600 and "nan" not in caption.lower() and "{" not in caption, caption  # formatted
    assert len(to_png(fig, dpi=30)) > 2000


def test_mask_picture_is_lower_triangular(subjects):
    fig, _ = page_figure("mask", subjects["decoder"])
    scores, weights = (ax.images[0].get_array() for ax in fig.axes if ax.images)  # colour bars have none
    T = weights.shape[0]
    upper = np.triu(np.ones((T, T), bool), 1)
    assert np.array_equal(np.ma.getmaskarray(scores), upper)  # -inf above the diagonal: drawn grey
    assert np.all(np.asarray(weights)[upper] == 0) and np.all(np.asarray(weights)[~upper] > 0)


def test_parameter_plot_bars_stack_to_the_closed_form_count(subjects):
    s = subjects["encoder-decoder"]
    fig, caption = page_figure("output", s)
    ax = fig.axes[-1] if fig.axes[-1].patches else next(a for a in fig.axes if a.patches)
    tops: dict[float, float] = {}
    for bar in ax.patches:
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    vocab = get_task("reverse").vocab_size(TINY.task)
    for n in range(1, 13):
        assert tops[n] == sum(param_formula(replace(s.cfg.model, n_layers=n), vocab).values())
    built = f"{s.model().num_params():,} parameters at 2 layers"
    assert caption.startswith(built), caption


def test_cross_page_explains_decoder_only_and_decoder_only_tasks(subjects):
    _, caption = page_figure("cross", subjects["decoder"])
    assert "untrained encoder-decoder" in caption
    ind = lessons.Subject(RunConfig(model=ModelConfig(n_ctx=64), task=TaskConfig(name="induction", min_len=8, max_len=16)),
                    None, "induction")
    fig, caption = page_figure("cross", ind)
    assert caption == "No cross-attention to draw: the chosen model is decoder-only." and fig.axes


def test_typed_probe_and_bad_probe(subjects):
    s = subjects["decoder"]
    a = lessons.first_layer_attention(s, s.probe("3 1 2"))
    assert a.labels == ["3", "1", "2", "|", "2", "1"]
    with pytest.raises(ConfigError, match="probe"):
        page_figure("qkv", s, "3 x 2")


# ---- the tab ---------------------------------------------------------------------------------------
@pytest.fixture()
def ctx(tmp_path):
    store = RunStore(tmp_path / "runs")
    yield AppContext(store=store, jobs=JobManager(store))
    store.close()


def test_subject_for_runs_with_and_without_weights(ctx):
    assert subject_for(ctx, NO_RUN).source.startswith("a fresh, untrained model built from the default config")
    assert subject_for(ctx, None).cfg == RunConfig()
    done = ctx.store.create(TINY)
    record_run(ctx.store, done, threads=1)
    s = subject_for(ctx, done)
    assert s.trained and s.cfg == TINY and "final weights after 40 steps" in s.source
    queued = ctx.store.create(TINY_ED)
    s = subject_for(ctx, queued)
    assert not s.trained and "no final weights yet" in s.source
    fig, shown, caption = page_view(ctx, "heads", queued, "")
    assert shown.startswith("**Model shown:** run ") and caption and fig.axes
    with pytest.raises(FileNotFoundError):
        subject_for(ctx, "20990101-000000-reverse-learned-pre-abcdef")
    with pytest.raises(KeyError):
        page_view(ctx, "nope", NO_RUN, "")
    with pytest.raises(ConfigError, match="probe"):
        page_view(ctx, "qkv", NO_RUN, "1 " * 600)
    with pytest.raises(ConfigError, match="run_id"):
        page_view(ctx, "qkv", 12, "")
    with pytest.raises(ValueError):
        page_view(ctx, "qkv", "../../etc", "")


def test_the_tab_builds_without_computing_and_names_its_events(ctx, monkeypatch):
    import ui.learn

    monkeypatch.setattr(ui.learn, "page_figure", lambda *a: pytest.fail("a picture was drawn at build time"))
    with gr.Blocks() as demo:
        with gr.Tabs():
            build_learn_tab(ctx)
    names = {fn.api_name for fn in demo.fns.values()}
    assert {"learn_runs", "learn_open", "learn_text", "learn_figure", "learn_redraw", "learn_prev",
            "learn_next"} <= names
