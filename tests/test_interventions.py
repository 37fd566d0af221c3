"""Interventions as hooks on the one model (lab/interventions.py), checked against hand computation:
head knockout, sublayer and block skips, positional removal and shuffling, and that the hooks come off
and never change the weights. Also the readers built on them (lab/views/probing.py)."""
from __future__ import annotations

import hashlib

import pytest
import torch

from lab.config import ConfigError, ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.interventions import HeadRef, Interventions, LayerRef, applied, head_means, parse_heads, parse_layers
from lab.tasks.batches import eval_batches, probe
from lab.views.analysis import load_model
from lab.views.probing import ablation_report, greedy_answer, importance_map, logit_lens, metrics
from tests.helpers import tiny_config
from lab.records import CROSS, DEC_SELF, ENC_SELF
INTERVENE = tiny_config(n_layers=2, n_heads=4, d_model=32, d_ff=64, pos="sinusoidal", n_ctx=40, max_len=6, steps=10)


def model_for(cfg: RunConfig, seed: int = 0):
    torch.manual_seed(seed)
    model = load_model(cfg)
    with torch.no_grad():  # non-zero biases, so "the bias alone" is a real check
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    return model


def weights_hash(model) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode() + v.numpy().tobytes())
    return h.hexdigest()


def batch(cfg):
    return eval_batches(cfg.task, cfg.model.arch, "eval", 8)[0]


@pytest.mark.parametrize("norm", ["pre", "post", "none"])
def test_every_head_knocked_out_leaves_the_attention_output_as_its_bias(norm):
    cfg = tiny_config(INTERVENE, norm=norm)
    model, b = model_for(cfg), batch(cfg)
    seen = []
    model.decoder[1].self_attn.register_forward_hook(lambda mod, args, out: seen.append(out[0]))
    every = tuple(HeadRef(DEC_SELF, 1, h) for h in range(cfg.model.n_heads))
    with applied(model, Interventions(heads=every)):
        model(b.inp)
    bias = model.decoder[1].self_attn.out_proj.bias
    assert torch.allclose(seen[0], bias.expand_as(seen[0]))
    model(b.inp)  # hooks off: the output depends on the input again
    assert not torch.allclose(seen[1], bias.expand_as(seen[1]))


@pytest.mark.parametrize("norm", ["pre", "post", "none"])
@pytest.mark.parametrize("how", ["blocks", "sublayers"])
def test_skipping_every_sublayer_gives_the_embedding_through_the_final_norm_and_head(norm, how):
    cfg = tiny_config(INTERVENE, norm=norm)
    model, b = model_for(cfg), batch(cfg)
    layers = tuple(LayerRef("dec", i) for i in range(cfg.model.n_layers))
    spec = Interventions(skip_block=layers) if how == "blocks" else Interventions(skip_attn=layers, skip_ff=layers)
    with torch.no_grad(), applied(model, spec):
        got = model(b.inp).logits
        by_hand = model.head(model.dec_norm(model.pos.embed(model.tok_emb(b.inp))))  # (B, T, vocab)
    assert torch.allclose(got, by_hand, atol=1e-6)


def test_one_head_knocked_out_by_hand_and_mean_ablation_puts_in_the_mean():
    cfg = tiny_config(INTERVENE)
    model, b = model_for(cfg), batch(cfg)
    attn, dh = model.decoder[0].self_attn, cfg.model.d_head
    heads_in = []
    attn.out_proj.register_forward_hook(lambda mod, args, out: heads_in.append(args[0].clone()))  # after knockouts
    with torch.no_grad():
        model(b.inp)
        y = heads_in[-1].clone()
        y[..., 2 * dh:3 * dh] = 0
        expected = attn.out_proj(y)
        seen = []
        attn.register_forward_hook(lambda mod, args, out: seen.append(out[0]))
        with applied(model, Interventions(heads=(HeadRef(DEC_SELF, 0, 2),))):
            model(b.inp)
        assert torch.allclose(seen[-1], expected, atol=1e-6)
        means = head_means(model, [b])
        assert torch.allclose(means[(DEC_SELF, 0)], heads_in[0].reshape(-1, cfg.model.d_model).mean(0), atol=1e-6)
        with applied(model, Interventions(heads=(HeadRef(DEC_SELF, 0, 2),), mode="mean"), means):
            model(b.inp)
        assert torch.allclose(heads_in[-1][..., 2 * dh:3 * dh], means[(DEC_SELF, 0)][2 * dh:3 * dh].expand(
            *heads_in[-1].shape[:2], dh))
        assert torch.equal(heads_in[-1][..., :2 * dh], heads_in[0][..., :2 * dh])  # the other heads untouched


