"""Lookups from the URL refused before they reach PostgreSQL.

The admin turns any query parameter into a filter (``?queue=…``, ``?name=…``, a
search term). PostgreSQL text cannot hold NUL, so ``?queue=%00`` was a 500
(``DataError``) on every list. Taken as a wrong lookup instead, the admin answers
the way it does for any bad filter: a redirect to the unfiltered list (``?e=1``).
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.options import IncorrectLookupParameters
from django.http import HttpRequest


def refuse_nul(request: HttpRequest) -> None:
    """Raise ``IncorrectLookupParameters`` when a query parameter holds a NUL."""
    for key, values in request.GET.lists():
        if "\x00" in key or any("\x00" in v for v in values):
            raise IncorrectLookupParameters("a filter or search term holds a NUL character")


class RefusesNulLookups:
    """Mixed into a ``ModelAdmin``: its list refuses NUL in lookups (see module)."""

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        refuse_nul(request)
        return super().get_changelist_instance(request)  # type: ignore[misc]
