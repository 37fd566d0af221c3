"""Sharing: the whole configuration (seed included) round-trips through the page URL and a JSON file,
and a classroom link locks the controls it names (shown with the teacher's value, read-only).

Unit tests run every preset's configs (which set advanced fields: weight decay, schedule, betas, the
modulus...) through the URL query and the JSON reader; the slow tests do the same through the real
app: a link opened in Chromium fills the knobs and locks the named controls, and a config downloaded
from the app loads back into the same knobs.
"""
from __future__ import annotations

from dataclasses import replace
from urllib.parse import parse_qsl

import pytest

from lab.config import RunConfig
from lab.teach.presets.catalog import PRESETS
from ui.knobs import KNOBS, config_from_values, query_string, values_from_config, values_from_query
from ui.share import read_config_file

PRESET_RUNS = [(p.key, c) for p in PRESETS.values() for c in p.runs]


def experiment(cfg: RunConfig) -> dict:
    """What a share must keep: everything but the derived n_ctx, the run's name and where it trains."""
    d = cfg.to_dict()
    d["model"].pop("n_ctx")
    for local in ("device", "threads"):
        d["train"].pop(local)
    d.pop("name", None)
    return d


@pytest.mark.parametrize("key,cfg", PRESET_RUNS, ids=[f"{k}-{c.name}" for k, c in PRESET_RUNS])
def test_url_round_trips_every_preset_config(key, cfg):
    cfg = replace(cfg, train=replace(cfg.train, seed=7))
    query = dict(parse_qsl(query_string(cfg, hide=("pos", "weight_decay"))))
    assert query["seed"] == "7"  # the seed is always in the link
    values, hide, problems = values_from_query(query)
    assert problems == []
    assert hide == ["model.pos", "train.weight_decay"]
    assert experiment(config_from_values(values)) == experiment(cfg)


def test_url_leaves_out_defaults_but_keeps_the_seed():
    assert query_string(RunConfig()) == "seed=0"
    cfg = RunConfig.from_dict({"train": {"weight_decay": 1.0, "schedule": "constant"}})
    assert dict(parse_qsl(query_string(cfg))) == {"weight_decay": "1.0", "schedule": "constant", "seed": "0"}


def test_every_config_field_but_local_ones_is_a_knob():
    """A field that is not a knob would be silently dropped from links and JSON loads."""
    keys = {k.key for k in KNOBS}
    fields = {f"{sec}.{name}" for sec, part in RunConfig().to_dict().items() if isinstance(part, dict)
              for name in part}
    assert fields - keys == {"model.n_ctx", "train.device", "train.threads"}


def test_a_bad_link_value_is_reported_and_nothing_applied():
    values, hide, problems = values_from_query({"n_heads": "3", "d_model": "64", "hide": "pos,bogus"})
    assert values == {} and hide == ["model.pos"]
    assert any("model.d_model" in p for p in problems) and any("bogus" in p for p in problems)


def test_a_link_with_several_bad_values_names_each_and_applies_none():
    keys = {k.key: k.url_key for k in KNOBS}
    query = {keys["model.n_layers"]: "500", keys["model.d_model"]: "100000", keys["train.lr"]: "-1",
             keys["model.n_heads"]: "2", keys["task.name"]: "reverse"}
    values, _, problems = values_from_query(query)
    assert values == {}, values
    named = [p.split(":")[0] for p in problems]
    assert sorted(named) == ["URL option model.d_model", "URL option model.n_layers", "URL option train.lr"], problems
    assert any("500" in p for p in problems) and any("100000" in p for p in problems), problems


@pytest.mark.parametrize("key,cfg", PRESET_RUNS[::3], ids=[f"{k}-{c.name}" for k, c in PRESET_RUNS[::3]])
def test_json_file_round_trips(tmp_path, key, cfg):
    path = tmp_path / "config.json"
    path.write_text(cfg.to_json(), encoding="utf-8")
    assert experiment(read_config_file(str(path))) == experiment(cfg)
    assert values_from_config(read_config_file(str(path))) == values_from_config(cfg)


