"""What an operator reads: the queries behind ``jobs_status`` and the admin overview
(``overview``, ``status``, ``activity``; the statements are in ``db/reports.py``),
Prometheus metrics (``metrics``, ``queue_stats``) and the liveness file (``probe``;
``python -m django_pgjobs.health PATH`` checks it).
"""
