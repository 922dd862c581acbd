"""The statement x fault matrix's rows: each a statement as one caller issues it,
the invariants checked after every cell, the timings the cells share, and the
statements of ``db/`` that no Django connection runs (``NOT_RUNTIME``). The cells
themselves: ``matrix.py`` (``Scenario``) and ``matrix_cells.py`` (one runner a kind)."""

from __future__ import annotations

from dataclasses import dataclass

STEP = "tests.testapp.jobs.fault_step"
NOOP = "tests.testapp.jobs.noop"
ATOMIC = "tests.testapp.jobs.fault_atomic"
UNKNOWN = "tests.faults.not_in_this_release"
KEYED = "tests.flow_keyed_jobs.per_user"
CRASHER = "tests.testapp.jobs.exits_nine"
#: A chunked job (setup="chunk"): the worker fills its chunk with the chunk's claim.
CHUNK = "tests.chunk_jobs.fault_chunk"
#: A durable job: a step, a half-second sleep, a step (setup="durable").
DURABLE = "tests.durable_jobs.fault_durable"
#: A job that waits: takes a signal sent before it, then a signal wait and two event
#: waits that time out (setup="waits").
WAITS = "tests.signal_jobs.fault_waits"
#: An async job that cancels every task of its worker's loop, and its neighbour.
CANCELS_ALL = "tests.testapp.core_jobs.cancels_every_task"
ASYNC_SLEEP = "tests.testapp.core_jobs.async_sleep"
#: Workers that know a keyed task take the limited claim, which counts held slots.
KEYED_ENV = (("PGJOBS_TEST_KEYED", "1"),)
#: The concurrency key (limit 1) of the held-slot cells' jobs.
HELD_KEY = "held:1"
FINAL = ("completed", "dead", "cancelled")
#: A fresh job must complete within this after a scenario (the queue is not wedged).
FRESH_DEADLINE = 10.0
SETTLE_DEADLINE = 12.0
#: The suspect-crash cells' workload holds two runs in a child process of their own,
#: each a Python start-up, and a reclaim after STALE_AFTER: on a loaded box that takes
#: longer than SETTLE_DEADLINE.
SUSPECT_SETTLE_DEADLINE = 30.0
#: How long a worker cell of a periodic pass's statement waits for its fault to fire
#: (the statistics pass runs every 5 s, with a tenth of jitter).
PERIODIC_DEADLINE = 15.0

INVARIANTS = (
    ("fired", "the fault was injected"),
    ("not_lost", "no committed job lost"),
    ("once", "none completed twice"),
    ("bounded", "no job pending with attempts above its bound"),
    ("not_wedged", "no queue wedged (a fresh job completes)"),
    ("no_false_fence", "no false job_fenced"),
    ("one_success_signal", "every completed job got exactly one success signal"),
    (
        "all_or_nothing",
        "enqueue_many and pause/resume: every row written or none, and the caller got an"
        " error (the rows are there, once, only when the COMMIT landed)",
    ),
    (
        "released",
        "workflows: a node is released (or cancelled) once its parents have finished, a"
        " completed node never started before a completed parent's completion, and a"
        " callback runs exactly once",
    ),
    (
        "honoured",
        "pause/resume: workers honour the committed state (a job of a paused queue waits,"
        " of a resumed one runs)",
    ),
    (
        "listener",
        "LISTEN connection: the worker claims while it fails, and a NOTIFY wakes the worker"
        " again once it recovered",
    ),
    (
        "limit",
        "a concurrency key of limit 1 never has two runs at once, read from the runs' own"
        " start/end effects (threads abandoned after a timeout or a cancel included)",
    ),
    (
        "slots_back",
        "every held limit slot is given back while the workers still run, once its run"
        " ended or its worker is gone (no key is blocked for good)",
    ),
    (
        "delivered",
        "send_signal and emit_event, each retried once by the caller: the signal stored"
        " exactly once (its idempotency key), a duplicate delivery given the same signal,"
        " the event at least once (at most twice: an event has no key)",
    ),
    (
        "kept_alive",
        "heartbeat process: a job holding the GIL past STALE_AFTER, during which the"
        " process's statement failed, runs once on its first claim and completes (a"
        " second worker's reaper watching)",
    ),
)
#: The queues a pause/resume cell changes in one call (a half-written call would
#: leave them different).
PAUSED = ("default", "other")
#: The listener cells' poll interval: long enough that a job completing within
#: NOTIFY_DEADLINE of its NOTIFY was woken by it, not by the poll.
LISTENER_POLL = 4.0
NOTIFY_DEADLINE = 1.5
#: The heartbeat process's cells: STALE_AFTER of 6 heartbeat intervals, the ratio of
#: the defaults (5 s, 30 s). The process's first beat comes 1.5 intervals into the
#: thread's silence, so the suite's 4 intervals leave a failed beat and its reconnect
#: about a second, too little on a heavily loaded box (docs/explanation/guarantees.md).
PULSE_STALE_AFTER = 3.0
#: ... and one C call keeps the GIL this long.
GIL_HOLD = PULSE_STALE_AFTER + 1.5
#: A pause or resume reaches the workers at once by NOTIFY, else within POLL_INTERVAL.
PROPAGATION = 1.0
HONOUR_WINDOW = 1.5


