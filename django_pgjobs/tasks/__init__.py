"""Django's Tasks framework (``django.tasks``) on top of django-pgjobs.

``backend`` is the backend class (documented as ``django_pgjobs.backend.PgJobsBackend``);
``bridge`` runs a Django ``Task`` as a job and reports its result the Tasks way.
"""
