"""The public Python API (lab/api/, docs/python-api.md): every example of the API page runs, in order, as
written (slow: it trains six short runs and launches the app once); the docstrings' examples run (doctest);
and the API's promises on one tiny trained run: configs built and refused as the command line builds and
refuses them, metrics and curves as DataFrames, the cache's names and shorthand, hooks that come off
however their block ends, figures as matplotlib figures."""
from __future__ import annotations

import doctest
import re
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure

import lab
import lab.api.cache
import lab.api.configs
from lab.cli.main import build_parser, config_from_args
from lab.records import EXACT_MATCH

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "python-api.md"
pytestmark = pytest.mark.usefixtures("one_thread")


def page_examples() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", PAGE.read_text(encoding="utf-8"), re.S | re.M)


@pytest.mark.app
def test_every_example_of_the_api_page_runs_in_order(tmp_path, monkeypatch):
    """The ```python blocks of docs/python-api.md, executed one after another in one namespace (as a reader
    runs them in a notebook), in an empty folder with its own run store."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the page's tempfile.mkdtemp() lands here
    blocks = page_examples()
    assert len(blocks) >= 8
    namespace: dict = {"__name__": "__docs__"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/python-api.md example {i + 1}", "exec"), namespace)
    assert isinstance(namespace["run"], lab.Run) and namespace["run"].state == "completed"
    assert len(lab.list_runs(namespace["runs_dir"])) == 5  # the run and the grid's four
    assert namespace["demo"].lab_context.store.root == Path(namespace["runs_dir"]).resolve()


def test_the_docstrings_examples_run():
    result = doctest.testmod(lab.api.configs, raise_on_error=False)
    assert result.attempted >= 5 and result.failed == 0


def test_the_page_has_no_example_the_test_would_miss():
    text = PAGE.read_text(encoding="utf-8")
    fences = re.findall(r"^```(\w*)$", text, re.M)
    langs = [f for f in fences if f]  # opening fences name their language; closing ones are bare
    assert set(langs) <= {"python", "bash"} and langs.count("python") == len(page_examples())


@pytest.mark.parametrize("keywords", [
    {"task": "induction"},
    {"task": "reverse", "max_len": 12, "pos": "rope", "norm": "post", "n_layers": 3},
    {"task": "copy", "arch": "encoder-decoder", "lr": 1e-3, "seed": 4},
])
def test_make_config_builds_what_the_command_line_builds(keywords):
    argv = ["train"]
    for k, v in keywords.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    assert lab.make_config(**keywords) == config_from_args(build_parser().parse_args(argv))


@pytest.mark.parametrize("keywords, field", [
    ({"n_layer": 2}, "n_layer"), ({"pos": "rotary"}, "model.pos"), ({"steps": 0}, "train.steps"),
    ({"d_model": 30, "n_heads": 4}, "model.d_model"), ({"lr": "fast"}, "train.lr"),
])
def test_make_config_refuses_a_bad_keyword_or_value_naming_it(keywords, field):
    with pytest.raises(lab.ConfigError) as err:
        lab.make_config(**keywords)
    assert err.value.field == field


def test_a_variant_keeps_the_base_and_a_grid_names_its_configs():
    base = lab.make_config(task="copy", n_layers=3, steps=50)
    variant = lab.make_config(base, norm="post")
    assert (variant.model.n_layers, variant.train.steps, variant.model.norm) == (3, 50, "post")
    grid = lab.make_grid(base, norm=["pre", "post"], lr=[0.001, 0.003])
    assert [c.name for c in grid] == ["norm=pre lr=0.001", "norm=pre lr=0.003", "norm=post lr=0.001",
                                      "norm=post lr=0.003"]
    with pytest.raises(ValueError):
        lab.make_grid(base, seed=3)
    assert "n_layers" in lab.config_keywords() and "allowed" in lab.config_keywords()["pos"]


def test_transformerlens_config_names_are_taken_or_refused_saying_what_sets_it_here():
    lens = lab.make_config(d_head=8, d_mlp=96, act_fn="relu", normalization_type="RMS",
                           positional_embedding_type="rotary", n_ctx=40)
    assert lens == lab.make_config(head_dim=8, d_ff=96, activation="relu", norm_type="rmsnorm", pos="rope", n_ctx=40)
    assert lab.make_config(attn_only=True).model.d_ff == 0 and lab.make_config(attn_only=False) == lab.make_config()
    for keywords, field, words in (({"d_vocab": 12}, "d_vocab", "n_symbols"),
                                   ({"act_fn": "gelu_new"}, "act_fn", "'relu', 'gelu'"),
                                   ({"positional_embedding_type": "shortformer"}, "positional_embedding_type", "'rotary'")):
        with pytest.raises(lab.ConfigError, match=words) as err:
            lab.make_config(**keywords)
        assert err.value.field == field


def test_training_gives_the_caller_its_thread_count_back(tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        run = lab.train(task="copy", steps=3, d_model=16, n_heads=2, n_layers=1, eval_every=3, threads=1,
                        runs_dir=tmp_path, progress=False)
        assert run.state == "completed" and torch.get_num_threads() == 3
        lab.train_many([lab.make_config(task="copy", steps=2, d_model=16, n_heads=2, n_layers=1, eval_every=2, threads=1)],
                       runs_dir=tmp_path, progress=False)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> lab.Run:
    """One tiny copy run (20 steps): enough to read, not to learn."""
    cfg = lab.make_config(task="copy", n_layers=2, n_heads=2, d_model=16, d_ff=32, steps=20, batch_size=16,
                          eval_every=10, eval_samples=32, snapshots=2, threads=1)
    return lab.train(cfg, runs_dir=tmp_path_factory.mktemp("api"), progress=False)


def test_a_trained_run_reads_as_dataframes(run):
    assert run.state == "completed" and run.summary["steps"] == 20
    m = run.metrics()
    assert isinstance(m, pd.DataFrame) and set(m["kind"]) == {"train", "eval"}
    evals = run.metrics("eval")
    assert list(evals["step"]) == [10, 20] and EXACT_MATCH in evals
    curve = run.curve("held-out loss")
    assert list(curve.columns) == ["step", "x", "value"] and list(curve["step"]) == [10, 20]
    assert curve["value"].iloc[-1] == pytest.approx(run.summary["eval"]["loss"])
    listed = lab.list_runs(run.store.root)
    assert list(listed["run_id"]) == [run.run_id]
    again = lab.load_run(run.run_id, run.store.root)
    assert again.config == run.config
    with pytest.raises(FileNotFoundError):
        lab.load_run("no-such-run", run.store.root)
    assert run.evaluate()["loss"] == pytest.approx(run.summary["eval"]["loss"], abs=1e-5)


def test_train_many_returns_the_runs_in_order_batched_or_not(tmp_path):
    base = lab.make_config(task="copy", n_layers=1, n_heads=2, d_model=16, d_ff=32, steps=8, batch_size=8,
                           eval_every=4, eval_samples=16, snapshots=0, threads=1)
    cfgs = lab.make_grid(base, pos=["learned", "sinusoidal"], seed=[0, 1])
    batched = lab.train_many(cfgs, runs_dir=tmp_path / "b", progress=False, batch_seeds=True)
    alone = lab.train_many(cfgs, runs_dir=tmp_path / "a", progress=False, batch_seeds=False)
    assert [r.name for r in batched] == [r.name for r in alone] == [c.name for c in cfgs]
    assert all(r.state == "completed" for r in batched + alone)
    for b, a in zip(batched, alone):  # the batched model trains each run as alone, to float32 round-off
        assert b.summary["eval"]["loss"] == pytest.approx(a.summary["eval"]["loss"], abs=1e-4)
    with pytest.raises(ValueError):
        lab.train_many([base, "not a config"], runs_dir=tmp_path / "c")


def test_the_answer_and_free_generation(run):
    answer = run.answer("1 2 3")
    assert list(answer.columns) == ["predicted", "expected", "right", "probability"]
    assert list(answer["expected"]) == ["1", "2", "3"]  # copy: the answer is the input
    assert list(answer["right"]) == [p == e for p, e in zip(answer["predicted"], answer["expected"])]
    assert ((answer["probability"] > 0) & (answer["probability"] <= 1)).all()
    written = run.generate("1 2 3", max_new_tokens=4)
    assert len(written.split()) == 4 and written == run.generate("1 2 3", max_new_tokens=4)  # greedy: the same
    assert run.generate("1 2 3", max_new_tokens=4, temperature=1.0, seed=3) == run.generate(
        "1 2 3", max_new_tokens=4, temperature=1.0, seed=3)


def test_the_cache_has_transformerlens_names_and_shorthand(run):
    logits, cache = run.run_with_cache("1 2 3")
    tokens = run.to_str_tokens("1 2 3")
    assert logits.shape[:2] == (1, len(tokens))
    assert isinstance(cache, lab.ActivationCache)
    assert torch.equal(cache["pattern", 1], cache["blocks.1.attn.hook_pattern"])
    assert torch.equal(cache["resid_post", -1], cache["blocks.1.hook_resid_post"])
    assert torch.equal(cache["resid_post", 0], cache["resid_pre", 1])  # one stream, block after block
    with pytest.raises(KeyError, match="out of range"):  # a layer the model lacks is refused, not wrapped round
        cache["resid_pre", 2]
    assert cache["pattern", 0].shape == (1, 2, len(tokens), len(tokens))
    np.testing.assert_allclose(cache["pattern", 0][0].numpy(), run.attention("1 2 3")[0], atol=1e-6)
    with pytest.raises(KeyError):
        cache["no_such_hook", 0]


def test_fwd_hooks_read_and_replace_activations_as_transformerlens_does(run):
    logits, clean = run.run_with_cache("1 2 3")
    assert set(clean) >= {f"blocks.{i}.{h}" for i in (0, 1) for h in ("hook_resid_pre", "attn.hook_z", "hook_attn_out",
                                                                      "hook_mlp_out", "hook_resid_post")}
    assert clean["z", 0].shape == (1, len(run.to_str_tokens("1 2 3")), 2, 8)  # (B, T, heads, d_head)
    for i in (0, 1):  # pre-LN: the stream leaving a block is what entered it plus its two sublayers' outputs
        torch.testing.assert_close(clean["resid_post", i],
                                   clean["resid_pre", i] + clean["attn_out", i] + clean["mlp_out", i])
    # patching the whole stream entering layer 0 from the clean run gives the clean logits on another input
    seen = []

    def patch(resid, hook):
        seen.append(hook)
        return clean[hook.name]
    patched = run.run_with_hooks("1 5 3", fwd_hooks=[("blocks.0.hook_resid_pre", patch)])
    torch.testing.assert_close(patched, logits)
    assert [(h.name, h.layer()) for h in seen] == [("blocks.0.hook_resid_pre", 0)]
    # zeroing head 1.0's z is the zero knockout of Run.hooks
    zeroed = run.run_with_hooks("1 2 3", [("blocks.1.attn.hook_z", lambda z, hook: z.index_fill(2, torch.tensor([0]), 0))])
    with run.hooks(heads="1.0"):
        torch.testing.assert_close(zeroed, run.run_with_cache("1 2 3")[0])
    with run.hooks(fwd_hooks=[("ln_final.hook_normalized", lambda x, hook: x * 0)]):  # hook functions in hooks()
        # hook_normalized comes before the norm's gain and bias (TransformerLens's side): what is left is the
        # bias, unembedded at every position (no bias in the unembedding)
        only_bias = run.model.dec_norm.bias @ run.model.W_U
        torch.testing.assert_close(run.run_with_cache("1 2 3")[0], only_bias.expand_as(logits))
    torch.testing.assert_close(run.run_with_hooks("1 2 3"), logits)  # and off again
    with pytest.raises(KeyError, match="not a hook point"):
        run.run_with_hooks("1 2 3", [("blocks.0.attn.hook_nothing", patch)])


def test_hooks_change_what_is_read_and_come_off_however_the_block_ends(run):
    intact = run.evaluate()
    with run.hooks(skip_block=[0, 1], positional="none") as model:
        assert model is run.model and run.active_hooks is not None
        changed = run.evaluate()
    assert changed["loss"] != intact["loss"]
    assert run.evaluate() == intact and run.active_hooks is None
    with pytest.raises(RuntimeError):
        with run.hooks(heads="1.0"):
            raise RuntimeError("a failing cell")
    assert run.evaluate() == intact
    with pytest.raises(ValueError):  # a head the model lacks is refused, naming it
        with run.hooks(heads=[(5, 0)]):
            pass
    with run.hooks(heads="0.0 0.1", mode="mean"):
        assert run.evaluate()["loss"] != intact["loss"]


def test_every_figure_is_a_matplotlib_figure(run):
    step = run.snapshot_steps()[0]
    figures = [lab.plot_curves(run), lab.plot_curves([run.run_id], ["train loss", "held-out loss"],
                                                     runs_dir=run.store.root),
               lab.plot_bands([run]), lab.plot_attention(run), lab.plot_attention(run, step=step),
               lab.plot_pca(run), lab.plot_importance(run), lab.plot_logit_lens(run, "1 2 3"),
               lab.plot_params([run, run.config])]
    with run.hooks(heads="1.0"):
        figures.append(lab.plot_attention(run))
    assert all(isinstance(f, Figure) for f in figures)
    assert list(lab.count_params(run.config, by_component=True)) == ["embeddings", "positional", "attention", "mlp",
                                                                      "norms", "head", "recurrent"]
    assert lab.count_params(run.config) == run.summary["params"] == sum(p.numel() for p in run.model.parameters())


def test_a_recurrent_run_is_refused_by_the_views_it_has_nothing_for(tmp_path):
    """An LSTM has no attention, positional encoding or residual stream: the attention, PCA and logit-lens views
    name its architecture instead of failing inside the model."""
    cfg = lab.make_config(task="copy", arch="lstm", n_layers=1, d_model=16, steps=2, batch_size=8, eval_every=2,
                          eval_samples=8, threads=1)
    r = lab.train(cfg, runs_dir=tmp_path / "runs", progress=False)
    for view in (r.attention, lambda: lab.plot_pca(r), lambda: lab.plot_logit_lens(r)):
        with pytest.raises(ValueError, match="model.arch: this run is lstm, a recurrent baseline"):
            view()
    assert not r.metrics().empty  # its own records still read
