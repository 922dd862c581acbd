"""Argument parsing shared by the commands: the ``type=`` parsers (job ids, numbers,
ports, queue and status lists) and the job selection of ``retry_jobs`` and
``cancel_jobs`` (``--ids``, ``--task``, ``--queue``, ``--status``) turned into a
queryset. Bad values are argument errors naming the option, raised before anything
is written; what the commands then do is ``jobs/operations.py``'s."""

from __future__ import annotations

from argparse import ArgumentTypeError
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.management.base import CommandParser

from django_pgjobs.conf import get_settings, parsers
from django_pgjobs.states import JobStatus
from django_pgjobs.support.validation import check_queue, check_text

if TYPE_CHECKING:
    from django_pgjobs.jobs.managers import JobQuerySet

N = TypeVar("N", int, float)

RETRY_STATUSES = (str(JobStatus.DEAD), str(JobStatus.CANCELLED), str(JobStatus.RUNNING))
CANCEL_STATUSES = tuple(
    str(s) for s in (JobStatus.BLOCKED, JobStatus.WAITING, JobStatus.PENDING, JobStatus.RUNNING)
)


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


def _number(value: str, convert: Callable[[str], N], expected: str) -> N:
    try:
        return convert(value)
    except ValueError:
        raise ArgumentTypeError(f"expected {expected}, got {value!r}") from None


def positive_int(value: str) -> int:
    number = _number(value, int, "a whole number")
    if number < 1:
        raise ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def positive_float(value: str) -> float:
    number = _number(value, float, "a number of seconds")
    if not number > 0 or number == float("inf"):
        raise ArgumentTypeError(f"must be a positive number of seconds, got {value!r}")
    return number


def port_number(value: str) -> int:
    number = _number(value, int, "a port number")
    if not 0 <= number <= 65535:
        raise ArgumentTypeError(
            f"must be a port number (0-65535; 0 picks a free one), got {number}"
        )
    return number


def worker_id(value: str) -> str:
    """``--worker-id``: 1-255 characters PostgreSQL can store (argv may carry
    undecodable bytes as lone surrogates), for it is written on every claimed row."""
    if not value or len(value) > 255:
        raise ArgumentTypeError(f"must be 1-255 characters, got {len(value)}")
    try:
        check_text(value, "it")
    except TypeError as exc:
        raise ArgumentTypeError(str(exc).removeprefix("it ")) from None
    return value


def listen_address(value: str) -> str:
    try:
        return parsers.listen_address.parse(value, "")
    except parsers.SettingsError as exc:  # " must be ...": argparse names the option
        raise ArgumentTypeError(str(exc).strip()) from None


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


def status_list(
    allowed: Sequence[str], what: str = "a status this command changes"
) -> Callable[[str], list[str]]:
    def parse(value: str) -> list[str]:
        names = name_list(value)
        for name in names:
            if name not in allowed:
                raise ArgumentTypeError(f"{name!r} is not {what}; choose from {', '.join(allowed)}")
        return names

    return parse


def add_selection_arguments(
    parser: CommandParser, statuses: Sequence[str], default_status: Sequence[str]
) -> None:
    """``--ids``, ``--task``, ``--queue``, ``--status`` (of ``statuses``) and ``--dry-run``."""
    parser.add_argument("--ids", type=id_list, default=None, help="comma-separated job ids")
    parser.add_argument(
        "--task",
        type=name_list,
        default=None,
        help="comma-separated task names (module.function)",
    )
    parser.add_argument("--queue", type=queue_names, default=None, help="comma-separated queues")
    parser.add_argument(
        "--status",
        type=status_list(statuses),
        default=None,
        help=f"comma-separated statuses, of {', '.join(statuses)} "
        f"(default {','.join(default_status)})",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="show what would change; change nothing"
    )


def selected_jobs(options: dict[str, Any], default_status: Sequence[str]) -> JobQuerySet:
    """The jobs the options select, in ``PGJOBS["DATABASE"]``."""
    from django_pgjobs.models import Job

    qs = Job.objects.using(get_settings().DATABASE).all()
    if options["ids"]:
        qs = qs.filter(id__in=options["ids"])
    if options["task"]:
        qs = qs.filter(task__in=options["task"])
    if options["queue"]:
        qs = qs.filter(queue__in=options["queue"])
    return qs.filter(status__in=options["status"] or default_status)
