"""Invalid inputs through every endpoint of the launched app (gradio_client) and through the CLI:
each gets a one-line message naming the field, no run folder is created, and the server keeps
answering. The 20 invalid knob combinations of tests/test_app.py (already sent to /validate and
/start by test_app_client.py) are not repeated here; these cover the other endpoints, the uploaded
config file, the Inspect inputs, run ids that name no run, and the CLI's flags.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import lab.cli.main as cli

U = "u" * 32  # an owner token
MISSING = "20990101-000000-copy-rope-pre-000000"  # a well-formed id of no run


# ---- the app (one shared server: tests/conftest.py) --------------------------------------------
# (api name, keyword arguments, fields the message may name). Knob endpoints take every knob by name.
KNOB_CASES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("/start", {"owner": "o" * 300}, ("owner",)),
    ("/start", {"steps": 10**7}, ("train.steps",)),
    ("/start", {"lr": "nan"}, ("train.lr",)),
    ("/start", {"d_ff": 10**9}, ("model.d_ff",)),
    ("/start", {"batch_size": "big"}, ("train.batch_size",)),
    ("/start", {"seed": 2**40}, ("train.seed",)),
    ("/start", {"min_len": 1.5}, ("task.min_len",)),
    ("/start", {"n_symbols": "inf"}, ("task.n_symbols",)),
    ("/start", {"activation": "tanh"}, ("model.activation",)),
    ("/start", {"task": ["copy"]}, ("task.name",)),
    ("/share_query", {"hide": ["pos", "nonexistent"]}, ("hide",)),
    ("/share_query", {"n_layers": 99}, ("model.n_layers",)),
    ("/download_config", {"steps": -3}, ("train.steps",)),
    ("/download_config", {"pos": "rope", "d_model": 48, "n_heads": 48}, ("model.pos", "model.d_model")),
]
UPLOADS: list[tuple[str, bytes, tuple[str, ...]]] = [
    ("too-big.json", b"{" + b" " * 100_000 + b"}", ("config file",)),
    ("latin1.json", '{"name": "caf\xe9"}'.encode("latin-1"), ("config file",)),
    ("broken.json", b'{"model": {"d_model": 64', ("config",)),
    ("unknown-key.json", b'{"model": {"d_modle": 64}}', ("model.d_modle",)),
    ("wrong-type.json", b'{"model": {"d_model": "64"}}', ("model.d_model",)),
    ("nested.json", b"[" * 50_000, ("config file", "config")),
    ("array.json", b"[1, 2, 3]", ("config",)),
    ("version.json", b'{"schema_version": 99}', ("schema_version",)),
    ("bad-combo.json", b'{"model": {"d_model": 30, "n_heads": 4}}', ("model.d_model",)),
    ("empty.json", b"", ("config",)),
    ("picture.png", b"\x89PNG\r\n\x1a\n" + bytes(64), ("config file",)),  # gradio's own check named no field
    ("notes.txt", b"d_model = 64", ("config file",)),
]
INSPECT_CASES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("/attention", {"source": "bogus"}, ("source",)),
    ("/attention", {"step": -5}, ("step",)),
    ("/attention", {"step": "abc"}, ("step",)),
    ("/attention", {"source": "typed", "text": "1 " * 3000}, ("probe",)),
    ("/attention", {"source": "typed", "text": "z z"}, ("probe",)),
    ("/attention_for_run", {"step": "1e999"}, ("step",)),
]
MISSING_RUN_CASES: list[tuple[str, list[Any]]] = [
    ("/stop", [MISSING, U]), ("/delete", [MISSING, [], U]), ("/snapshot_steps", [MISSING]),
    ("/positional_a", [MISSING]), ("/positional_b", [MISSING]), ("/stop", [None, U]), ("/delete_ask", [None]),
    ("/delete", [None, [], U]),
]


@pytest.fixture(scope="module")
def done_run(client) -> str:
    from tests.helpers import SMALL, poll_until_done

    pick, *_ = client.predict(**SMALL, my_runs=[], owner=U, api_name="/start")
    poll_until_done(client, pick["value"])
    return pick["value"]


def knob_kwargs(api_name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    from tests.helpers import SMALL

    extra = {"/start": {"my_runs": [], "owner": U}, "/share_query": {"hide": []}}.get(api_name, {})
    return {**SMALL, **extra, **overrides}


def refused(client, server, api_name: str, fields: tuple[str, ...], *args: Any, **kwargs: Any) -> str:
    """Call an endpoint that must refuse: one line naming a field, no folder, no traceback."""
    from gradio_client.exceptions import AppError

    before, log_start = server.run_folders(), server.log_size()
    with pytest.raises(AppError) as err:
        client.predict(*args, api_name=api_name, **kwargs)
    message = str(err.value)
    assert "\n" not in message and len(message) < 400, message
    # a config field by its label, as the knob beside it reads ("d_model", not "model.d_model")
    from tests.helpers import LABELS

    names = [LABELS.get(f, f) for f in fields]  # API-only parameters (owner, hide) by their name
    assert any(message.startswith(n) or f"{n}:" in message for n in names), message
    assert not any(f in message for f in fields if f in LABELS), message
    assert server.run_folders() == before, f"{api_name} created a run folder"
    assert "Traceback" not in server.log_text(log_start)
    return message


@pytest.mark.app  # a launched server
@pytest.mark.parametrize(("api_name", "overrides", "fields"), KNOB_CASES,
                         ids=[f"{a}-{'-'.join(map(str, o))}" for a, o, _ in KNOB_CASES])
def test_knob_endpoints(client, app_server, api_name, overrides, fields):
    if api_name == "/start" and "owner" not in overrides:  # a refused config is answered in Start's note
        from tests.helpers import LABELS

        before, log_start = app_server.run_folders(), app_server.log_size()
        *_, note = client.predict(**knob_kwargs(api_name, overrides), api_name="/start")
        assert note.startswith("⚠️") and "\n" not in note and len(note) < 400, note
        assert any(f"**{LABELS[f]}**" in note for f in fields), note
        assert app_server.run_folders() == before and "Traceback" not in app_server.log_text(log_start)
        return
    refused(client, app_server, api_name, fields, **knob_kwargs(api_name, overrides))


@pytest.mark.app  # a launched server
@pytest.mark.parametrize(("name", "data", "fields"), UPLOADS, ids=[u[0] for u in UPLOADS])
def test_uploaded_config_files(client, app_server, tmp_path, name, data, fields):
    """A refused config file is answered in the note under the button (ui/share.py), the field by its label."""
    from gradio_client import handle_file

    from tests.helpers import LABELS

    path = tmp_path / name
    path.write_bytes(data)
    before, log_start = app_server.run_folders(), app_server.log_size()
    *_, note = client.predict(handle_file(str(path)), api_name="/upload_config")
    assert note.startswith("⚠️") and note.endswith("Nothing was loaded: the controls keep their values."), note
    assert "\n" not in note and len(note) < 400, note
    assert any(f"**{LABELS.get(f, f)}** in '{name}'" in note for f in fields), note
    assert not any(f in note for f in fields if f in LABELS), note
    assert app_server.run_folders() == before and "Traceback" not in app_server.log_text(log_start)


@pytest.mark.app  # a launched server
@pytest.mark.parametrize(("api_name", "overrides", "fields"), INSPECT_CASES,
                         ids=[f"{a}-{'-'.join(map(str, o))}" for a, o, _ in INSPECT_CASES])
def test_inspect_inputs(client, app_server, done_run, api_name, overrides, fields):
    args = {"run_id": done_run, "source": "sampled", "text": "", "step": 0, **overrides}
    refused(client, app_server, api_name, fields, **args)


@pytest.mark.app  # a launched server
@pytest.mark.parametrize(("api_name", "args"), MISSING_RUN_CASES, ids=[f"{a}-{v[0]}" for a, v in MISSING_RUN_CASES])
def test_run_ids_that_name_no_run(client, app_server, api_name, args):
    message = refused(client, app_server, api_name, ("run_id",), *args)
    assert "does not exist" in message or "no run is shown" in message, message


@pytest.mark.app  # a launched server
def test_poll_of_a_missing_run_says_so_and_stops_polling(client):
    text, loss, acc, _attention, timer = client.predict(MISSING, api_name="/poll")
    assert MISSING in text and "does not exist" in text and timer["active"] is False


@pytest.mark.app  # a launched server
def test_deleting_a_live_run_is_refused(client, app_server):
    from tests.helpers import SMALL

    pick, *_ = client.predict(**{**SMALL, "steps": 100_000}, my_runs=[], owner=U, api_name="/start")
    run_id = pick["value"]
    try:
        message = refused(client, app_server, "/delete", ("run_id",), run_id, [run_id], U)
        assert "stop it before deleting" in message and (app_server.runs_dir / run_id).is_dir()
    finally:
        client.predict(run_id, U, api_name="/stop")


@pytest.mark.app  # a launched server
def test_a_valid_upload_still_loads_and_the_server_answers(client, tmp_path):
    from gradio_client import handle_file

    from lab.config import RunConfig

    path = tmp_path / "ok.json"
    path.write_text(RunConfig().to_json())
    assert len(client.predict(handle_file(str(path)), api_name="/upload_config")) > 10
    assert "parameters" in client.predict(**knob_kwargs("/validate", {}), api_name="/validate")


# ---- the CLI -----------------------------------------------------------------------------------------
def cli_cases(tmp: Path) -> list[tuple[list[str], tuple[str, ...]]]:
    (tmp / "dir.json").mkdir()
    (tmp / "latin1.json").write_bytes('{"name": "caf\xe9"}'.encode("latin-1"))
    (tmp / "broken.json").write_text('{"train": {"steps": ')
    (tmp / "huge.json").write_bytes(b" " * (cli.MAX_CONFIG_BYTES + 10))
    (tmp / "nested.json").write_text("[" * 100_000)
    (tmp / "a-file").write_text("not a folder")
    return [
        (["train", "--steps", "abc"], ("train.steps",)),
        (["train", "--pos", "foo"], ("model.pos",)),
        (["train", "--lr", "nan"], ("train.lr",)),
        (["train", "--lr", "inf"], ("train.lr",)),
        (["train", "--batch-size", "0"], ("train.batch_size",)),
        (["train", "--d-model", "100", "--n-heads", "8"], ("model.d_model",)),
        (["train", "--threads", "-1"], ("train.threads",)),
        (["train", "--task", "sorting"], ("task.name",)),
        (["train", "--name", "n" * 300], ("name",)),
        (["train", "--config", str(tmp / "missing.json")], ("--config",)),
        (["train", "--config", str(tmp / "dir.json")], ("--config",)),
        (["train", "--config", str(tmp / "latin1.json")], ("--config",)),
        (["train", "--config", str(tmp / "broken.json")], ("config",)),
        (["train", "--config", str(tmp / "huge.json")], ("--config",)),
        (["train", "--config", str(tmp / "nested.json")], ("--config",)),
        (["train", "--runs-dir", str(tmp / "a-file")], ("--runs-dir",)),
        (["train", "--runs-dir", ""], ("--runs-dir",)),
        (["list", "--runs-dir", str(tmp / "a-file")], ("--runs-dir",)),
        (["show", MISSING], ("run_id",)),
        (["train", "--bogus-flag", "1"], ("--bogus-flag",)),
    ]


CLI_IDS = ["steps-abc", "pos-foo", "lr-nan", "lr-inf", "batch-0", "d_model-heads", "threads-neg", "task", "name-long",
           "config-missing", "config-dir", "config-latin1", "config-broken", "config-huge", "config-nested",
           "runs-dir-file", "runs-dir-empty", "list-runs-dir-file", "show-missing", "unknown-flag"]


@pytest.mark.parametrize("index", range(len(CLI_IDS)), ids=CLI_IDS)
def test_cli_flags(tmp_path, monkeypatch, capsys, index):
    runs = tmp_path / "runs"
    monkeypatch.setenv("LAB_RUNS_DIR", str(runs))
    argv, fields = cli_cases(tmp_path)[index]
    argv = argv + ["--device", "cpu", "--steps", "5"] if argv[0] == "train" and "--steps" not in argv else argv
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("lab: error: ") and err.count("\n") == 1, err
    assert any(f in err for f in fields), err
    assert not runs.exists() or not any(runs.iterdir()), "a refused command created a run folder"


@pytest.mark.app
def test_cli_json_config_error_in_a_real_process(tmp_path):
    """The same refusal from `python -m lab` itself: status 2, one line, nothing stored."""
    import subprocess
    import sys

    from tests.helpers import REPO

    (tmp_path / "bad.json").write_text(json.dumps({"model": {"n_heads": 0}}))
    proc = subprocess.run([sys.executable, "-m", "lab", "train", "--config", str(tmp_path / "bad.json"),
                           "--runs-dir", str(tmp_path / "runs")], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("lab: error: model.n_heads:") and proc.stderr.count("\n") == 1
    assert not (tmp_path / "runs").exists()
