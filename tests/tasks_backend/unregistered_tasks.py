"""A task module nothing imports: reading a result naming it must not import it."""

from django.tasks import task


@task
def never_imported() -> None:
    return None
