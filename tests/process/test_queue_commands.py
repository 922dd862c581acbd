"""``pause_queue`` / ``resume_queue`` refuse a queue nothing knows (a typo must not
leave the real queue running while an unused one is paused) unless told to create
it, and a bad ``--database`` is one line and exit 2, not a traceback. The commands
run as real ``manage.py`` processes."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_pgjobs import pause_queue, resume_queue
from django_pgjobs.models import Queue
from django_pgjobs.queues import UnknownQueue
from tests.conftest import manage
from tests.testapp.jobs import add

db = pytest.mark.django_db(transaction=True)


@db
def test_a_typo_is_refused_with_a_suggestion_and_writes_nothing() -> None:
    with pytest.raises(UnknownQueue) as raised:
        pause_queue("emials")
    message = str(raised.value)
    assert message.startswith("unknown queue 'emials': no @job")
    assert "Did you mean 'emails'?" in message and "create=True" in message
    with pytest.raises(UnknownQueue, match="unknown queues 'emials', 'defualt'"):
        resume_queue("emails", "emials", "defualt")  # one bad name: nothing written
    assert not Queue.objects.exists()


@db
def test_known_queues_pause_and_create_says_so() -> None:
    assert pause_queue("emails") == ["emails"]  # declared by @job(queue="emails")
    add.using(queue="tenant-7").enqueue(1, 1)  # ad hoc, but a job is on it
    assert pause_queue("tenant-7") == ["tenant-7"]
    assert resume_queue("tenant-7") == ["tenant-7"]
    assert pause_queue("launch-next-week", create=True) == ["launch-next-week"]
    assert resume_queue("launch-next-week") == ["launch-next-week"]  # it has a row now
    rows = dict(Queue.objects.values_list("name", "paused"))
    assert rows == {"emails": True, "tenant-7": False, "launch-next-week": False}


@db
def test_the_functions_name_a_bad_alias() -> None:
    with pytest.raises(ValueError, match=r"^using: no database alias 'nosuch' in DATABASES"):
        pause_queue("default", using="nosuch")
    with pytest.raises(CommandError, match=r"--database: no database alias 'defualt'.*'default'"):
        call_command("resume_queue", "default", "--database", "defualt")


@pytest.mark.process
@db
@pytest.mark.parametrize("command", ["pause_queue", "resume_queue"])
def test_the_commands_refuse_typos_and_bad_databases_in_one_line(command: str) -> None:
    typo = manage(command, "emials")
    assert typo.returncode == 1, typo.stderr
    assert len(typo.stderr.strip().splitlines()) == 1, typo.stderr
    assert "CommandError: unknown queue 'emials'" in typo.stderr
    assert "Did you mean 'emails'?" in typo.stderr and f"{command} --create" in typo.stderr
    assert not Queue.objects.filter(name="emials").exists()

    created = manage(command, "emials", "--create")
    assert created.returncode == 0, created.stderr
    verb = "paused" if command == "pause_queue" else "resumed"
    assert created.stdout.strip() == f"{verb} queue emials"
    assert Queue.objects.get(name="emials").paused is (command == "pause_queue")

    bad = manage(command, "default", "--database", "nosuch")
    assert bad.returncode == 2, bad.stderr
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1, bad.stderr
    assert lines[0].startswith("CommandError: --database: no database alias 'nosuch' in DATABASES")
    assert "Traceback" not in bad.stderr
