"""The package's storage: every SQL statement but the claim's, by table and purpose, and
the functions that run them (a statement ``JOB_RETRY`` is run by ``job_retry()``: one
grep finds either). The claim's statements live beside the claim (``claim/``) and run
on this package's cursors. The packages above write only through ``store.py``, the
façade that lists every write to the job rows and their side tables.

Why raw SQL: each statement here is one round trip that the ORM would split into
several (select-then-update, update-then-insert). Locking rules, used everywhere:

* claims and the reaper take rows with ``FOR UPDATE SKIP LOCKED``: they never wait
  for another worker and never deadlock with one;
* every multi-row write that *waits* for locks (heartbeat, complete, admin
  actions) first locks its rows in ``id`` order, so two of them can never wait on
  each other in a cycle;
* every write about a claimed job is fenced by ``lease = <the claimed lease>``: a
  zombie's late write matches zero rows and changes nothing.

Statements run in autocommit unless the caller has a transaction open (enqueue
joins the caller's transaction on purpose). Every statement that moves a job from
one status to another declares its moves next to its text (``moves.declare``);
``tests/db/test_transitions.py`` holds them to ``states.ALLOWED_TRANSITIONS``.

This package imports no model: the claim's inner query, compiled from
``Job.objects.claimable()``, is put together one layer up (``claim/compiled.py``).
"""
