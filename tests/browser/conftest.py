"""The browser tier's fixture: a page of a real headless Chromium."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from tests.helpers.browser import ARGS, CHROMIUM


@pytest.fixture
def page(transactional_db: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python package is not installed (pip install playwright)")
    # Playwright's sync API keeps an event loop in this thread; the ORM calls the
    # test makes between page actions are ordinary blocking calls.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1680, "height": 900})
        context.set_default_timeout(15_000)
        try:
            yield context.new_page()
        finally:
            context.close()
            browser.close()
            # ORM calls made while Playwright's loop ran may have opened their own
            # connection; close it so the test database can be flushed and dropped.
            connections.close_all()
