"""``manage.py resume_queue NAME...``: let workers claim from paused queues again."""

from __future__ import annotations

from django_pgjobs.management.commands.pause_queue import Command as PauseCommand


class Command(PauseCommand):
    help = "Resume paused queues: workers claim from them again (woken at once by NOTIFY)."
    pause = False
