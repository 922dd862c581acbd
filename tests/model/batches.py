"""The model's batches and retention: a ``batch()`` block left open across steps (the
plan's enqueues join it, as a slow import loop's would), a pruner pass past every
retention for the members of the batches that have not fired, and what the end
checks read: each batch fired once, counting every member that joined."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import F

from django_pgjobs import batch
from django_pgjobs.maintenance.pruner import Pruner
from django_pgjobs.models import Job, JobResult
from django_pgjobs.models import Workflow as WorkflowRow
from django_pgjobs.workflows import Batch
from tests.model import jobs

#: Older than any retention: what a long-open block's first members look like.
LONG_AGO = timedelta(days=400)


@dataclass
class Batches:
    open: Batch | None = None
    joined: list[int] = field(default_factory=list)  # the open batch's members
    closed: dict[int, list[int]] = field(default_factory=dict)  # batch id -> members
    problems: list[str] = field(default_factory=list)

    def toggle(self) -> str:
        """Open a batch, or close the open one (checking what it counted)."""
        if self.open is None:
            self.open = batch(on_complete=jobs.tally.s(), name="model")
            self.open.__enter__()
            return f"  opened batch #{self.open.id}"
        return self.close()

    def close(self) -> str:
        b, self.open = self.open, None
        if b is None or b.id is None:
            return "  no batch open"
        b.__exit__(None, None, None)
        self.closed[b.id], self.joined = self.joined, []
        if b.members != len(self.closed[b.id]):
            self.problems.append(
                f"batch #{b.id} counted {b.members} members, {len(self.closed[b.id])} joined"
            )
        return f"  closed batch #{b.id}: {b.members} member(s)"

    def join(self, job: Job) -> None:
        if self.open is not None and job.workflow_id == self.open.id and job.id not in self.joined:
            self.joined.append(job.id)

    def unfired(self) -> dict[int, list[int]]:
        batches = {
            **self.closed,
            **({self.open.id: self.joined} if self.open and self.open.id else {}),
        }
        fired = set(
            WorkflowRow.objects.filter(id__in=list(batches), fired_at__isnull=False).values_list(
                "id", flat=True
            )
        )
        return {i: members for i, members in batches.items() if i not in fired}

    def none_finished(self) -> bool:
        """Members of unfired batches have joined and none has finished yet."""
        members = [i for ms in self.unfired().values() for i in ms]
        return (
            bool(members)
            and not Job.objects.filter(id__in=members, finished_at__isnull=False).exists()
        )

    def prune(self) -> str:
        """A real pruner pass, with the finished members of unfired batches past every
        retention (their finish times put back after it: the other checks read them)."""
        members = [i for ms in self.unfired().values() for i in ms]
        finished = list(
            Job.objects.filter(id__in=members, finished_at__isnull=False).values_list(
                "id", flat=True
            )
        )
        Job.objects.filter(id__in=finished).update(finished_at=F("finished_at") - LONG_AGO)
        try:
            Pruner().run_once()
        finally:
            Job.objects.filter(id__in=finished).update(finished_at=F("finished_at") + LONG_AGO)
        gone = sorted(
            set(finished) - set(Job.objects.filter(id__in=finished).values_list("id", flat=True))
        )
        if gone:
            self.problems.append(f"the pruner deleted members {gone} of a batch not fired")
        return f"  pruned past the retention: {len(finished)} finished member(s) of unfired batches kept"

    def callbacks(self) -> list[int]:
        return list(
            Job.objects.filter(
                workflow_id__in=list(self.closed), waiting__isnull=False
            ).values_list("id", flat=True)
        )

    def at_end(self) -> list[str]:
        """Each closed batch fired once; its callback got counts summing to the members
        that joined; its row's counts match its members' final statuses."""
        problems = list(self.problems)
        for run_id, members in self.closed.items():
            [callback] = Job.objects.filter(workflow_id=run_id, waiting__isnull=False)
            value = JobResult.objects.filter(job_id=callback.id).values_list("value", flat=True)
            counts = value[0] if value else None
            if callback.status != "completed" or not isinstance(counts, dict):
                problems.append(f"batch #{run_id}: callback {callback.status}, result {counts!r}")
                continue
            if sum(counts.values()) != len(members):
                problems.append(f"batch #{run_id} fired with {counts}, {len(members)} joined")
            row = WorkflowRow.objects.get(id=run_id)
            final = dict.fromkeys(("completed", "dead", "cancelled"), 0)
            for status in Job.objects.filter(id__in=members).values_list("status", flat=True):
                final[status] += 1
            if (row.completed, row.dead, row.cancelled) != tuple(final.values()):
                problems.append(f"batch #{run_id}: row counts differ from its members' {final}")
        return problems