@dataclass(frozen=True)
class Row:
    """One statement as one caller issues it."""

    label: str
    # "db.NAME" (a statement of django_pgjobs/db/), "copy:job", "listener:...", "orm:VERB table*" (a
    # pattern: every shape of that verb on that table) or "*read" (every read)
    statement: str
    # worker | shutdown | cron | driver | timeout | exhausted | queue | listener |
    # held_timeout | held_cancel | pulse | shutdown_ahead | foreign_cancel
    kind: str
    skip: int = 0  # matching calls let through before the fault
    args: tuple[str, ...] = ()
    action: str = ""  # driver action
    times: int = 1
    django6: bool = False  # the Tasks backend: Django >= 6.0 only
    linger: float = 0.0  # ambiguous: seconds between the commit and the error
    # flow workload: unknown | unknown_dead | max_running | rate | keyed | keyed_ghost
    # | suspect_crash | fair | fair_limited | durable | chunk | waits
    setup: str = ""
    env: tuple[tuple[str, str], ...] = ()  # extra environment of the faulted worker
    # ambiguous inside a transaction: the COMMIT lands and its reply is lost (instead
    # of the connection dropping before the COMMIT)
    at_commit: bool = False
    # a periodic pass's statement (every few seconds): the worker cell waits for the
    # fault to fire (up to PERIODIC_DEADLINE) before it stops the worker, instead of
    # hoping a pass fell inside the workload's few seconds
    periodic: bool = False

    @property
    def id(self) -> str:
        return self.label.replace(" ", "-").replace(":", "").replace("(", "").replace(")", "")


#: The claim front's probe every 0.3 s (tests/settings.py), so a cell sees it fire.
PROBE_ENV = (("PGJOBS_TEST_PROBE_EVERY", "0.3"),)

