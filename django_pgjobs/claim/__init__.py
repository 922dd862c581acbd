"""The claim: how a worker takes its next jobs, from the one call it makes down to
the statements.

* ``claimant.py``: ``Claimant``, the one object a worker asks for up to n jobs. It
  decides which claim to run (the plain claim, the limited claim of flow control,
  from the claim front's bound or not), runs it, and gives back a job of a task the
  worker does not know.
* ``run.py``: one claim, chosen by its arguments, in one round trip.
* ``compiled.py``: the plain claims' statements, compiled once per database vendor
  from ``Job.objects.claimable()`` around the hand-written parts of ``plain.py``.
* ``plain.py``: the hand-written SQL of the plain claims (the UPDATE that marks the
  picked rows running, the several-queue and every-queue scans) and its runner.
* ``limited.py``: the limited claim (pause, ``max_running``, ``rate``, concurrency
  keys), serialised by an advisory lock, and the queue limits a worker reads.
* ``front.py`` and ``probe.py``: where a worker's claims may start reading the claim
  index, and the probe on its maintenance thread that keeps that bound honest.
* ``rows.py``: what a claimed row becomes (``Claimed``).

The locks each statement takes are commented beside it. Nothing here is imported
by the storage layer (``db/``) it runs on.
"""

from django_pgjobs.claim.claimant import Claimant
from django_pgjobs.claim.compiled import claim_statements
from django_pgjobs.claim.plain import UNBOUNDED
from django_pgjobs.claim.rows import Claimed
from django_pgjobs.claim.run import claim

__all__ = ["UNBOUNDED", "Claimant", "Claimed", "claim", "claim_statements"]