def test_interventions_never_change_the_weights_and_come_off_after_an_error():
    cfg = tiny_config(INTERVENE, pos="rope")
    model, b = model_for(cfg), batch(cfg)
    before_hash, before = weights_hash(model), model(b.inp).logits
    spec = Interventions(heads=(HeadRef(DEC_SELF, 0, 1),), skip_ff=(LayerRef("dec", 1),), positional="none")
    report = ablation_report(model, cfg, spec, n=32)
    assert report["ablated"]["eval"] != report["intact"]["eval"]
    with pytest.raises(RuntimeError):
        with applied(model, spec):
            raise RuntimeError("boom")
    assert weights_hash(model) == before_hash
    assert torch.equal(model(b.inp).logits, before)
    assert not model.pos.__dict__.get("embed") and all(not m._forward_hooks and not m._forward_pre_hooks
                                                        for m in model.modules())


@pytest.mark.parametrize("pos", ["sinusoidal", "rope", "alibi"])
def test_removing_the_positional_encoding_equals_a_model_built_without_one(pos):
    cfg = tiny_config(INTERVENE, pos=pos)
    model, b = model_for(cfg), batch(cfg)
    bare = load_model(tiny_config(INTERVENE, pos="none"))
    bare.load_state_dict(model.state_dict())  # these encodings have no parameters
    with torch.no_grad(), applied(model, Interventions(positional="none")):
        assert torch.allclose(model(b.inp).logits, bare(b.inp).logits, atol=1e-6)


