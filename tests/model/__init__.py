"""The model-based test of the combinations: seeded random scenarios over real
``runjobs`` processes mixing timeouts, cancels, concurrency keys, ``max_running``,
``unique_while``, fair keys, debounced bursts, chunk handlers, pause/resume, async
jobs, worker SIGKILL and freezes (reaps), checked against the contract after every
step and at the end of each scenario.

A seeded runner rather than Hypothesis: with real processes a failing run cannot
be shrunk reliably (timing differs from one run to the next), but its seed replays
the same plan of steps (``PGJOBS_MODEL_SEED=<seed>``). Modules: ``jobs`` (what the
workers run), ``records`` (each run's own start and end rows), ``plan`` (the ops
and the plan a seed makes), ``world`` (workers and the model's bookkeeping while a
plan runs), ``batches`` and ``debounced`` (what the model tracks of batches and of
debounced keys), ``checks`` (the invariants), ``runner`` (one scenario, start to end).
"""
