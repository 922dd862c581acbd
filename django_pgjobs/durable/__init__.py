"""Durable jobs: steps that never run twice, sleeps that hold no worker, code changes
that do not strand a running job (docs/howto/durable-jobs.md).

The parts, each in its module:

* ``models.py``: ``JobStep`` (a job's recorded steps, pruned with the job) and the
  columns a parked job uses on its row (``waiting_for``, ``wakes``);
* ``steps.py``: the step storage a waiting primitive calls in its own transaction
  (``recorded``, ``record`` under the lease, ``encode``);
* ``run.py``: ``DurableRun``, one run matched against its recorded history
  (``step``, ``sleep``, ``patched``; ``next_key`` / ``replay`` / ``record`` for
  further primitives), ``NonDeterministic`` when the code contradicts it;
* ``atomic.py``: ``atomic_step``, the block and its checkpoint in one transaction;
* ``control.py``: ``Parked`` (the run ends, the job waits: the executor's outcome
  "waiting", written by ``JOB_PARK`` with the attempt not counted and the slot
  freed) and ``RunFenced``.
* ``signal_models.py``: ``JobSignal`` (a message to one job, deleted with it) and
  ``JobEvent`` (by name and key, pruned by age);
* ``signals.py`` / ``events.py``: ``send_signal`` and ``emit_event``, written in the
  caller's transaction (``payloads.py`` checks what they carry).

The statements are in ``db/durable.py`` (signals and events: ``db/job_signals.py``,
``db/events.py``); the wake pass that moves due waiting jobs
back to pending in ``maintenance/wakes.py``.
"""