def test_shuffled_positions_by_hand():
    cfg = tiny_config(INTERVENE, pos="learned")
    model, b = model_for(cfg), batch(cfg)
    seen = []
    model.decoder[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    with torch.no_grad(), applied(model, Interventions(positional="shuffle", shuffle_seed=3)):
        model(b.inp)
    T = b.inp.shape[1]
    order = torch.randperm(T, generator=torch.Generator().manual_seed(3 + T))
    assert sorted(order.tolist()) == list(range(T)) and order.tolist() != list(range(T))
    assert torch.allclose(seen[0], model.tok_emb(b.inp) + model.pos.weight[order], atol=1e-6)


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_shuffle_moves_relative_encodings_with_the_position_ids(pos):
    """Attention scores of a relative encoding depend on the ids' offsets: with identical tokens, the
    shuffled pattern is the intact pattern read at the shuffled ids (causal mask on the real order)."""
    cfg = tiny_config(INTERVENE, pos=pos, n_layers=1)
    model = model_for(cfg)
    T = 9
    x = torch.zeros(1, T, dtype=torch.long)
    with torch.no_grad():
        intact = model(x, need_weights=True).attention[DEC_SELF][0, 0]  # (H, T, T)
        with applied(model, Interventions(positional="shuffle", shuffle_seed=5)):
            shuffled = model(x, need_weights=True).attention[DEC_SELF][0, 0]
    order = torch.randperm(T, generator=torch.Generator().manual_seed(5 + T))
    assert not torch.allclose(intact, shuffled)
    for i in range(T):  # same tokens everywhere: scores depend on (order[i] - order[j]) only, for j <= i
        raw = (shuffled[:, i, : i + 1] + 1e-30).log()
        raw = raw - raw[:, :1]
        q = int(order[i])
        for j in range(1, i + 1):
            k0, kj = int(order[0]), int(order[j])
            if q >= max(k0, kj):  # both keys in the intact model's causal past: compare logits there
                ref = (intact[:, q, kj] + 1e-30).log() - (intact[:, q, k0] + 1e-30).log()
                assert torch.allclose(raw[:, j], ref, atol=1e-4)


def test_bad_heads_and_layers_name_the_field():
    cfg = tiny_config(INTERVENE)
    model = model_for(cfg)
    with pytest.raises(ConfigError, match="Heads"):
        parse_heads("1-0")
    with pytest.raises(ConfigError, match="Heads.*not a head of this model"):
        with applied(model, Interventions(heads=parse_heads("2.0"))):
            pass
    with pytest.raises(ConfigError, match="Heads"):
        Interventions(heads=parse_heads("cross.0.0")).check(model)  # decoder-only: no cross-attention
    with pytest.raises(ConfigError, match="Skip block"):
        Interventions(skip_block=parse_layers("5", "Skip block")).check(model)
    assert parse_heads("1.0, 0.3 1.0") == (HeadRef(DEC_SELF, 0, 3), HeadRef(DEC_SELF, 1, 0))


def test_cross_attention_heads_of_an_encoder_decoder():
    cfg = tiny_config(INTERVENE, arch="encoder-decoder")
    model, b = model_for(cfg), batch(cfg)
    seen = []
    model.decoder[0].cross_attn.register_forward_hook(lambda mod, args, out: seen.append(out[0]))
    every = parse_heads(" ".join(f"cross.0.{h}" for h in range(cfg.model.n_heads)))
    with torch.no_grad(), applied(model, Interventions(heads=every)):
        model(b.inp, b.src)
    assert torch.allclose(seen[0], model.decoder[0].cross_attn.out_proj.bias.expand_as(seen[0]))


def test_greedy_answer_feeds_its_own_tokens_back_and_the_lens_ends_at_the_output():
    cfg = tiny_config(INTERVENE)
    model = model_for(cfg, seed=4)
    b = probe(cfg.task, cfg.model.arch)
    ans = greedy_answer(model, cfg, b)
    P = cfg.task.max_len
    ctx = b.inp[:, : P + 1]
    with torch.no_grad():
        for tok in ans.tokens:  # by hand: argmax, appended, again
            probs = model(ctx).logits[0, -1].softmax(-1)
            assert tok.predicted == str(int(probs.argmax())) and tok.probability == pytest.approx(float(probs.max()))
            ctx = torch.cat([ctx, probs.argmax().view(1, 1)], 1)
    assert [t.expected for t in ans.tokens] == [str(int(t)) for t in b.tgt[0, P:]]
    assert ans.exact == all(t.predicted == t.expected for t in ans.tokens)
    lens = logit_lens(model, cfg, b)
    with torch.no_grad():
        final = model(b.inp).logits[0].softmax(-1)
    assert lens.rows[0] == "embedding" and len(lens.rows) == cfg.model.n_layers + 1
    assert torch.allclose(torch.from_numpy(lens.top_prob[-1]), final.max(-1).values, atol=1e-6)


def test_importance_map_cells_are_single_head_knockouts():
    cfg = tiny_config(INTERVENE)
    model = model_for(cfg, seed=2)
    imp = importance_map(model, cfg, n=32)
    assert imp.loss.shape == (cfg.model.n_layers, cfg.model.n_heads)
    batches = eval_batches(cfg.task, cfg.model.arch, "eval", 32)
    with applied(model, Interventions(heads=(HeadRef(DEC_SELF, 1, 3),))):
        assert imp.loss[1, 3] == pytest.approx(metrics(model, batches)["loss"])
    top, rise = imp.ranked()[0]
    assert rise == pytest.approx(float((imp.loss - imp.intact_loss).max()))
    assert f"layer {top.layer} head {top.head}" in imp.sentence()


def test_a_typed_text_prompt_keeps_its_spaces_and_scores_each_next_character():
    from lab.views.analysis import parse_probe

    cfg = RunConfig(model=ModelConfig(n_ctx=64), task=TaskConfig(name="text", min_len=8, max_len=32))
    p = parse_probe(cfg, "the cat")
    assert "".join(p.dec_labels) == "the␣cat"
    assert p.batch.tgt[0, :-1].tolist() == p.batch.inp[0, 1:].tolist() and int(p.batch.tgt[0, -1]) == -100
    with pytest.raises(ConfigError, match="probe.*'~' is not a character"):
        parse_probe(cfg, "the ~cat")


def test_snapshots_keep_the_weights_of_small_models_only(tmp_path, monkeypatch):
    import lab.trainer as trainer
    from lab.engine.recorder import record_run
    from lab.engine.store import RunStore
    from lab.engine.storefs import RunNotFoundError

    store = RunStore(tmp_path / "runs")
    cfg = RunConfig(model=ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32),
                    task=TaskConfig(name="copy", max_len=4), train=TrainConfig(steps=30, eval_every=10, snapshots=3))
    small = store.create(cfg)
    record_run(store, small, threads=1)
    steps = store.snapshot_steps(small)
    assert steps[0] == 0 and steps[-1] == 30 and len(steps) >= 3
    mid = steps[1]
    assert set(store.load_snapshot(small, mid)) == {DEC_SELF}  # the patterns alone
    final, at = store.weights_at(small)
    kept = store.load_snapshot_weights(small, 30)
    assert at == 30 and kept.keys() == final.keys()
    assert all(torch.equal(kept[k], final[k].half().float()) for k in final)  # float16 copies
    assert all(torch.equal(store.weights_at(small, 0)[0][k], v.half().float())
               for k, v in load_model(cfg).state_dict().items())  # step 0: the seeded initialisation
    monkeypatch.setattr(trainer, "SNAPSHOT_WEIGHTS_MAX", 10)
    large = store.create(cfg)
    record_run(store, large, threads=1)
    assert store.load_snapshot_weights(large, mid) is None and set(store.load_snapshot(large, mid)) == {DEC_SELF}
    with pytest.raises(RunNotFoundError, match=f"step: the snapshot at step {mid} kept no weights"):
        store.weights_at(large, mid)
    store.close()


