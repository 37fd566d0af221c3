"""A run id with '..', '/', or an absolute path is refused everywhere a run id is accepted: the
store, the job manager, the CLI's `show`, and every endpoint of the launched app that takes a run
id (found from the app's API description, so an endpoint added later is covered too).

A decoy run folder sits *outside* the store (`<store>/../outside`, a copy of a real run): if any
path trick got through, that endpoint would answer with its data instead of refusing.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import lab.cli.main as cli
from lab.engine.jobs import JobManager
from lab.engine.store import RunIdError, RunStore
from tests.helpers import FakeTrainer, call_with, run_id_endpoints, tiny_config
from ui.knobs import KNOBS

CFG = tiny_config(steps=20, eval_every=10)

BAD_IDS = ["..", "../outside", "outside/..", "a/b", "/etc/passwd", "/", "./x", "..%2Foutside", "\\..\\outside",
           "x\x00y", ""]
PATH_TRICKS = [b for b in BAD_IDS if b]  # "" means "no run" to the UI (handled as such, not as a path)


@pytest.fixture()
def store(tmp_path: Path):
    s = RunStore(tmp_path / "runs")
    yield s
    s.close()


def make_decoy(store: RunStore, run_id: str) -> Path:
    """A copy of a real run just outside the store, reachable only by a path trick."""
    decoy = store.root.parent / "outside"
    shutil.copytree(store.path(run_id), decoy)
    return decoy


@pytest.mark.parametrize("bad", PATH_TRICKS + [None, 7, ["x"]])
def test_store_and_job_manager_refuse(store, bad):
    jm = JobManager(store, max_concurrent=1, train_fn=FakeTrainer(step_s=0))
    good = jm.submit(CFG)
    jm.wait(good, timeout=30)
    make_decoy(store, good)
    for call in (store.path, store.status, store.config, store.metrics, store.summary, store.load_weights,
                 store.snapshot_steps, store.delete, jm.stop, jm.delete, lambda r: store.delete(r, owner="x"),
                 lambda r: jm.stop(r, owner="x")):
        with pytest.raises(RunIdError, match=r"^run_id: .* is not a valid run id"):
            call(bad)
    assert store.exists(good) and (store.root.parent / "outside" / "config.json").is_file()
    jm.shutdown(wait=True)


@pytest.mark.parametrize("bad", PATH_TRICKS)
def test_cli_show_refuses(store, bad, capsys):
    store.create(CFG)
    store.root.joinpath("..", "outside").mkdir()
    code = cli.main(["show", bad, "--runs-dir", str(store.root)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("lab: error: run_id: ") and "is not a valid run id" in err and "\n" == err[-1]


# ---- every endpoint of the launched app that takes a run id ------------------------------------------
@pytest.mark.app
def test_every_run_id_endpoint_refuses_path_tricks(client, app_server):
    from gradio_client.exceptions import AppError

    from tests.helpers import SMALL, poll_until_done

    pick, *_ = client.predict(**SMALL, my_runs=[], owner="u" * 32, api_name="/start")
    real = pick["value"]
    poll_until_done(client, real)
    decoy = app_server.runs_dir.parent / "outside"
    if not decoy.exists():
        shutil.copytree(app_server.runs_dir / real, decoy)
    endpoints = run_id_endpoints(client)
    mine = {"/poll", "/show_run", "/stop", "/delete_ask", "/delete", "/snapshot_steps", "/attention_for_run",
            "/attention", "/positional_a", "/positional_b", "/compare", "/export"}
    assert mine <= set(endpoints), sorted(mine - set(endpoints))

    log_start, before = app_server.log_size(), app_server.run_folders()
    failures = []
    for api_name, params in sorted(endpoints.items()):
        for bad in ("../outside", "/etc/passwd", "a/b", "..", f"../{app_server.runs_dir.name}/{real}",
                    str(app_server.runs_dir / real)):
            try:
                out = call_with(client, api_name, params, bad)
            except AppError as exc:
                message = str(exc)
                if not message.startswith("run_id:") or "\n" in message:
                    failures.append(f"{api_name}({bad!r}) refused without naming run_id: {message!r}")
            else:
                failures.append(f"{api_name}({bad!r}) answered instead of refusing: {json.dumps(out)[:200]}")
    assert not failures, "\n".join(failures)
    assert app_server.run_folders() == before and (app_server.runs_dir / real).is_dir()
    assert json.loads((decoy / "status.json").read_text())["state"] == "completed"  # untouched
    assert "Traceback" not in app_server.log_text(log_start)

    # bad ids in the browser's stored "my runs" are dropped, not followed
    out = client.predict(["../outside", "/etc", real], "u" * 32, api_name="/load")
    runs_dropdown, my_runs, _owner, _note = out[len(KNOBS):len(KNOBS) + 4]  # after the knobs' updates
    assert my_runs == [real]
    text, *_ = client.predict(real, api_name="/poll")  # and the server still answers
    assert "Completed" in text


@pytest.mark.app
def test_gradio_serves_no_file_outside_what_the_app_returns(client, app_server):
    import urllib.error
    import urllib.parse
    import urllib.request

    from tests.helpers import REPO

    run_id = next(iter(app_server.run_folders() - {".."}), None) or client.predict(
        owner="u" * 32, my_runs=[], task="copy", steps=5, api_name="/start")[0]["value"]

    def status_of(path: str) -> int:
        url = f"{app_server.url}/gradio_api/file={path}"
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code

    outside = ["/etc/passwd", "/proc/self/environ", str(REPO / "app.py"), str(REPO / "lab" / "runs.py"),
               str(app_server.runs_dir / run_id / "config.json"), str(app_server.runs_dir / run_id / "status.json"),
               str(app_server.log_path), "../../../../etc/passwd", "app.py",
               urllib.parse.quote("/etc/passwd", safe=""), "%2e%2e/%2e%2e/%2e%2e/etc/passwd",
               "/tmp/../etc/passwd", str(Path.home() / ".bashrc")]
    served = {p: code for p in outside if (code := status_of(p)) == 200}
    assert served == {}, f"files served that the app never returned: {served}"

    # what the app does return (a downloaded config) is served: the check above can fail
    from tests.helpers import SMALL

    from gradio_client import Client

    raw = Client(app_server.url, verbose=False, download_files=False)  # the server's own path, not a local copy
    file_out = raw.predict(**SMALL, api_name="/download_config")
    value = file_out.get("value", file_out) if isinstance(file_out, dict) else file_out
    path = value["path"]
    assert path.endswith("transformer-lab-config.json") and path not in outside
    assert status_of(urllib.parse.quote(path)) == 200
