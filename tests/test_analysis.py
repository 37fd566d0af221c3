"""lab.views.analysis: parameter counts (closed form vs modules, BERT-base anchor), positional views,
typed probes and attention patterns. Tiny configs only; no training."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from lab.params import COMPONENTS, block_params, module_params, param_breakdown, param_formula
from lab.derived import default_lengths
from lab.views.analysis import allowed_symbols, attention, load_model, parse_probe, positional_view, \
    probe_symbols, sampled_probe
from lab.config import ARCHS, TRANSFORMERS, NORMS, POS_ENCODINGS, RECURRENT, TASK_NAMES, ConfigError, ModelConfig
from lab.model import Block
from lab.tasks.batches import IGNORE_INDEX, get_task, probe
from lab.trainer import build_model
from tests.helpers import tiny_config
from lab.records import CROSS, DEC_SELF, ENC_SELF

D, N_CTX = 16, 40  # reverse with max_len 4: longest sequence 2 * 8 = 16 tokens, so 40 leaves room
ANALYSIS = tiny_config(task="reverse", d_model=D, n_layers=2, n_ctx=N_CTX)


# ---- parameter counts ------------------------------------------------------------------
PRODUCT = list(itertools.product(ARCHS, NORMS, POS_ENCODINGS, (0, 32)))


@pytest.mark.parametrize("arch,norm,pos,d_ff", PRODUCT, ids=["-".join(map(str, p)) for p in PRODUCT])
def test_param_formula_equals_module_count(arch, norm, pos, d_ff):
    cfg = tiny_config(ANALYSIS, arch=arch, norm=norm, pos=pos, d_ff=d_ff)
    model = build_model(cfg)
    vocab = get_task("reverse").vocab_size(cfg.task)
    formula = param_formula(cfg.model, vocab)
    counted = module_params(model)
    assert set(formula) == set(COMPONENTS)
    assert formula == counted
    assert sum(formula.values()) == model.num_params() == sum(p.numel() for p in model.parameters())
    assert param_breakdown(cfg) == formula
    if arch in RECURRENT:  # embedding, recurrent layers, head: the Transformer's knobs add nothing
        assert formula["recurrent"] > 0 and formula["attention"] == formula["mlp"] == formula["norms"] == 0
        return
    assert formula["recurrent"] == 0
    assert formula["mlp"] == 0 if d_ff == 0 else formula["mlp"] > 0
    assert (formula["norms"] == 0) == (norm == "none")


@pytest.mark.parametrize("task", TASK_NAMES)
def test_param_breakdown_uses_each_tasks_vocabulary(task):
    cfg = tiny_config(ANALYSIS, task=task, max_len=6, n_ctx=64,
                      min_len=4 if get_task(task).lm else default_lengths(task)[0])
    model = build_model(cfg)
    assert model.vocab_size == get_task(task).vocab_size(cfg.task)
    assert param_breakdown(cfg) == module_params(model)
    assert sum(param_breakdown(cfg).values()) == model.num_params()


def test_block_params_matches_bert_base_layer():
    d, d_ff = 768, 3072
    per = block_params(d, d_ff, "post")
    assert per == {"attention": 4 * d * d + 4 * d, "mlp": 2 * d * d_ff + d_ff + d, "norms": 4 * d}
    assert sum(per.values()) == 7_087_872 == 12 * d * d + 13 * d
    block = Block(ModelConfig(d_model=768, n_heads=12, d_ff=3072, norm="post", activation="gelu"),
                  causal=False, cross=False)
    assert sum(p.numel() for p in block.parameters()) == 7_087_872
    by_name = module_params(torch.nn.ModuleDict({"blocks": torch.nn.ModuleList([block])}))
    assert {k: by_name[k] for k in per} == per
    # pre-LN has the same per-block count; "none" drops the two LayerNorms; cross adds an attention + LN
    assert sum(block_params(d, d_ff, "pre").values()) == 7_087_872
    assert sum(block_params(d, d_ff, "none").values()) == 7_087_872 - 4 * d
    assert sum(block_params(d, d_ff, "post", cross=True).values()) == 7_087_872 + 4 * d * d + 4 * d + 2 * d


def test_bert_base_total_from_our_block_count():
    d, vocab, n_pos = 768, 30_522, 512
    layers = 12 * sum(block_params(d, 3072, "post").values())
    embeddings = vocab * d + n_pos * d + 2 * d + 2 * d  # tokens, positions, token types, embedding LN
    assert layers + embeddings == 108_891_648
    assert layers + embeddings + d * d + d == 109_482_240  # + pooler
    # the same from param_formula: a 12-layer post-LN decoder with 512 learned positions, minus our
    # output head (BERT ties its MLM decoder to the embedding), plus token types and embedding LN
    ours = param_formula(ModelConfig(d_model=d, n_heads=12, d_ff=3072, n_layers=12, norm="post",
                                     pos="learned", n_ctx=n_pos), vocab)
    assert ours["positional"] == n_pos * d and ours["head"] == vocab * d
    assert sum(ours.values()) - ours["head"] + 2 * d + 2 * d == 108_891_648


@pytest.mark.parametrize("arch,norm", list(itertools.product(TRANSFORMERS, NORMS)))
def test_only_learned_pe_adds_parameters(arch, norm):
    counts = {pos: module_params(build_model(tiny_config(ANALYSIS, arch=arch, norm=norm, pos=pos)))
              for pos in POS_ENCODINGS}
    base = counts["none"]
    for pos, c in counts.items():
        extra = N_CTX * D if pos == "learned" else 0
        assert c["positional"] == extra, pos
        for key in COMPONENTS:
            assert key == "positional" or c[key] == base[key], (pos, key)
        assert sum(c.values()) == sum(base.values()) + extra


# ---- positional views ------------------------------------------------------------------
def test_principal_components_by_hand():
    """Points on the line y = 2x plus a small orthogonal wobble: the first component is that line's direction
    (sign: its largest loading positive), the coordinates are the points' centred distances along it, and
    the two shares are the variances along the line and across it over the total."""
    from lab.views.analysis import principal_components

    t, w = np.array([-2.0, -1.0, 0.0, 1.0, 2.0]), np.array([0.1, -0.1, 0.0, -0.1, 0.1])
    line, across = np.array([1.0, 2.0]) / np.sqrt(5), np.array([-2.0, 1.0]) / np.sqrt(5)
    x = 3.0 + t[:, None] * line + w[:, None] * across  # (5, 2), centred at (3, 3)
    coords, share = principal_components(x, 2)
    np.testing.assert_allclose(coords[:, 0], t, atol=1e-12)  # along (1, 2)/sqrt 5: its y loading is the largest
    np.testing.assert_allclose(np.abs(coords[:, 1]), np.abs(w), atol=1e-12)
    total = (t ** 2).sum() + (w ** 2).sum()
    np.testing.assert_allclose(share, [(t ** 2).sum() / total, (w ** 2).sum() / total], rtol=1e-12)
    assert principal_components(x, 1)[0].shape == (5, 1)


@pytest.mark.parametrize("pos", ["sinusoidal", "learned"])
def test_positional_view_of_absolute_encodings(pos):
    cfg = tiny_config(ANALYSIS, pos=pos)
    n = get_task("reverse").max_seq_len(cfg.task, "decoder")
    v = positional_view(cfg)
    assert v.pos == pos and v.note is None and v.relative is None
    assert v.table.shape == (n, D)
    assert v.pca.shape == (n, 2)
    assert v.explained.shape == (2,)
    assert np.all(v.explained > 0) and np.all(v.explained <= 1) and v.explained.sum() <= 1 + 1e-9
    assert v.explained[0] >= v.explained[1]
    # the PCA coordinates are centred and carry exactly the reported share of the variance
    centred = v.table - v.table.mean(0)
    np.testing.assert_allclose(v.pca.mean(0), 0, atol=1e-9)
    np.testing.assert_allclose(v.pca.var(0) / centred.var(0).sum(), v.explained, rtol=1e-6)
    sim = v.similarity
    assert sim.shape == (n, n)
    np.testing.assert_allclose(np.diag(sim), 1, atol=1e-9)
    np.testing.assert_allclose(sim, sim.T, atol=1e-12)
    assert sim.min() >= -1 - 1e-9 and sim.max() <= 1 + 1e-9
    # an explicit n narrows the view
    assert positional_view(cfg, n=5).table.shape == (5, D)


def test_sinusoidal_view_is_the_vaswani_table():
    v = positional_view(tiny_config(ANALYSIS, pos="sinusoidal"))
    np.testing.assert_allclose(v.table[0], [0, 1] * (D // 2), atol=1e-7)
    np.testing.assert_allclose(v.table[1, :2], [math.sin(1), math.cos(1)], atol=1e-6)
    # all norms are equal, so cosine similarity between p and p+k depends on k only (Toeplitz)
    sim = v.similarity
    for k in range(1, 4):
        diag = np.diag(sim, k)
        np.testing.assert_allclose(diag, diag[0], atol=1e-6)


def test_learned_view_follows_the_weights():
    cfg = tiny_config(ANALYSIS, pos="learned")
    n = 12
    init = load_model(cfg).pos.weight[:n].detach().double().numpy()
    before = positional_view(cfg, n=n)
    # without weights: the run's seeded initialisation, deterministic and without touching the global RNG
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    again = positional_view(cfg, n=n)
    assert torch.equal(torch.rand(3), expected_draw)
    np.testing.assert_allclose(before.table, init, atol=1e-7)
    np.testing.assert_array_equal(before.table, again.table)
    # loading a state_dict changes the table to the stored vectors
    sd = load_model(cfg).state_dict()
    sd["pos.weight"] = torch.randn(sd["pos.weight"].shape, generator=torch.Generator().manual_seed(5))
    after = positional_view(cfg, state_dict=sd, n=n)
    np.testing.assert_allclose(after.table, sd["pos.weight"][:n].double().numpy(), atol=1e-7)
    assert np.abs(after.table - before.table).max() > 0.1
    assert not np.allclose(after.pca, before.pca)


def test_rope_view_is_a_relative_pattern():
    cfg = tiny_config(ANALYSIS, pos="rope", n_heads=4)
    v = positional_view(cfg, n=10)
    assert v.table is None and v.pca is None and v.explained is None and v.similarity is None
    assert isinstance(v.note, str) and "RoPE" in v.note
    assert v.relative.shape == (4, 10, 10)
    rel = v.relative[0]
    np.testing.assert_allclose(np.diag(rel), 1, atol=1e-6)  # same content, same position: cos 0
    np.testing.assert_allclose(rel, rel.T, atol=1e-6)
    for k in range(1, 5):  # depends on i - j only
        np.testing.assert_allclose(np.diag(rel, k), np.diag(rel, k)[0], atol=1e-6)
    assert rel[0, 1] < 1


def test_alibi_view_is_minus_slope_times_distance():
    cfg = tiny_config(ANALYSIS, pos="alibi", n_heads=4)
    v = positional_view(cfg, n=9)
    assert v.table is None and v.pca is None and v.similarity is None
    assert isinstance(v.note, str) and "ALiBi" in v.note
    assert v.relative.shape == (4, 9, 9)
    slopes = np.array([2**-2, 2**-4, 2**-6, 2**-8])  # docs/SCIENCE.md, n = 4
    dist = np.abs(np.arange(9)[:, None] - np.arange(9)[None, :])
    np.testing.assert_allclose(v.relative, -slopes[:, None, None] * dist, rtol=1e-6, atol=1e-7)


def test_nope_view_has_only_a_note():
    v = positional_view(tiny_config(ANALYSIS, pos="none"))
    assert (v.table, v.pca, v.explained, v.similarity, v.relative) == (None,) * 5
    assert isinstance(v.note, str) and len(v.note) > 20


# ---- probes and attention ----------------------------------------------------------------
def scored(batch) -> list[int]:
    return batch.tgt[batch.tgt != IGNORE_INDEX].tolist()


@pytest.mark.parametrize("arch", TRANSFORMERS)
def test_parse_probe_reverse_targets_are_the_reversed_prompt(arch):
    cfg = tiny_config(ANALYSIS, arch=arch)
    p = parse_probe(cfg, "3 1 2")
    assert scored(p.batch) == [2, 1, 3]
    if arch == "decoder":
        assert p.batch.src is None and p.src_labels == []
        assert p.batch.inp[0].tolist() == [3, 1, 2, 10, 2, 1]  # prompt SEP answer[:-1]
        assert p.dec_labels == ["3", "1", "2", "|", "2", "1"]
    else:
        assert p.batch.src[0].tolist() == [3, 1, 2]
        assert p.src_labels == ["3", "1", "2"]
        assert p.batch.inp[0].tolist() == [10, 2, 1] and p.dec_labels == ["|", "2", "1"]
    for text in ("312", "3,1,2", " 3, 1 ,2 "):
        q = parse_probe(cfg, text)
        assert torch.equal(q.batch.inp, p.batch.inp) and torch.equal(q.batch.tgt, p.batch.tgt)
        assert q.src_labels == p.src_labels and q.dec_labels == p.dec_labels


@pytest.mark.parametrize("text,why", [("3 x 2", "'x'"), ("", "empty"), ("  , ", "empty"),
                                      (" ".join("1" * 21), "n_ctx")])
def test_parse_probe_refuses_bad_text(text, why):
    with pytest.raises(ConfigError) as info:
        parse_probe(tiny_config(ANALYSIS), text)  # decoder, n_ctx 40: 21 symbols make 42 tokens
    assert info.value.field == "probe"
    assert why in str(info.value)


@pytest.mark.parametrize("task", ["reverse", "addition"])
def test_probe_symbols_are_exactly_what_a_typed_probe_accepts(task):
    """The Inspect tab's hint lists these symbols: each is accepted, anything else is refused."""
    cfg = tiny_config(ANALYSIS, task=task, max_len=3, n_ctx=64)
    symbols = probe_symbols(cfg)
    task_def = get_task(task)
    assert symbols == {task_def.label(cfg.task, t): t for t in range(task_def.n_symbols(cfg.task))}
    shown = allowed_symbols(cfg, shown=3)
    assert shown.startswith(", ".join(list(symbols)[:3])) and shown.endswith(" ...") == (len(symbols) > 3)
    for name in symbols if task == "reverse" else []:
        assert parse_probe(cfg, name).dec_labels[0] == name
    with pytest.raises(ConfigError, match="allowed: " + ", ".join(list(symbols)[:3])):
        parse_probe(cfg, "§")