def test_mean_ablation_report_uses_the_means_over_its_held_out_batches():
    cfg = tiny_config(INTERVENE)
    model = model_for(cfg, seed=3)
    spec = Interventions(heads=(HeadRef(DEC_SELF, 1, 2),), mode="mean")
    report = ablation_report(model, cfg, spec, n=32)
    batches = eval_batches(cfg.task, cfg.model.arch, "eval", 32)
    with applied(model, spec, head_means(model, batches)):
        assert report["ablated"]["eval"]["loss"] == pytest.approx(metrics(model, batches)["loss"])
    with applied(model, Interventions(heads=spec.heads)):  # zero ablation differs: the means went in
        assert report["ablated"]["eval"]["loss"] != pytest.approx(metrics(model, batches)["loss"])


def test_silenced_heads_are_those_whose_output_the_spec_removes():
    spec = Interventions(heads=(HeadRef(DEC_SELF, 1, 0), HeadRef(CROSS, 0, 1)), skip_block=(LayerRef("dec", 0),),
                         skip_attn=(LayerRef("enc", 1),))
    assert spec.silenced(DEC_SELF, 2) == {(1, 0), (0, 0), (0, 1)}  # the knocked-out head and block 0's heads
    assert spec.silenced(CROSS, 2) == {(0, 1), (0, 0)}  # a skipped block takes its cross-attention too
    assert spec.silenced(ENC_SELF, 2) == {(1, 0), (1, 1)}  # a skipped attention sublayer: all its heads
    assert Interventions(skip_attn=(LayerRef("dec", 0),)).silenced(CROSS, 2) == set()  # not the cross-attention
    assert Interventions(skip_ff=(LayerRef("dec", 0),), positional="none").silenced(DEC_SELF, 2) == set()
