"""What pip users get: honest install instructions, a license file, one version, the
runtime dependencies and classifiers the project promises. (CI also builds the wheel,
runs twine check and the demo from it: scripts/check-package.)"""

from __future__ import annotations

import re
import tomllib

from tests.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_no_page_tells_users_to_pip_install_from_the_index() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    offenders = [
        f"{p.relative_to(ROOT)}: {m[0]}"
        for p in pages
        if "_build" not in p.parts
        for m in re.finditer(
            r"pip install ['\"]?django-pgjobs(\[[^\]]*\])?(?!\s*@)['\"]?(?=\s|$)", p.read_text()
        )
    ]
    offenders = [o for o in offenders if "changelog" not in o]
    assert offenders == [], "django-pgjobs is not on PyPI: say how to install it instead"
    readme = (ROOT / "README.md").read_text()
    assert "not on PyPI yet" in readme and "python -m build" in readme


def test_license_file_matches_the_metadata() -> None:
    assert PYPROJECT["license"] == "MIT"
    assert PYPROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_version_has_one_source() -> None:
    import django_pgjobs

    assert PYPROJECT["dynamic"] == ["version"]
    assert "version" not in PYPROJECT
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+|rc\d+)?", django_pgjobs.__version__)


def test_runtime_needs_only_django_psycopg_and_cronsim() -> None:
    names = sorted(re.match(r"[\w-]+", d)[0].lower() for d in PYPROJECT["dependencies"])
    assert names == ["cronsim", "django", "psycopg"]
    assert all("[binary]" not in d for d in PYPROJECT["dependencies"])
    extras = PYPROJECT["optional-dependencies"]
    assert {"binary", "embedded", "test", "docs"} <= set(extras)
    assert extras["binary"] == ["psycopg[binary]>=3.2"]
    assert any(d.startswith("django-environ") for d in extras["test"])


def test_classifiers_cover_every_supported_python_and_django() -> None:
    classifiers = set(PYPROJECT["classifiers"])
    for python in ("3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {python}" in classifiers
    for django in ("5.2", "6.0", "6.1"):
        assert f"Framework :: Django :: {django}" in classifiers