ROWS: tuple[Row, ...] = (
    # A worker of every queue reads the queues with pending jobs, then claims from
    # them by name (JOB_CLAIM_ONE_QUEUE here: the workload has one queue).
    Row("worker: find the queues with pending jobs", "claim.PENDING_QUEUES", "worker"),
    Row("worker: claim, every queue", "claim.JOB_CLAIM_ONE_QUEUE", "worker"),
    Row(
        "worker: claim, one queue",
        "claim.JOB_CLAIM_ONE_QUEUE",
        "worker",
        args=("--queues", "default"),
    ),
    Row(
        "worker: claim, several queues",
        "claim.JOB_CLAIM_QUEUES",
        "worker",
        args=("--queues", "default,other"),
    ),
    Row(
        "worker: complete (atomic job, in its transaction)",
        "db.JOB_COMPLETE_MANY_REDO",
        "worker",
    ),
    # The completer's first try; after a fault it redoes the batch with the _REDO form.
    Row("worker: complete (completer)", "db.JOB_COMPLETE_MANY", "worker", skip=1),
    Row("worker: stored result of a key", "db.RESULT_BY_KEY", "worker"),
    # The reply is lost for 1.5 s: long enough for the retried job to be claimed again
    # before the completer redoes its write (a longer outage does the same).
    Row("worker: retry (reply lost for 1.5 s)", "db.JOB_RETRY", "worker", linger=1.5),
    Row("worker: dead-letter", "db.JOB_DEAD", "worker"),
    # Flow control (claim/claimant.py): after a job of a task it does not know (deploy skew) a
    # worker claims with the known-task filter; a queue row with a limit, or a loaded
    # task with a concurrency key, makes it take FLOW_LOCK and the limited claim.
    Row(
        "worker: claim known tasks, every queue",
        "claim.JOB_CLAIM_ONE_QUEUE_KNOWN",  # by name, from claim.PENDING_QUEUES
        "worker",
        setup="unknown",
    ),
    Row(
        "worker: claim known tasks, one queue",
        "claim.JOB_CLAIM_ONE_QUEUE_KNOWN",
        "worker",
        args=("--queues", "default"),
        setup="unknown",
    ),
    Row(
        "worker: claim known tasks, several queues",
        "claim.JOB_CLAIM_QUEUES_KNOWN",
        "worker",
        args=("--queues", "default,other"),
        setup="unknown",
    ),
    Row(
        "worker: limited claim, every queue (max_running)",
        "claim.JOB_CLAIM_LIMITED_ALL",
        "worker",
        setup="max_running",
    ),
    Row(
        "worker: limited claim, every queue (keyed job)",
        "claim.JOB_CLAIM_LIMITED_ALL",
        "worker",
        setup="keyed",
        env=(("PGJOBS_TEST_KEYED", "1"),),
    ),
    Row(
        "worker: limited claim, listed queues (rate)",
        "claim.JOB_CLAIM_LIMITED_QUEUES",
        "worker",
        args=("--queues", "default,other"),
        setup="rate",
    ),
    Row("worker: limited claim's advisory lock", "claim.FLOW_LOCK", "worker", setup="max_running"),
    # Chunk handlers (worker/chunks.py): a worker of one thread claims the first job
    # of a chunked task alone, then fills its chunk on the job thread with the
    # one-queue known-task claim restricted to the task (claim/chunk.py); a lost reply
    # leaves jobs claimed that the worker never heard of, reclaimed by the reaper.
    Row(
        "worker: fill a chunk (the task's due jobs)",
        "claim.JOB_CLAIM_ONE_QUEUE_KNOWN",
        "worker",
        args=("--concurrency", "1"),
        setup="chunk",
    ),
    # ... and completes them with the completion that records their chunk run.
    Row(
        "worker: complete a chunk's jobs (recording their chunk run)",
        "db.JOB_COMPLETE_CHUNK",
        "worker",
        args=("--concurrency", "1"),
        setup="chunk",
    ),
    Row("worker: read the queue limits", "claim.QUEUE_LIMITS", "worker", setup="max_running"),
    # Fair shares (claim/fair.py): the workload's jobs have fair keys, so the worker
    # finds their queue among the fair ones and claims it with the fair claim.
    Row("worker: fair claim (jobs with fair keys)", "claim.JOB_CLAIM_FAIR", "worker", setup="fair"),
    Row("worker: read the fair queues", "claim.FAIR_QUEUES", "worker", setup="fair"),
    Row(
        "worker: limited fair claim (fair keys, max_running)",
        "claim.JOB_CLAIM_LIMITED_FAIR",
        "worker",
        setup="fair_limited",
    ),
    Row("worker: heartbeat", "db.JOB_HEARTBEAT", "worker"),
    # runjobs' start-up check (db/readiness.py): a failure is "cannot reach the
    # database", not fatal, so the worker starts and its loop retries.
    Row("worker: check the tables exist at start", "db.TABLE_EXISTS", "worker"),
    Row("worker: register", "db.WORKER_UPSERT", "worker"),
    Row("worker: worker row refresh", "db.WORKER_UPSERT", "worker", skip=1),
    Row("worker: unregister at exit", "db.WORKER_DELETE", "worker"),
    Row("worker: release at shutdown", "db.JOB_RELEASE", "shutdown"),
    Row(
        "worker: release the jobs claimed ahead at shutdown",
        "db.JOB_RELEASE_MANY",
        "shutdown_ahead",
    ),
    # An async run cancelled by another job on the loop is given back by the completer
    # (redone after a connection error: the statement recognises its committed write).
    Row("worker: give back an async run another job cancelled", "db.JOB_RELEASE", "foreign_cancel"),
    Row("worker: give up a timed-out run", "db.JOB_TIMED_OUT", "timeout"),
    # Limits count what really runs (db/held_slots.py): a keyed run given up on holds
    # its slot (in the same statement) until its thread ends; the worker gives it back.
    Row(
        "worker: give up a timed-out keyed run (its slot held)",
        "db.JOB_TIMED_OUT",
        "held_timeout",
        env=KEYED_ENV,
    ),
    Row(
        "worker: give back the slot of a run that ended",
        "db.HELD_SLOT_FREE",
        "held_timeout",
        env=KEYED_ENV,
    ),
    Row("worker: dead-letter rows with no attempts left", "db.JOB_DEAD_EXHAUSTED", "exhausted"),
    Row("unknown-task sweeper: record known tasks", "db.KNOWN_TASKS_TOUCH", "worker"),
    Row(
        "unknown-task sweeper: dead-letter (timeout 1 s)",
        "db.JOB_DEAD_UNKNOWN",
        "worker",
        setup="unknown_dead",
        env=(("PGJOBS_TEST_UNKNOWN_TASK_TIMEOUT", "1"),),
    ),
    # Workflows: a chord of two STEP members and an ATOMIC callback in
    # the worker's workload (setup="workflow"); the release rides on the completion
    # of the last member (the trigger of db/workflow_trigger.py), so failing that completion
    # fails or loses the release with it, never one without the other.
    Row(
        "worker: complete a chord's last member (releases its callback)",
        "db.JOB_COMPLETE_MANY",
        "worker",
        skip=1,
        setup="workflow",
    ),
    Row("worker: a node's parents and their sizes", "db.PARENT_EDGES", "worker", setup="workflow"),
    # the callback reads its parents' results as it uses them (ATOMIC reads them all)
    Row(
        "worker: a page of a node's parents' results",
        "db.PARENT_RESULT_PAGE",
        "worker",
        setup="workflow",
    ),
    # a result larger than a page: the callback reads it alone, as a stream of pieces
    Row(
        "worker: a node's parent's large result, in pieces",
        "db.PARENT_RESULT_PIECES",
        "worker",
        setup="workflow",
    ),
    Row("repair pass: lock blocked jobs", "db.WF_REPAIR_LOCK", "worker", setup="workflow"),
    Row("repair pass: recount their parents", "db.WF_REPAIR", "worker", setup="workflow"),
    Row("repair pass: closed batches", "db.BATCH_REPAIR", "worker"),
    Row("repair pass: lock abandoned open batches", "db.BATCH_ABANDONED", "worker"),
    # Before a node's results are read: a parent whose row is gone fails the node.
    Row("worker: a node's parents still there", "db.PARENT_MISSING", "worker", setup="workflow"),
    Row("reaper: reclaim stale", "db.JOB_REAP_STALE", "worker"),
    # The ghost's keyed run keeps its slot, given back STALE_AFTER later (its worker
    # is gone) by the same statement of a later pass.
    Row(
        "reaper: reclaim a stale keyed run (its slot held)",
        "db.JOB_REAP_STALE",
        "worker",
        setup="keyed_ghost",
        env=KEYED_ENV,
    ),
    Row("reaper: forget stale workers", "db.WORKER_FORGET_STALE", "worker"),
    # A suspect (reclaimed from a lost worker) runs alone in a child process and kills
    # it: the worker charges the run (JOB_RETRY keeps it a suspect), then dead-letters
    # it at its second crash; the worker and the rest of the workload carry on.
    Row(
        "worker: charge a suspect's crash (it stays a suspect)",
        "db.JOB_RETRY",
        "worker",
        setup="suspect_crash",
    ),
    Row("pruner: delete a batch", "db.JOB_PRUNE_BATCH", "worker"),
    # The minute rollup (db/rollup.py): every worker's maintenance loop, one pass at a
    # time under the mark row's lock; the tables are emptied per cell, so the first pass
    # writes the mark row too.
    Row("pruner: delete a batch of events", "db.EVENT_PRUNE_BATCH", "worker"),
    Row("rollup: lock the mark", "db.ROLLUP_LOCK", "worker"),
    Row("rollup: write the mark row", "db.ROLLUP_MARK_INSERT", "worker"),
    Row("rollup: count finishes into minutes", "db.ROLLUP_MINUTES", "worker"),
    # The statistics pass (db/statistics.py): every worker's maintenance loop; the tables
    # are emptied per cell (TRUNCATE: never analysed), so the first pass with jobs in the
    # table runs ANALYZE (autovacuum off in that cell, so that it cannot analyse first).
    Row(
        "statistics: read the jobs table's growth",
        "db.JOB_STATISTICS_AGE",
        "worker",
        periodic=True,
    ),
    Row(
        "statistics: analyse the jobs table",
        "db.JOB_ANALYZE",
        "worker",
        setup="unanalysed",
        periodic=True,
    ),
    # The claim front's probe (claim/probe.py): every worker's maintenance loop, once
    # its claims have a bound (a claim that took fewer jobs than it asked for: more than
    # one slot); every 0.3 s here instead of 10 (tests/settings.py).
    Row(
        "claim front: probe before the bound, every queue",
        "claim.FRONT_PROBE_ALL",
        "worker",
        args=("--concurrency", "4"),
        env=PROBE_ENV,
        periodic=True,
    ),
    Row(
        "claim front: probe before the bound, one queue",
        "claim.FRONT_PROBE_QUEUES",
        "worker",
        args=("--queues", "default", "--concurrency", "4"),
        env=PROBE_ENV,
        periodic=True,
    ),
    # Once a probe has reported the priorities past the bound, the claims seek each
    # (queue, priority) from the bound (claim/plain.py: claim_levels). Named queues, so
    # an idle worker's polls claim too (every-queue workers skip a claim with no
    # pending queue).
    Row(
        "worker: claim by priority level",
        "claim.JOB_CLAIM_LEVELS",
        "worker",
        args=("--queues", "default", "--concurrency", "4"),
        env=PROBE_ENV,
        periodic=True,
    ),
    Row(
        "worker: claim known tasks by priority level",
        "claim.JOB_CLAIM_LEVELS_KNOWN",
        "worker",
        args=("--queues", "default", "--concurrency", "4"),
        setup="unknown",
        env=PROBE_ENV,
        periodic=True,
    ),
    # Durable jobs (db/durable.py): a job of the workload records a step, parks for
    # half a second, is woken by the wake pass and runs again, replaying its step.
    Row("worker: record a durable step", "db.STEP_RECORD", "worker", setup="durable"),
    Row("worker: park a durable run", "db.JOB_PARK", "worker", setup="durable"),
    Row(
        "wake pass: wake due waiting jobs",
        "db.JOB_WAKE_DUE",
        "worker",
        setup="durable",
        periodic=True,
    ),
    # Waits (durable/signals.py, durable/events.py): a job of the workload takes the
    # signal sent before it, then waits for a signal and two events until their timeouts.
    Row("worker: a signal wait's lock", "db.SIGNAL_LOCK", "worker", setup="waits"),
    Row("worker: take a signal for a wait", "db.SIGNAL_TAKE", "worker", setup="waits"),
    Row(
        "worker: a signal wait's park tries the job's signal lock",
        "db.SIGNAL_PARK_TRY",
        "worker",
        setup="waits",
    ),
    Row("worker: an event wait's lock", "db.EVENT_LOCK", "worker", setup="waits"),
    Row("worker: an event wait's look", "db.EVENT_LOOK", "worker", setup="waits"),
    Row(
        "worker: an event wait's look, no key",
        "db.EVENT_LOOK_NO_KEY",
        "worker",
        setup="waits",
    ),
    Row("cron ticker: enqueue a fire time", "db.JOB_INSERT", "cron"),
    Row("enqueue (retried once by the caller)", "db.JOB_INSERT", "driver", action="enqueue"),
    Row(
        "enqueue with a delay (retried once)",
        "db.JOB_INSERT_DELAYED",
        "driver",
        action="enqueue_delayed",
    ),
    Row(
        "enqueue unique_while (retried once)",
        "db.JOB_INSERT_FLOW",
        "driver",
        action="enqueue_unique",
    ),
    Row(
        "enqueue unique_while with a delay (retried once)",
        "db.JOB_INSERT_FLOW_DELAYED",
        "driver",
        action="enqueue_unique_delayed",
    ),
    Row(
        "enqueue debounced (retried once)",
        "db.JOB_DEBOUNCE",
        "driver",
        action="enqueue_debounced",
    ),
    Row("enqueue: existing key", "db.JOB_BY_KEY", "driver", action="enqueue_twice"),
    Row("enqueue_many: notify after COPY", "db.JOB_NOTIFY_DUE", "driver", action="enqueue_many"),
    # The COPY runs through the connection's execute_wrappers (job_insert.job_copy).
    Row(
        "enqueue_many: COPY (reply to COMMIT lost)",
        "copy:job",
        "driver",
        action="enqueue_many",
        at_commit=True,
    ),
    Row(
        "enqueue_many: 2nd of 3 COPY batches (reply to COMMIT lost)",
        "copy:job",
        "driver",
        action="enqueue_many_batches",
        skip=1,
        at_commit=True,
    ),
    # pause_queue / resume_queue of two queues in one call (queues.py; the management
    # commands and the queue admin's actions call these): ORM rows name a pattern.
    Row(
        "pause_queue: lock a queue row (SELECT FOR UPDATE)",
        "orm:SELECT queue*",
        "queue",
        action="pause",
        setup="rows",
        at_commit=True,
    ),
    Row(
        "pause_queue: create the 2nd queue row",
        "orm:INSERT queue*",
        "queue",
        action="pause",
        skip=1,
        at_commit=True,
    ),
    Row(
        "pause_queue: update the 2nd queue row",
        "orm:UPDATE queue*",
        "queue",
        action="pause",
        setup="rows",
        skip=1,
        at_commit=True,
    ),
    Row(
        "pause_queue: queue-change notify",
        "db.JOB_NOTIFY",
        "queue",
        action="pause",
        setup="rows",
        at_commit=True,
    ),
    Row(
        "resume_queue: update a queue row",
        "orm:UPDATE queue*",
        "queue",
        action="resume",
        at_commit=True,
    ),
    Row(
        "resume_queue: wake the 2nd queue's workers",
        "db.JOB_NOTIFY",
        "queue",
        action="resume",
        skip=2,
        at_commit=True,
    ),
    # The worker's LISTEN connection (worker/listener.py), failing over and over for a
    # while (until the cell heals it).
    Row("listener: LISTEN", "listener:LISTEN", "listener"),
    Row("listener: wait for notifications", "listener:wait", "listener"),
    Row("listener: keep-alive", "listener:keep-alive", "listener"),
    # The worker's heartbeat process (django_pgjobs/pulse.py): its own psycopg
    # connection, faulted through tests/faults/pulse_faults.py. It beats only while the
    # worker's thread is late: here a job holds the GIL past STALE_AFTER.
    Row("heartbeat process: heartbeat of in-flight jobs", "pulse:JOB_HEARTBEAT_PULSE", "pulse"),
    Row("heartbeat process: worker row refresh", "pulse:WORKER_UPSERT", "pulse"),
    # Fails resume_queue's first notify (pause_queue's is let through): a queue left
    # paused would leave the fresh job pending.
    Row(
        "resume_queue (retried once): queue-change notify",
        "db.JOB_NOTIFY",
        "driver",
        action="pause_resume",
        skip=1,
    ),
    Row("admin: cancel", "db.JOB_CANCEL", "driver", action="cancel_selected"),
    Row("admin: retry", "db.JOB_RETRY_NOW", "driver", action="retry_selected"),
    Row("admin: wake now", "db.JOB_WAKE_NOW", "driver", action="wake_selected"),
    Row(
        "admin: retry's lock on unique keys",
        "db.RETRY_KEY_LOCK",
        "driver",
        action="retry_selected",
        at_commit=True,
    ),
    Row(
        "admin: retry's lock on the parents",
        "db.RETRY_PARENT_LOCK",
        "driver",
        action="retry_selected",
        at_commit=True,
    ),
    # A workflow node retried after its retried parent (two admin posts): the child's
    # retry locks the parent, counts it, and waits for it (blocked).
    Row(
        "admin: retry a child after its parent, the lock on the parents",
        "db.RETRY_PARENT_LOCK",
        "driver",
        action="retry_child_after_parent",
        skip=1,
        at_commit=True,
    ),
    Row(
        "admin: retry a child after its parent",
        "db.JOB_RETRY_NOW",
        "driver",
        action="retry_child_after_parent",
        skip=1,
    ),
    Row("admin: cancel, every read", "*read", "driver", action="cancel_selected", times=0),
    Row("admin: retry, every read", "*read", "driver", action="retry_selected", times=0),
    Row("admin: wake now, every read", "*read", "driver", action="wake_selected", times=0),
    Row("cancel_jobs: cancel", "db.JOB_CANCEL", "driver", action="cancel_command"),
    Row(
        "cancel_jobs: cancel a running keyed job (its slot held)",
        "db.JOB_CANCEL",
        "held_cancel",
        action="cancel_command",
        env=KEYED_ENV,
    ),
    Row("cancel_jobs: every read", "*read", "driver", action="cancel_command", times=0),
    Row("retry_jobs: retry", "db.JOB_RETRY_NOW", "driver", action="retry_command"),
    Row("retry_jobs: every read", "*read", "driver", action="retry_command", times=0),
    Row(
        "enqueue a workflow: its row and ids (retried once)",
        "db.WF_CREATE",
        "driver",
        action="enqueue_workflow",
    ),
    Row(
        "enqueue a workflow: nodes and edges (retried once)",
        "db.WF_INSERT_NODES",
        "driver",
        action="enqueue_workflow",
    ),
    Row("batch: open (one attempt)", "db.WF_CREATE", "driver", action="batch"),
    # The callbacks are written when the block opens, in the open's transaction: a
    # lost COMMIT reply leaves an open batch nobody closes, which the repair pass of
    # the clean worker closes (PGJOBS_TEST_BATCH_ABANDONED_AFTER in these cells).
    Row(
        "batch: write the callbacks at open (one attempt)",
        "db.WF_INSERT_NODES",
        "driver",
        action="batch",
        at_commit=True,
    ),
    Row(
        "batch: store the callbacks at open (one attempt)",
        "db.BATCH_OPEN",
        "driver",
        action="batch",
        at_commit=True,
    ),
    Row(
        "batch: close (closed again once)",
        "db.BATCH_CLOSE",
        "driver",
        action="batch",
        at_commit=True,
    ),
    Row(
        "batch: its state, at close (closed again once)",
        "db.BATCH_STATE",
        "driver",
        action="batch",
        at_commit=True,
    ),
    Row(
        "batch: fire an empty batch at close (closed again once)",
        "db.BATCH_FIRE",
        "driver",
        action="batch_empty",
        at_commit=True,
    ),
    Row(
        "cancel a workflow: its jobs (retried once)",
        "db.WF_CANCEL",
        "driver",
        action="cancel_workflow",
        at_commit=True,
    ),
    Row(
        "cancel a workflow: mark it (retried once)",
        "db.WF_MARK_CANCELLED",
        "driver",
        action="cancel_workflow",
        at_commit=True,
    ),
    Row(
        "workflow admin: retry failed nodes",
        "db.JOB_RETRY_NOW",
        "driver",
        action="retry_failed_workflow",
    ),
    Row(
        "workflow admin: retry failed nodes, every read",
        "*read",
        "driver",
        action="retry_failed_workflow",
        times=0,
    ),
    Row("run_jobs: claim", "claim.JOB_CLAIM_ALL_KNOWN", "driver", action="run_jobs"),
    Row("run_jobs: complete", "db.JOB_COMPLETE_MANY_REDO", "driver", action="run_jobs"),
    Row("run_jobs: retry", "db.JOB_RETRY", "driver", action="run_jobs"),
    Row("run_jobs: dead-letter", "db.JOB_DEAD", "driver", action="run_jobs"),
    Row("run_jobs: every read", "*read", "driver", action="run_jobs", times=0),
    Row(
        "Tasks backend: enqueue (retried once)",
        "db.JOB_INSERT",
        "driver",
        action="tasks_enqueue",
        django6=True,
    ),
    Row(
        "Tasks backend: get_result, every read",
        "*read",
        "driver",
        action="tasks_get_result",
        times=0,
        django6=True,
    ),
    # Signals and events (durable/signals.py, durable/events.py), in the caller's
    # transaction: a lost COMMIT reply, then the caller's retry (the same key).
    Row(
        "send_signal: the job's signal lock, shared (retried once, then delivered again)",
        "db.SIGNAL_LOCK_SHARED",
        "driver",
        action="send_signal",
        at_commit=True,
    ),
    Row(
        "send_signal (retried once, then delivered again)",
        "db.SIGNAL_SEND",
        "driver",
        action="send_signal",
        at_commit=True,
    ),
    Row(
        "send_signal: the signal holding a key, for the second delivery (retried once)",
        "db.SIGNAL_BY_KEY",
        "driver",
        action="send_signal",
    ),
    Row(
        "emit_event: the shared lock on (name, key) (retried once)",
        "db.EVENT_LOCK_SHARED",
        "driver",
        action="emit_event",
        at_commit=True,
    ),
    Row(
        "emit_event: store the event (retried once)",
        "db.EVENT_INSERT",
        "driver",
        action="emit_event",
        at_commit=True,
    ),
    Row("admin pages: every read", "*read", "driver", action="admin_pages", times=0),
    Row("jobs_status: every read", "*read", "driver", action="jobs_status", times=0),
    Row("prune --dry-run: every read", "*read", "driver", action="prune_dry_run", times=0),
)

#: Statements of db/ no Django connection issues (DDL of migrations, unused, or run by
#: the heartbeat process only, whose rows name them pulse:...).
NOT_RUNTIME = {
    "claim.JOB_CLAIM_ALL": "claim.claim(queues=None) without a task filter; a worker of every"
    " queue claims by name from claim.PENDING_QUEUES instead (Claimant)",
    "db.ENQUEUE_FUNCTION": "migration DDL (0002), runs once at migrate",
    "db.JOB_ADVANCE_WAITING": "testing.run_jobs(advance=) only: a test's own clock, in the"
    " test's transaction (tests/db/test_durable_steps.py)",
    "db.ENQUEUE_FUNCTION_DROP": "migration DDL (reverse of 0002)",
    "db.JOB_HEARTBEAT_PULSE": "run by the heartbeat process alone (pulse.py: psycopg without"
    " Django), only while its worker is late; faulted there as pulse:JOB_HEARTBEAT_PULSE (rows"
    " 'heartbeat process: ...', tests/faults/pulse_faults.py)",
}
