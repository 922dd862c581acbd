"""Rules that have one home: each is defined once and the others derive from it."""

from __future__ import annotations

import psycopg
import pytest

from django_pgjobs.support.pgconn import DJANGO_ONLY, psycopg_params


@pytest.mark.django_db
def test_dedicated_connections_drop_only_djangos_own_options() -> None:
    params = psycopg_params("default", application_name="pgjobs-test")
    assert not set(DJANGO_ONLY) & set(params)
    assert "prepare_threshold" in params, "Django's choice (None: poolers) is kept"
    with psycopg.connect(**params, autocommit=True) as conn:
        row = conn.execute("SHOW application_name").fetchone()
    assert row == ("pgjobs-test",)