def test_parse_probe_longest_accepted_input_fits_n_ctx():
    p = parse_probe(tiny_config(ANALYSIS), " ".join("1" * 20))  # 20 + 1 + 19 = 40 tokens
    assert p.batch.inp.shape == (1, N_CTX)
    with pytest.raises(ConfigError, match="n_ctx"):
        parse_probe(tiny_config(ANALYSIS, arch="encoder-decoder", n_ctx=16), " ".join("1" * 17))


def test_parse_probe_addition():
    cfg = tiny_config(ANALYSIS, task="addition", max_len=3, n_ctx=64)
    p = parse_probe(cfg, "12+34")
    assert scored(p.batch) == [6, 4, 0]  # 46, least significant digit first, final carry 0
    assert p.dec_labels[:5] == ["1", "2", "+", "3", "4"]
    assert scored(parse_probe(cfg, "99+99").batch) == [8, 9, 1]  # 198 with carries
    for bad in ("12+3", "1234", "1+2+3", "+12"):
        with pytest.raises(ConfigError) as info:
            parse_probe(cfg, bad)
        assert info.value.field == "probe"


def test_sampled_probe_is_deterministic_and_the_runs_probe():
    for cfg in (tiny_config(ANALYSIS), tiny_config(ANALYSIS, arch="encoder-decoder")):
        a, b = sampled_probe(cfg), sampled_probe(cfg)
        assert torch.equal(a.batch.inp, b.batch.inp) and torch.equal(a.batch.tgt, b.batch.tgt)
        assert a.dec_labels == b.dec_labels and a.src_labels == b.src_labels
        ref = probe(cfg.task, cfg.model.arch)
        assert torch.equal(a.batch.inp, ref.inp) and torch.equal(a.batch.tgt, ref.tgt)
        assert len(a.dec_labels) == a.batch.inp.shape[1]
        assert len(a.src_labels) == (0 if a.batch.src is None else a.batch.src.shape[1])


