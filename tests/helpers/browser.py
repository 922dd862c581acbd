"""Where the browser tests find Chromium, how they start it, and where they save
the screenshots the how-tos show."""

from __future__ import annotations

import os

from tests.conftest import ROOT

CHROMIUM = os.environ.get("PGJOBS_CHROMIUM", "/usr/bin/chromium")

SCREENSHOTS = ROOT / "docs" / "_static" / "screenshots"

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
