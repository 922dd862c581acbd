"""``Job.objects``: enqueue by name, plus the querysets the admin and status views use."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import models
from django.utils import timezone

from .states import TERMINAL, JobStatus

if TYPE_CHECKING:
    from .models import Job


class JobQuerySet(models.QuerySet["Job"]):
    def pending(self) -> JobQuerySet:
        return self.filter(status=JobStatus.PENDING)

    def due(self) -> JobQuerySet:
        return self.filter(status=JobStatus.PENDING, run_at__lte=timezone.now())

    def running(self) -> JobQuerySet:
        return self.filter(status=JobStatus.RUNNING)

    def stuck(self, stale_after: float | None = None) -> JobQuerySet:
        """Running with a heartbeat older than ``STALE_AFTER``."""
        from .conf import get_settings

        seconds = get_settings().STALE_AFTER if stale_after is None else stale_after
        return self.filter(
            status=JobStatus.RUNNING,
            heartbeat_at__lt=timezone.now() - timedelta(seconds=seconds),
        )

    def dead(self) -> JobQuerySet:
        return self.filter(status=JobStatus.DEAD)

    def finished(self) -> JobQuerySet:
        return self.filter(status__in=sorted(TERMINAL))


class JobManager(models.Manager["Job"]):
    def get_queryset(self) -> JobQuerySet:
        return JobQuerySet(self.model, using=self._db)

    def enqueue(self, task: str, *, args: Any = None, kwargs: Any = None, **options: Any) -> Job:
        """Enqueue a registered job by name; same options and guarantees as ``.enqueue()``."""
        from .enqueue import enqueue_by_name

        return enqueue_by_name(task, args=args, kwargs=kwargs, using=self._db, **options)

    async def aenqueue(self, task: str, *, args: Any = None, kwargs: Any = None,
                       **options: Any) -> Job:
        """``enqueue`` for async code; same options and guarantees."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.enqueue)(task, args=args, kwargs=kwargs, **options)

    def pending(self) -> JobQuerySet:
        return self.get_queryset().pending()

    def due(self) -> JobQuerySet:
        return self.get_queryset().due()

    def running(self) -> JobQuerySet:
        return self.get_queryset().running()

    def stuck(self, stale_after: float | None = None) -> JobQuerySet:
        return self.get_queryset().stuck(stale_after)

    def dead(self) -> JobQuerySet:
        return self.get_queryset().dead()
