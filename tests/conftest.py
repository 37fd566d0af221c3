"""The test tiers, and the shared fixtures: the real app launched in a subprocess (`python app.py`) on a
free port, and torch held to one intra-op thread for a test module.

Every test belongs to one tier, by its marker (pytest.ini), so `pytest -m TIER` runs a tier:
    unit     no server, no browser, no subprocess app, no full-size training (the default: unmarked tests)
    app      the real app in a subprocess (gradio_client, HTTP), the command line, notebooks, installs
    browser  Chromium driving the real app
    science  full-size trainings that check the papers' results
A unit test that starts the app, a program or a worker process fails at once, naming the marker it needs.
Modules are ordered science, browser, app, unit, so that with `-n 2 --dist loadgroup` (pytest-xdist: one
worker runs a module's tests; each science test, a training of its own, goes to whichever worker is free)
the longest start first and the short ones fill the end.

The plain helpers they are built on (launch_app, app_context, tiny_config...) are in tests/helpers.py and
the browser helpers in tests/browser.py; test modules import those, never one another.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import AppServer, launch_app
from tests.trained_once import session_folder

TIERS = ("science", "browser", "app", "unit")  # the order modules run in: longest first
_running: dict[str, str] = {}  # "tier": the tier of the test being set up or run now


def tier_of(item: pytest.Item) -> str:
    """The item's one tier marker (unmarked: unit); two tier markers are an error."""
    marked = [t for t in TIERS if item.get_closest_marker(t) is not None]
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid}: one tier marker per test, not {marked}")
    return marked[0] if marked else "unit"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each unmarked test `unit`, and order the modules by tier (a stable sort keeps each module's
    tests together and in their written order). First among the plugins' hooks: pytest-xdist's reads the
    `xdist_group` marks set here into the test ids its scheduler groups by (run after it, they were set too
    late, and a module's tests, its app server and trainings with them, were set up on both workers)."""
    rank: dict[str, int] = {}
    for item in items:
        tier, module = tier_of(item), item.nodeid.split("::")[0]
        if tier == "unit" and item.get_closest_marker("unit") is None:
            item.add_marker(pytest.mark.unit)
        # one worker runs a module's tests in order (its module fixtures, an app server among them, start once);
        # a science test is a training of its own, so the two workers share a module of them, except the tests
        # that read one shared training (tests/trained_once.py), which run one after another on one worker:
        # the first trains it while the other worker goes on with other tests, instead of waiting for it
        shares = item.get_closest_marker("shares_training")
        group = f"training:{shares.args[0]}" if shares else item.nodeid if tier == "science" else module
        item.add_marker(pytest.mark.xdist_group(group))
        rank[module] = min(rank.get(module, len(TIERS)), TIERS.index(tier))
        item.user_properties.append(("tier", tier))  # in --junitxml's report (benchmarks/test_suite.py reads it)
    items.sort(key=lambda it: rank[it.nodeid.split("::")[0]])


def pytest_runtest_setup(item: pytest.Item) -> None:
    """While a unit test is set up (its module's fixtures too) and runs, starting a process fails with the
    marker to use instead (pytest_configure's guard)."""
    _running["tier"] = tier_of(item)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    _running.pop("tier", None)


def _unit_may_not_start(what: str) -> None:
    if _running.get("tier") == "unit":
        raise RuntimeError(f"a unit test started {what}: mark the test pytest.mark.app, or pytest.mark.browser if "
                           "it drives Chromium (tests/conftest.py, the tiers)")


def pytest_configure(config: pytest.Config) -> None:
    """A unit test runs in this one process: starting a program or a worker process in one fails, naming
    the marker to use. Each pytest-xdist worker shares the 2 cores with the other: torch at one intra-op
    thread in it."""
    import multiprocessing.process
    import os
    import subprocess

    execute_child, start = subprocess.Popen._execute_child, multiprocessing.process.BaseProcess.start

    def guarded_execute_child(self, args, *rest, **kwargs):  # type: ignore[no-untyped-def]
        _unit_may_not_start(f"a program ({args if isinstance(args, str) else ' '.join(map(str, args))[:80]})")
        return execute_child(self, args, *rest, **kwargs)

    def guarded_start(self):  # type: ignore[no-untyped-def]
        _unit_may_not_start("a worker process")
        return start(self)

    subprocess.Popen._execute_child = guarded_execute_child  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start = guarded_start  # type: ignore[method-assign]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def app_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """One launched app shared by the session's tests that need no store of their own: the gradio_client
    tests and the browser tests that read only what they did (one per pytest-xdist worker)."""
    with launch_app(tmp_path_factory.mktemp("app")) as server:
        yield server


@pytest.fixture(scope="session")
def client(app_server: AppServer):
    """A gradio_client.Client connected to the shared app."""
    from gradio_client import Client

    return Client(app_server.url, verbose=False)


@pytest.fixture(scope="session")
def trained_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's folder of shared trainings (tests/trained_once.py)."""
    return session_folder(tmp_path_factory)


@pytest.fixture(scope="module")
def browser_app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """A launched app of the requesting test module's own, with an empty store, for modules whose tests
    count the runs they create, take screenshots that show only their runs, or need an idle server
    (the others share `app_server`)."""
    with launch_app(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])) as server:
        yield server


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Torch at one intra-op thread for the module that asks for it (`pytestmark =
    pytest.mark.usefixtures("one_thread")`), restored after its last test. Tiny models are per-op
    overhead bound: two intra-op threads on a busy 2-core machine run them ~4x slower than one
    (benchmarks/RESULTS.md, thread oversubscription)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
