"""The Django admin: the job list and detail with their actions (``jobs``), the queue
rows (``queues``) and the overview page's SVG charts (``charts``).

Importing this package registers both ModelAdmins (Django's autodiscovery does).
"""

from django_pgjobs.admin import jobs, queues  # noqa: F401 (registers the ModelAdmins)
