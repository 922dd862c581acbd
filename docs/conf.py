"""Sphinx configuration for the django-pgjobs documentation (MyST Markdown, Furo).

Built by ``scripts/dev docs`` as ``sphinx -W --keep-going -n``: every warning,
including a broken internal link or a missing cross-reference, fails the build.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

project = "django-pgjobs"
author = "django-pgjobs developers"
copyright = "django-pgjobs developers"  # noqa: A001 - Sphinx's name
# Read the version without importing the package (importing needs Django settings).
release = re.search(
    r'^__version__ = "([^"]+)"', (ROOT / "django_pgjobs" / "version.py").read_text(), re.M
).group(1)  # type: ignore[union-attr]
version = release

extensions = [
    "myst_parser",
    "sphinxcontrib.mermaid",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**/README.md"]

# MyST: anchors for headings down to ###, so [text](page.md#some-heading) is checked.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist", "attrs_inline"]
# ```mermaid fences become diagrams, drawn in the browser by the Mermaid copy vendored in
# _static/mermaid/ (from npm; see its README). No CDN: the built site renders its
# diagrams offline, also opened from file:// (a classic script, not an ES module import,
# which browsers refuse from file://). sphinxcontrib-mermaid only turns the fences into
# <pre class="mermaid"> nodes; its own loader (an ES module importing from a CDN or a
# local .mjs) is replaced by ours.
myst_fence_as_directive = ["mermaid"]
MERMAID_VERSION = "11.12.1"


def _no_mermaid_loader(*args: object, **kwargs: object) -> None:
    """Stands in for sphinxcontrib-mermaid's install_js (see above)."""


import sphinxcontrib.mermaid as _mermaid  # noqa: E402

_mermaid.install_js = _no_mermaid_loader
html_js_files = ["mermaid/mermaid.min.js", "mermaid-init.js"]

html_theme = "furo"
html_title = f"django-pgjobs {release}"
html_static_path = ["_static"]
html_theme_options = {
    "source_repository": "https://github.com/django-pgjobs/django-pgjobs/",
    "source_branch": "main",
    "source_directory": "docs/",
}

# Console blocks are shell sessions.
pygments_style = "friendly"
highlight_language = "python"
