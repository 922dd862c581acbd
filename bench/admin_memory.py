"""Peak memory and page size of the admin with huge jobs.

    DATABASE_URL=... python bench/admin_memory.py setup [MB]   # 3 jobs of MB-sized args
    DATABASE_URL=... python bench/admin_memory.py list|detail  # one request, in this process
    DATABASE_URL=... python bench/admin_memory.py cleanup

Each measuring run is its own process: it prints the peak RSS before and after one
request (``ru_maxrss``) and the HTML size. The rows are written with SQL, as a psql
session (or a release without MAX_ARGS_BYTES) could.
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import reverse  # noqa: E402

TASK = "bench.admin_memory.huge"


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(command: str, size_mb: int = 50) -> None:
    if command == "setup":
        call_command("migrate", verbosity=0)
        user = get_user_model()
        if not user.objects.filter(username="bench").exists():
            user.objects.create_superuser("bench", "bench@example.com", "bench")
        with connection.cursor() as cursor:
            for _ in range(3):
                cursor.execute(
                    "INSERT INTO django_pgjobs_job (task, args, last_error, errors) VALUES "
                    "(%s, jsonb_build_array(repeat('x', %s)), 'boom', '[]')",
                    [TASK, size_mb * 1024 * 1024],
                )
        return
    if command == "cleanup":
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM django_pgjobs_job WHERE task = %s", [TASK])
        return
    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(id) FROM django_pgjobs_job WHERE task = %s", [TASK])
        (job_id,) = cursor.fetchone()
    url = (
        reverse("admin:django_pgjobs_job_changelist")
        if command == "list"
        else reverse("admin:django_pgjobs_job_change", args=[job_id])
    )
    client.get(reverse("admin:index"))  # warm up: templates, admin site, session
    before = peak_mb()
    response = client.get(url, HTTP_HOST="localhost")
    print(
        f"{command}: HTTP {response.status_code}, {len(response.content) / 1024:,.0f} kB of "
        f"HTML, peak RSS {before:,.0f} MB before the request, {peak_mb():,.0f} MB after"
    )


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
