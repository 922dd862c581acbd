"""The built documentation needs no network: no script from a CDN, and the Mermaid
diagrams render from the vendored copy, also when a page is opened from file://."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

CHROMIUM = os.environ.get("PGJOBS_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("sphinx")
    out = tmp_path_factory.mktemp("docs-html")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", "docs", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.process
def test_no_page_loads_a_remote_script(site: Path) -> None:
    remote = []
    for page in site.rglob("*.html"):
        text = page.read_text()
        remote += [
            f"{page.relative_to(site)}: {src}"
            for src in re.findall(r"<script[^>]*src=\"(https?:[^\"]+)\"", text)
        ]
        remote += [
            f"{page.relative_to(site)}: import from {url}"
            for url in re.findall(r"import [^;]*? from \"(https?:[^\"]+)\"", text)
        ]
    assert remote == []
    assert (site / "_static" / "mermaid" / "mermaid.min.js").stat().st_size > 1_000_000


@pytest.mark.browser
@pytest.mark.process
def test_diagrams_render_offline_from_file_urls(site: Path) -> None:
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        try:
            context = browser.new_context(offline=True)
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto((site / "reference" / "schema.html").as_uri())
            page.wait_for_selector(".mermaid svg", timeout=20_000)
            assert errors == []
        finally:
            browser.close()
