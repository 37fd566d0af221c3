"""The Learn tab in Debian's headless Chromium: every page shows its formula (KaTeX) and a freshly
drawn picture, first for the untrained default model (walking with the Next button), then for a
stored encoder-decoder run (picking pages from the list); saves docs/screenshots/learn.png.

The app runs in its own subprocess on a store holding one small run trained before launch.
"""
from __future__ import annotations

import pytest

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.teach.lesson_pages import PAGES
from tests.helpers import app_with_run
from tests.browser import SHOTS, assert_no_errors, choose, chromium, open_page, shoot

pytestmark = pytest.mark.browser  # Chromium driving the real app (tests/conftest.py, the tiers)
WAIT_MS = 60_000  # one picture on a busy 2-core host
RUN = RunConfig(model=ModelConfig(arch="encoder-decoder", n_layers=2, n_heads=2, d_model=32, d_ff=64, n_ctx=16),
                task=TaskConfig(name="reverse", max_len=6),
                train=TrainConfig(steps=80, batch_size=32, warmup=0, eval_every=80, eval_samples=32, snapshots=0),
                name="learn-demo")
# The picture has been replaced (its src differs from `prev`) and has loaded, or an error toast appeared.
NEW_PICTURE = """(prev) => {
  if (window.__labErrors.length) return true;
  const img = document.querySelector('#learn-figure img');
  return !!img && img.src !== prev && img.complete && img.naturalWidth > 100;
}"""


@pytest.fixture(scope="module")
def learn_app(tmp_path_factory):
    with app_with_run(tmp_path_factory.mktemp("learn"), RUN) as (server, run_id):
        yield server, run_id


@pytest.fixture(scope="module")
def page(learn_app):
    with chromium() as browser:
        pg = open_page(browser, learn_app[0].url, WAIT_MS, ready=None)
        pg.get_by_role("tab", name="Learn").wait_for()
        yield pg


def picture_src(page) -> str:
    img = page.locator("#learn-figure img")
    return img.get_attribute("src") if img.count() else ""


def assert_page_shown(page, title: str, prev_src: str, model: str) -> str:
    """Wait for `title`'s new picture; check its formula, picture and captions; return the picture's src."""
    page.wait_for_function(NEW_PICTURE, arg=prev_src, timeout=WAIT_MS, polling=200)
    errors = page.evaluate("window.__labErrors")
    assert not errors, f"{title}: error toasts {errors}"
    text = page.locator("#learn-text")
    assert text.locator("h3").inner_text().strip() == title
    assert text.locator(".katex-display").count() == 1, f"{title}: the formula did not render"
    assert text.locator(".katex-error").count() == 0, f"{title}: KaTeX could not parse the formula"
    box = page.locator("#learn-figure img").bounding_box()
    assert box and box["width"] > 200 and box["height"] > 100, f"{title}: picture box {box}"
    assert model in page.locator("#learn-source").inner_text(), title
    assert len(page.locator("#learn-caption").inner_text().strip()) > 20, f"{title}: no caption"
    return picture_src(page)


def test_every_learn_page_renders_in_chromium(page, learn_app):
    _, run_id = learn_app
    page.get_by_role("tab", name="Learn").click()

    # No run chosen: the untrained default model; walk the pages with the Next button.
    untrained = "a fresh, untrained model built from the default config"
    src = assert_page_shown(page, PAGES[0].title, "", untrained)
    for p in PAGES[1:]:
        page.locator("#learn-next").click()
        src = assert_page_shown(page, p.title, src, untrained)

    # A stored run: pick it, then choose pages from the list (in reverse, so each one is a change).
    choose(page, "#learn-run", f"learn-demo ({run_id[-6:]})")
    trained = f"learn-demo ({run_id[-6:]}), its final weights after 80 steps"
    src = assert_page_shown(page, PAGES[-1].title, src, trained)
    for p in reversed(PAGES[:-1]):
        page.locator("#learn-page").get_by_text(p.title, exact=True).click()
        src = assert_page_shown(page, p.title, src, trained)
        if p.key == "mask":
            shoot(page, SHOTS / "learn.png", top="#learn-run", settle_ms=500)

    # A typed probe redraws the page; a bad one gets a message naming the field, not a traceback.
    qkv = next(p for p in PAGES if p.key == "qkv")
    page.locator("#learn-page").get_by_text(qkv.title, exact=True).click()
    src = assert_page_shown(page, qkv.title, src, trained)
    probe = page.locator("#learn-probe textarea, #learn-probe input").first
    probe.fill("3 x 1")
    probe.press("Enter")
    page.wait_for_function("() => window.__labErrors.length > 0", timeout=WAIT_MS, polling=200)
    assert "probe" in page.evaluate("window.__labErrors")[0]
    page.evaluate("window.__labErrors = []")
    probe.fill("3 1 2")
    probe.press("Enter")
    src = assert_page_shown(page, qkv.title, src, trained)
    assert "3 tokens" in page.locator("#learn-caption").inner_text()  # 3 1 2 -> encoder 3 1 2, decoder | 2 1
    assert_no_errors(page)
    assert "Traceback" not in learn_app[0].log_text()
