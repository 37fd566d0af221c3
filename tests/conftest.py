"""Shared fixtures: the real app launched in a subprocess (`python app.py`) on a free port, and torch
held to one intra-op thread for a test module.

The plain helpers they are built on (launch_app, app_context, tiny_config...) are in tests/helpers.py and
the browser helpers in tests/browser.py; test modules import those, never one another.
"""
from __future__ import annotations

from typing import Iterator

import pytest

from tests.helpers import AppServer, launch_app


@pytest.fixture(scope="session")
def app_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """One launched app shared by the gradio_client tests."""
    with launch_app(tmp_path_factory.mktemp("app")) as server:
        yield server


@pytest.fixture(scope="session")
def client(app_server: AppServer):
    """A gradio_client.Client connected to the shared app."""
    from gradio_client import Client

    return Client(app_server.url, verbose=False)


@pytest.fixture(scope="module")
def browser_app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """A launched app of the requesting test module's own, with an empty store (its tests count the
    runs they create, or take screenshots that show only their runs)."""
    with launch_app(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])) as server:
        yield server


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Torch at one intra-op thread for the module that asks for it (`pytestmark =
    pytest.mark.usefixtures("one_thread")`), restored after its last test. Tiny models are per-op
    overhead bound: two intra-op threads on a busy 2-core machine run them ~4x slower than one
    (docs/SCIENCE.md, thread oversubscription)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