# ---- the real app ------------------------------------------------------------------------------------------
GROK = next(c for c in PRESETS["grokking"].runs)


@pytest.mark.app
def test_json_download_then_upload_through_the_app(client):
    from gradio_client import handle_file

    knobs = {k.url_key: v for k, v in ((k, values_from_config(GROK)[k.key]) for k in KNOBS)}
    knobs["seed"] = 11
    result = client.predict(**knobs, api_name="/download_config")
    path = result["value"] if isinstance(result, dict) else result
    saved = RunConfig.from_json(open(path, encoding="utf-8").read())
    assert experiment(saved) == experiment(replace(GROK, train=replace(GROK.train, seed=11)))
    loaded = client.predict(handle_file(path), api_name="/upload_config")
    got = {k.key: (u["value"] if isinstance(u, dict) else u) for k, u in zip(KNOBS, loaded)}
    assert got["train.seed"] == 11 and got["train.weight_decay"] == GROK.train.weight_decay
    assert got["task.name"] == "modular_addition" and got["model.norm"] == "none"
    assert got == {**values_from_config(GROK), "train.seed": 11}


@pytest.mark.browser
def test_classroom_link_fills_the_knobs_and_locks_controls_in_chromium(app_server):
    from tests.browser import chromium, open_page

    cfg = replace(GROK, train=replace(GROK.train, seed=5))
    url = f"{app_server.url}/?{query_string(cfg, hide=('pos', 'norm'))}"
    with chromium() as browser:
        page = open_page(browser, url)
        page.wait_for_function("() => document.querySelector('#seed input') && "
                               "document.querySelector('#seed input').value === '5'", polling=250)
        assert page.locator("#task input").input_value() == "modular_addition"
        page.locator("#advanced-train").get_by_text("Advanced training settings").click()  # a closed accordion
        assert page.locator("#weight_decay input").input_value() == "1"
        assert page.locator("#beta2 input").input_value() == str(GROK.train.beta2)
        assert page.locator("#schedule input:checked").get_attribute("value") == GROK.train.schedule
        # the locked controls stay on screen with the teacher's values, read-only, and say why
        assert page.locator("#pos").is_visible() and page.locator("#norm").is_visible()
        assert page.locator("#pos input").input_value() == cfg.model.pos and page.locator("#pos input").is_disabled()
        assert page.locator("#norm input:checked").get_attribute("value") == cfg.model.norm
        assert all(r.is_disabled() for r in page.locator("#norm input").all())
        assert "Set by your teacher" in page.locator("#pos").inner_text()
        assert page.locator("#n_heads input").first.is_enabled()  # only the named controls are locked
        summary = page.locator("#config-summary").inner_text()
        assert "modular_addition" in summary and "⚠️" not in summary
        # nor can the ablation grid vary a hidden control
        page.get_by_text("Ablation grid").click()
        page.locator("#grid-axis-1 input").click()
        listed = page.locator("#grid-axis-1").get_by_role("option")
        listed.first.wait_for()  # the list is open
        options = [o.strip() for o in listed.all_inner_texts()]
        assert "seed" in options and "heads" in options and "PE" not in options and "norm" not in options, options
        page.keyboard.press("Escape")
        # the link made on this page carries the same experiment
        page.get_by_text("Share this configuration").click()  # a closed accordion
        page.locator("#share-link-btn").click()
        page.wait_for_function("() => document.querySelector('#share-link textarea, #share-link input')?.value",
                               polling=250)
        link = page.locator("#share-link textarea, #share-link input").first.input_value()
        values, _, problems = values_from_query(dict(parse_qsl(link.split("?", 1)[1])))
        assert problems == [] and experiment(config_from_values(values)) == experiment(cfg)
