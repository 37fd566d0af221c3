"""Recurrent runs (arch lstm / gru) through the lab: the config, the parameter breakdown, the command line,
the store, and what Inspect and Learn say of a model without attention (issue 23, item 1)."""
from __future__ import annotations

import json

import pytest

from lab.cli.main import main
from lab.config import ConfigError, ModelConfig, RunConfig, TaskConfig
from lab.derived import run_config
from lab.interventions import Interventions, LayerRef, applied, parse_heads
from lab.params import module_params, param_breakdown
from lab.trainer import build_model
from tests.helpers import tiny_config, trained_run
from lab.records import EXACT_MATCH

LSTM = tiny_config(arch="lstm", d_model=16, n_layers=2, steps=20, eval_every=10, task="reverse")


def test_an_lstm_and_a_transformer_of_about_the_same_size_have_closed_form_counts():
    """The app's default Transformer on reverse (d 64, 2 layers, d_ff 256, pre-LN, 32 learned positions,
    vocabulary 11) has 12 d^2 + 13 d a layer; the LSTM of width 80 has 4 (2 d^2 + 2 d) a layer: 103,552
    against 105,440 parameters, within 2%."""
    task = TaskConfig(name="reverse")
    tf = run_config(ModelConfig(), task)
    lstm = run_config(ModelConfig(arch="lstm", d_model=80), task)
    V, L = 11, 2
    d = 64
    assert sum(param_breakdown(tf).values()) == L * (12 * d * d + 13 * d) + 2 * d + 2 * V * d + 32 * d == 103_552
    d = 80
    assert sum(param_breakdown(lstm).values()) == L * 4 * (2 * d * d + 2 * d) + 2 * V * d == 105_440
    d = 120
    rnn = run_config(ModelConfig(arch="rnn", d_model=d), task)
    assert sum(param_breakdown(rnn).values()) == L * (2 * d * d + 2 * d) + 2 * V * d == 60_720  # Elman: one update
    for cfg in (tf, lstm, rnn, run_config(ModelConfig(arch="gru", d_model=96), task)):
        assert param_breakdown(cfg) == module_params(build_model(cfg))


def test_a_recurrent_config_ignores_the_attention_rules_and_refuses_what_needs_two_sequences():
    assert ModelConfig(arch="lstm", d_model=30, n_heads=4, pos="rope").d_model == 30  # heads do not apply
    with pytest.raises(ConfigError, match="task.name"):  # a language-model task needs one sequence
        run_config(ModelConfig(arch="encoder-decoder"), TaskConfig(name="induction", min_len=4, max_len=8))
    assert run_config(ModelConfig(arch="lstm"), TaskConfig(name="induction", min_len=4, max_len=8)).model.arch == "lstm"
    assert run_config(ModelConfig(arch="gru"), TaskConfig(name="text", min_len=8, max_len=16)).model.arch == "gru"


def test_the_command_line_trains_an_lstm_and_names_the_run_by_its_architecture(tmp_path, capsys):
    rc = main(["train", "--arch", "lstm", "--task", "reverse", "--d-model", "16", "--steps", "20",
               "--eval-every", "10", "--runs-dir", str(tmp_path), "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and out["status"] == "completed" and "-reverse-lstm-" in out["run_id"]
    assert out["params"] == sum(param_breakdown(RunConfig.from_dict(json.loads(
        (tmp_path / out["run_id"] / "config.json").read_text()))).values())
    assert 0 <= out["eval"][EXACT_MATCH] <= 1


@pytest.fixture(scope="module")
def lstm_run(tmp_path_factory):
    from lab.engine.store import RunStore
    from ui.common import AppContext

    store = RunStore(tmp_path_factory.mktemp("runs"))
    return AppContext(store, None), trained_run(store, LSTM)


def test_inspect_says_there_is_no_attention_and_still_answers(lstm_run):
    from ui.inspect.attention import attention_view, positional_panel, run_label
    from ui.inspect.interventions import panel_update
    from ui.inspect.intervention_views import MapCache

    ctx, run_id = lstm_run
    assert run_label(ctx, run_id).startswith("lstm L2 s0 reverse")
    *figures, caption, note, _, _ = attention_view(ctx, run_id, "sampled", "", 0, "run")
    assert all(f.visible is False for f in figures) and "no attention" in caption and note == ""
    pca, fig, words = positional_panel(ctx, run_id, "A")
    assert pca.visible is False and fig is None and "no positional encoding" in words
    out = panel_update(ctx, MapCache(), "run", "", run_id, "sampled", "")
    assert out["heads"].choices == [] and "no attention" in out["lens_note"]
    assert out["answer"].value["data"]  # the model's answer to the probe
    shown = out["shown"]
    skipped = panel_update(ctx, MapCache(), "apply", shown, run_id, "sampled", "", [], "zero", [], ["1"])
    assert skipped["applied_note"] == "Interventions applied: skip block 1."
    with pytest.raises(ConfigError, match="Head importance"):
        panel_update(ctx, MapCache(), "importance", shown, run_id, "sampled", "")


def test_interventions_on_a_recurrent_model_skip_layers_and_refuse_heads_by_name():
    import torch

    model = build_model(LSTM).eval()
    x = torch.randint(0, 11, (2, 6))
    with torch.no_grad():
        intact = model(x).logits
        with applied(model, Interventions(skip_block=(LayerRef("dec", 1),))):
            skipped = model(x).logits
            expected = model.head(model.layers[0](model.tok_emb(x))[0])
        after = model(x).logits
    torch.testing.assert_close(skipped, expected)
    torch.testing.assert_close(after, intact)  # the skip comes off with the block
    for spec, field in ((Interventions(heads=parse_heads("0.0")), "Heads"),
                        (Interventions(skip_ff=(LayerRef("dec", 0),)), "Skip feed-forward"),
                        (Interventions(positional="shuffle"), "Positional encoding"),
                        (Interventions(skip_block=(LayerRef("dec", 2),)), "Skip block")):
        with pytest.raises(ConfigError, match=field):
            with applied(model, spec):
                pass


def test_learn_refuses_a_recurrent_run_saying_why(lstm_run):
    from ui.learn import page_view

    ctx, run_id = lstm_run
    with pytest.raises(ConfigError, match="recurrent run"):
        page_view(ctx, "qkv", run_id, "")
