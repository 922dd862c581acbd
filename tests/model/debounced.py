"""The model's debounced keys: which job each enqueue of a key returned, read against
the state of the key's previous job just before and just after it. An enqueue joins
the key's job only while that job is pending and was never claimed; once it has
started (or ended), the enqueue makes a new job, so a change made while it runs is
not missed (docs/howto/control-throughput.md, "Debounce and keep-latest")."""

from __future__ import annotations

from dataclasses import dataclass, field

from django_pgjobs.models import Job


def _state(job_id: int) -> str:
    """The job's status, or "joinable": pending and never claimed, the only state a
    debounced enqueue may join."""
    row = Job.objects.filter(id=job_id).values("status", "started_at").first()
    if row is None:
        return "gone"
    joinable = row["status"] == "pending" and row["started_at"] is None
    return "joinable" if joinable else str(row["status"])


@dataclass
class Debounced:
    last: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, key) -> job
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("new", "joined"), 0))

    def before(self, kind: str, key: str) -> tuple[int, str] | None:
        """The job the key's last enqueue returned, and its state now."""
        prior = self.last.get((kind, key))
        return None if prior is None else (prior, _state(prior))

    def after(
        self, kind: str, key: str, before: tuple[int, str] | None, got: int, retried: bool
    ) -> str:
        """Check what the enqueue returned (``got``) against ``before``; say what it did.
        ``retried``: the model put the previous job back to pending (a retry after its
        cancel), which the rule of the first enqueue need not follow."""
        self.last[(kind, key)] = got
        if before is None:
            self.counts["new"] += 1
            return "a new job"
        prior, state = before
        said = f"debounce key {key!r} ({kind})"
        if got == prior:
            self.counts["joined"] += 1
            if state != "joinable":
                self.problems.append(
                    f"{said}: an enqueue joined job {prior}, {state} (claimed before) when it began"
                )
            return "joined its pending job"
        if state == "joinable" and not retried and _state(prior) == "joinable":
            self.problems.append(
                f"{said}: an enqueue made job {got} while job {prior} of its key was pending,"
                " never claimed"
            )
        what = "claimed meanwhile" if state == "joinable" else state
        self.counts[what] = self.counts.get(what, 0) + 1
        return f"a new job (job {prior} {what})"