@pytest.mark.parametrize("arch,pos", [("decoder", "learned"), ("decoder", "alibi"), ("decoder", "rope"),
                                      ("encoder-decoder", "sinusoidal"), ("encoder-decoder", "alibi")])
def test_attention_patterns(arch, pos):
    cfg = tiny_config(ANALYSIS, arch=arch, pos=pos, n_heads=2, n_layers=2)
    p = parse_probe(cfg, "3 1 2 4")
    pats = attention(load_model(cfg), p.batch)
    kinds = {DEC_SELF} if arch == "decoder" else {ENC_SELF, DEC_SELF, CROSS}
    assert set(pats) == kinds
    t = p.batch.inp.shape[1]
    s = p.batch.src.shape[1] if p.batch.src is not None else t
    shapes = {DEC_SELF: (2, 2, t, t), ENC_SELF: (2, 2, s, s), CROSS: (2, 2, t, s)}
    for kind, a in pats.items():
        assert isinstance(a, np.ndarray) and a.dtype == np.float32
        assert a.shape == shapes[kind]
        assert np.all(a >= 0)
        np.testing.assert_allclose(a.sum(-1), 1, atol=1e-5)
    upper = np.triu(np.ones((t, t), dtype=bool), 1)
    assert np.all(pats[DEC_SELF][..., upper] == 0)  # causal: nothing above the diagonal
    if arch == "encoder-decoder":
        assert np.any(pats[ENC_SELF][..., np.triu(np.ones((s, s), dtype=bool), 1)] > 0)  # not masked


def test_load_model_is_seeded_and_loads_weights():
    cfg = tiny_config(ANALYSIS)
    a, b = load_model(cfg), load_model(cfg)
    assert not a.training
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), k
    sd = {k: torch.zeros_like(v) for k, v in a.state_dict().items()}
    c = load_model(cfg, sd)
    assert all(float(p.detach().abs().sum()) == 0 for p in c.parameters())
