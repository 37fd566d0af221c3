"""The app under a ZeroGPU Space's environment, with the real `spaces` package and a local stand-in for its
device API (this machine has no ZeroGPU): the package imports and patches torch as on a Space, the page
offers Train on GPU, and when the device API has no GPU to give (HTTP 503, which the package turns into
"ZeroGPU client error: No GPU was available": spaces zero/client.py), the click's run trains on in the CPU
queue and the page says so in one sentence, in Chromium. What only a real Space shows (a real GPU in the forked process, real
quotas) is listed in docs/classroom.md, "Deploying to a Hugging Face Space"."""
from __future__ import annotations

import sys
from typing import Iterator

import pytest

from tests.browser import assert_no_errors, chromium, fill, open_page
from tests.helpers import REPO, AppServer, launch_app, poll_until_done

sys.path.insert(0, str(REPO / "scripts"))
from space_rehearsal import StubDeviceAPI, space_env  # noqa: E402

WAIT_MS = 150_000
SMALL = {"task": "copy", "max_len": 4, "d_model": 32, "n_heads": 2, "n_layers": 2, "steps": 60}


@pytest.fixture(scope="module")
def zerogpu(tmp_path_factory) -> Iterator[tuple[AppServer, StubDeviceAPI]]:
    """The app as a ZeroGPU Space starts it (scripts/space_rehearsal.py: the Space's variables, the stub
    device API, and the shim that lets `spaces` import beside this CPU build of torch)."""
    api = StubDeviceAPI()
    env = {k: v for k, v in space_env("zerogpu", api).items() if v is not None}
    env.update(LAB_PUBLIC="1", LAB_GPU_CHUNK_S="5")
    try:
        with launch_app(tmp_path_factory.mktemp("zerogpu"), env) as server:
            yield server, api
    finally:
        api.close()


@pytest.mark.app
def test_the_app_starts_as_on_a_zerogpu_space(zerogpu):
    server, api = zerogpu
    log = server.log_text()
    assert "zerogpu-space" in log and "CUDA no" in log, log[-2000:]  # torch's patched answer is not believed
    assert api.requests.get("POST /startup-report") == 1  # the real package reported our GPU function at launch


@pytest.mark.app
def test_a_spent_quota_trains_the_run_on_the_cpu_and_says_so(zerogpu):
    from gradio_client import Client

    server, api = zerogpu
    client = Client(server.url, verbose=False)
    job = client.submit(**SMALL, my_runs=[], owner="s" * 32, api_name="/start_gpu")  # a generator: each update
    job.result(timeout=WAIT_MS / 1000)
    (pick, runs, _, first), *_, (_, _, _, note) = job.outputs()
    run_id = pick["value"]
    assert runs == [run_id] and first.startswith("⚡ Waiting for a GPU") and api.requests.get("POST /schedule")  # the real package asked for a GPU
    assert note.startswith("🐢 No GPU now (ZeroGPU client error: No GPU was available"), note
    assert note.endswith("The run goes on in the CPU queue from step 0."), note
    text, _, _ = poll_until_done(client, run_id, timeout=WAIT_MS / 1000)
    assert "Completed" in text, text  # trained to the end in the CPU queue


@pytest.mark.browser
def test_the_page_offers_train_on_gpu_and_answers_beside_it(zerogpu):
    from playwright.sync_api import expect

    server, _ = zerogpu
    with chromium() as browser:
        page = open_page(browser, server.url, WAIT_MS)
        fill(page, "#steps", "60")
        page.evaluate(NOTE_HISTORY)  # every text the note shows from now on (for the message of a failure)
        page.locator("#gpu-btn").click()
        note = page.locator("#start-note")
        said = "No GPU now (ZeroGPU client error: No GPU was available"
        expect(note).to_contain_text(said, timeout=WAIT_MS)
        expect(page.locator("#progress")).to_contain_text("Completed", timeout=WAIT_MS)
        history = page.evaluate("() => window.__noteHistory")
        assert said in note.inner_text() and "The run goes on in the CPU queue" in note.inner_text(), history
        assert_no_errors(page)


NOTE_HISTORY = """() => { window.__noteHistory = []; const n = document.querySelector('#start-note');
  new MutationObserver(() => window.__noteHistory.push([Math.round(performance.now()), n.innerText.slice(0, 60)]))
    .observe(n, {subtree: true, childList: true, characterData: true}); }"""
