"""The Django admin: the job list, detail, actions and overview (``jobs`` and the modules
it is made of), the worker rows (``workers``), the queue rows (``queues``), the workflow runs
(``workflows``) and the overview page's SVG charts (``charts``).

Importing this package registers the ModelAdmins (Django's autodiscovery does).
"""

from django_pgjobs.admin import jobs, queues, workers, workflows  # noqa: F401 (registers the ModelAdmins)
