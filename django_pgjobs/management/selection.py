"""The job selection shared by ``retry_jobs`` and ``cancel_jobs``: ``--ids``, ``--task``,
``--queue``, ``--status``, ``--dry-run``. Bad values are argument errors naming the
option, raised before anything is written."""

from __future__ import annotations

from argparse import ArgumentTypeError
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_pgjobs.conf import get_settings
from django_pgjobs.health import readiness
from django_pgjobs.states import JobStatus
from django_pgjobs.validation import check_queue

#: Ids listed by --dry-run before "and N more".
SHOWN = 20


def id_list(value: str) -> list[int]:
    ids = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            number = int(part)
        except ValueError:
            raise ArgumentTypeError(f"expected comma-separated job ids, got {part!r}") from None
        if not 1 <= number < 2**63:
            raise ArgumentTypeError(f"job ids are positive 64-bit numbers, got {part}")
        ids.append(number)
    if not ids:
        raise ArgumentTypeError("expected comma-separated job ids, such as 12,15")
    return ids


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise ArgumentTypeError(f"must be a positive number of seconds, got {value!r}")
    return number


def port_number(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"expected a port number, got {value!r}") from None
    if not 0 <= number <= 65535:
        raise ArgumentTypeError(
            f"must be a port number (0-65535; 0 picks a free one), got {number}"
        )
    return number


def name_list(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise ArgumentTypeError(
            "expected a comma-separated list of names (or * for every queue, "
            "where a command takes that)"
        )
    return names


def queue_names(value: str) -> list[str]:
    names = name_list(value)
    for name in names:
        try:
            check_queue(name)
        except ValueError as exc:
            raise ArgumentTypeError(str(exc)) from None
    return names


def status_list(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(value: str) -> list[str]:
        names = name_list(value)
        for name in names:
            if name not in allowed:
                raise ArgumentTypeError(
                    f"{name!r} is not a status this command changes; "
                    f"choose from {', '.join(allowed)}"
                )
        return names

    return parse


class SelectionCommand(BaseCommand):
    """Select jobs by id/task/queue/status, then change them with one fenced method."""

    verb = ""  # "retry" / "cancel"
    done = ""  # "Retried" / "Cancelled"
    statuses: tuple[str, ...] = ()
    default_status: list[str] | None = None

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--ids", type=id_list, default=None, help="comma-separated job ids")
        parser.add_argument(
            "--task",
            type=name_list,
            default=None,
            help="comma-separated task names (module.function)",
        )
        parser.add_argument(
            "--queue", type=queue_names, default=None, help="comma-separated queues"
        )
        default = ",".join(self.default_status or self.statuses)
        parser.add_argument(
            "--status",
            type=status_list(self.statuses),
            default=None,
            help=f"comma-separated statuses, of {', '.join(self.statuses)} (default {default})",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="show what would change; change nothing"
        )

    def selection(self, options: dict[str, Any]) -> Any:
        from django_pgjobs.models import Job

        qs = Job.objects.using(get_settings().DATABASE).all()
        if options["ids"]:
            qs = qs.filter(id__in=options["ids"])
        if options["task"]:
            qs = qs.filter(task__in=options["task"])
        if options["queue"]:
            qs = qs.filter(queue__in=options["queue"])
        return qs.filter(status__in=options["status"] or self.default_status or self.statuses)

    def eligible(self, qs: Any) -> Any:
        raise NotImplementedError

    def apply(self, qs: Any) -> int:
        raise NotImplementedError

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._handle(options)
        except DatabaseError as exc:
            explained = readiness.explain(exc, get_settings().DATABASE)
            if explained:
                raise CommandError(explained) from exc
            raise

    def _handle(self, options: dict[str, Any]) -> None:
        qs = self.selection(options)
        if options["dry_run"]:
            ids = list(self.eligible(qs).order_by("id").values_list("id", flat=True)[: SHOWN + 1])
            count = self.eligible(qs).count()
            shown = ", ".join(f"#{i}" for i in ids[:SHOWN])
            more = f" and {count - SHOWN} more" if count > SHOWN else ""
            self.stdout.write(
                f"Would {self.verb} {count} job{'s' if count != 1 else ''}"
                + (f": {shown}{more}" if count else "")
                + " (dry run: nothing changed)."
            )
            return
        self.report(self.apply(qs))

    def report(self, changed: int) -> None:
        self.stdout.write(f"{self.done} {changed} job{'s' if changed != 1 else ''}.")


RETRY_STATUSES = (str(JobStatus.DEAD), str(JobStatus.CANCELLED), str(JobStatus.RUNNING))
CANCEL_STATUSES = (str(JobStatus.PENDING), str(JobStatus.RUNNING))
