"""``manage.py demo``: migrate, place a batch of orders, work them off, report.

Runs the worker in this process, in a background thread, as a series of *burst*
workers: a burst worker exits once nothing is due, but a job that failed waits
out its backoff with ``run_at`` in the future, so the demo starts another burst
at that ``run_at`` — until every job of the batch is finished or the deadline
passes. The main thread draws the progress bar and handles Ctrl-C.

Every run enqueues a fresh batch and reports only that batch's jobs, so it can
be run again and again on the same database.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError, connections
from django.db.models import Min
from django.utils import timezone

from django_pgjobs.models import Job
from django_pgjobs.states import FINISHED, JobStatus
from django_pgjobs.worker import Worker
from shop.jobs import export_orders_to_crm
from shop.models import CARD_DECLINED, CARD_OK, CARD_TIMES_OUT_ONCE, Order, Product
from shop.orders import OutOfStock, place_order

BAR_WIDTH = 30


def card_for(i: int) -> str:
    """Every 10th order is declined, every 5th (offset 2) times out once, the rest pay."""
    if i % 10 == 9:
        return CARD_DECLINED
    if i % 5 == 2:
        return CARD_TIMES_OUT_ONCE
    return CARD_OK


def batch_counts(ids: list[int]) -> dict[str, int]:
    """completed / dead / unfinished / retried (ran more than once) for these jobs."""
    counts: Counter[str] = Counter()
    for status, attempts in Job.objects.filter(id__in=ids).values_list("status", "attempts"):
        counts[status if status in FINISHED else "unfinished"] += 1
        if attempts > 1:
            counts["retried"] += 1
    return {key: counts[key] for key in ("completed", "dead", "cancelled", "unfinished", "retried")}


def render_bar(counts: dict[str, int], total: int, elapsed: float) -> str:
    done = total - counts["unfinished"]
    filled = BAR_WIDTH * done // total if total else BAR_WIDTH
    return (
        f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done:>3}/{total} finished  "
        f"completed {counts['completed']}  retried {counts['retried']}  "
        f"dead {counts['dead']}  {elapsed:4.1f}s"
    )


class BurstRunner(threading.Thread):
    """Runs burst workers until the batch is finished, ``stop()`` is called or time is up."""

    def __init__(self, ids: list[int], *, concurrency: int, deadline: float):
        super().__init__(name="demo-worker", daemon=True)
        self.ids = ids
        self.concurrency = concurrency
        self.deadline = deadline
        self.bursts = 0
        self.interrupted = False
        self.error: BaseException | None = None
        self._stop_requested = threading.Event()
        self._worker: Worker | None = None

    def stop(self) -> None:
        self.interrupted = True
        self._stop_requested.set()
        if self._worker is not None:
            self._worker.request_stop()

    def run(self) -> None:
        try:
            while not self._stop_requested.is_set() and time.monotonic() < self.deadline:
                self._worker = Worker(
                    burst=True,
                    concurrency=self.concurrency,
                    poll_interval=0.1,
                    listen=False,  # a burst never idles, so LISTEN buys nothing
                    maintenance=False,  # reaper/pruner/cron belong to long-lived runjobs
                )
                if self._stop_requested.is_set():  # stop() raced the assignment above
                    self._worker.request_stop()
                self._worker.run()
                self.bursts += 1
                unfinished = Job.objects.filter(id__in=self.ids).exclude(status__in=FINISHED)
                next_run_at = unfinished.aggregate(at=Min("run_at"))["at"]
                if next_run_at is None:
                    return  # the whole batch is finished
                # Nothing is due now: the rest wait out their backoff (or run elsewhere).
                wait = (next_run_at - timezone.now()).total_seconds()
                self._stop_requested.wait(min(max(wait, 0.02), 1.0))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc
        finally:
            connections.close_all()


class Command(BaseCommand):
    help = (
        "Migrate, place a batch of orders (jobs that succeed, retry and dead-letter), "
        "run a worker in this process with a progress bar, and report the batch."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--orders",
            type=int,
            default=20,
            help="orders to place (each enqueues 2 jobs; default 20)",
        )
        parser.add_argument("--concurrency", type=int, default=4, help="worker threads (default 4)")
        parser.add_argument(
            "--timeout",
            type=float,
            default=45.0,
            help="give up after this many seconds of work (default 45)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        orders, concurrency, timeout = options["orders"], options["concurrency"], options["timeout"]
        if not 1 <= orders <= 10_000:
            raise CommandError(f"--orders must be between 1 and 10000, got {orders}")
        if not 1 <= concurrency <= 64:
            raise CommandError(f"--concurrency must be between 1 and 64, got {concurrency}")
        if not timeout > 0:
            raise CommandError(f"--timeout must be a positive number of seconds, got {timeout}")
        if options["verbosity"] < 2:
            # Each retry and dead letter is logged; the progress bar and report say it all.
            logging.getLogger("django_pgjobs").setLevel(logging.CRITICAL)
        started = time.monotonic()

        self.step(f"1. Migrating the database ({self.describe_database()})")
        self.ensure_database()
        call_command("migrate", interactive=False, verbosity=0)

        self.step(
            f"2. Placing {orders} orders; each enqueues capture_payment and "
            "send_invoice_email in the order's transaction"
        )
        ids = self.place_batch(orders)
        self.show_rollback()

        self.step(
            f"3. Working off the batch's {len(ids)} jobs with an in-process burst worker "
            f"(concurrency {concurrency})"
        )
        earlier = Job.objects.due().exclude(id__in=ids).count()
        if earlier:
            self.stdout.write(
                f"   note: {earlier} due jobs from earlier (interrupted?) runs or the "
                "web shop will be run too, but not counted below"
            )
        runner = self.work(ids, concurrency=concurrency, timeout=timeout)

        self.step("4. Results for this batch")
        unfinished = self.report(ids)
        self.stdout.write(
            f"Done in {time.monotonic() - started:.1f}s "
            f"({runner.bursts} burst{'s' if runner.bursts != 1 else ''})."
        )
        if runner.error is not None:
            raise CommandError(f"the worker failed: {runner.error!r}")
        if unfinished:
            why = "interrupted" if runner.interrupted else f"timed out after {timeout:g}s"
            raise CommandError(
                f"{why}: {unfinished} jobs of this batch are unfinished; "
                "`manage.py runjobs` (or the next demo) will run them"
            )

    # ------------------------------------------------------------------ steps

    def step(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(text))

    def describe_database(self) -> str:
        settings = connections["default"].settings_dict
        host = settings["OPTIONS"].get("host") or settings["HOST"] or "local socket"
        where = "embedded PostgreSQL in .pgdata/" if str(host).endswith(".pgdata") else host
        return f"database {settings['NAME']!r} on {where}"

    def ensure_database(self) -> None:
        """Create the database named in DATABASE_URL when the server lacks it (first run)."""
        connection = connections["default"]
        try:
            connection.ensure_connection()
            return
        except OperationalError as exc:
            if "does not exist" not in str(exc):
                raise CommandError(f"cannot connect to the database: {exc}") from None
        name = connection.settings_dict["NAME"]
        with connection._nodb_cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(name)}")
        self.stdout.write(f"   created database {name!r}")

    def place_batch(self, orders: int) -> list[int]:
        """Place the orders (one transaction each) plus one CRM export; return the job ids."""
        products = list(Product.objects.order_by("sku").filter(sku__in=["LAMP", "MUG"]))
        if not products:
            raise CommandError("the shop has no LAMP/MUG products; did the migration run?")
        # Keep the demo repeatable: restock what it is about to sell.
        Product.objects.filter(pk__in=[p.pk for p in products], stock__lt=orders).update(
            stock=orders * 10
        )
        placed = [
            place_order(
                email=f"customer{i}@example.com",
                product=products[i % len(products)],
                card_last4=card_for(i),
            )
            for i in range(orders)
        ]
        order_ids = [o.pk for o in placed]
        crm = export_orders_to_crm.enqueue(order_ids)
        ids = list(
            Job.objects.filter(
                task__in=["shop.jobs.capture_payment", "shop.jobs.send_invoice_email"],
                args__0__in=order_ids,
            ).values_list("id", flat=True)
        )
        ids.append(crm.id)
        declined = sum(card_for(i) == CARD_DECLINED for i in range(orders))
        flaky = sum(card_for(i) == CARD_TIMES_OUT_ONCE for i in range(orders))
        self.stdout.write(
            f"   orders #{order_ids[0]} to #{order_ids[-1]}: {orders - declined - flaky} pay at once, "
            f"{flaky} hit a gateway timeout first (retried), {declined} are declined "
            "(dead-lettered)\n   plus 1 export to a legacy CRM that is down "
            "(retried, then dead-lettered)"
        )
        return ids

    def show_rollback(self) -> None:
        """Try to oversell the teapot: the order AND its jobs roll back together."""
        teapot = Product.objects.filter(sku="TEAPOT").first()
        if teapot is None:
            return
        jobs_before, orders_before = Job.objects.count(), Order.objects.count()
        try:
            place_order(email="greedy@example.com", product=teapot, quantity=teapot.stock + 1)
        except OutOfStock as exc:
            self.stdout.write(
                f"   then an oversold order ({exc}) rolled back with its 2 jobs: "
                f"orders {orders_before} -> {Order.objects.count()}, "
                f"jobs {jobs_before} -> {Job.objects.count()}"
            )

    def work(self, ids: list[int], *, concurrency: int, timeout: float) -> BurstRunner:
        runner = BurstRunner(ids, concurrency=concurrency, deadline=time.monotonic() + timeout)
        started = time.monotonic()
        live = self.stdout.isatty() if hasattr(self.stdout, "isatty") else False
        runner.start()
        try:
            while runner.is_alive():
                runner.join(0.1)
                if live:
                    bar = render_bar(batch_counts(ids), len(ids), time.monotonic() - started)
                    self.stdout.write("\r" + bar, ending="")
                    self.stdout.flush()
        except KeyboardInterrupt:
            self.stdout.write("\ninterrupted: letting in-flight jobs finish (Ctrl-C again to quit)")
            runner.stop()
            runner.join()
        bar = render_bar(batch_counts(ids), len(ids), time.monotonic() - started)
        self.stdout.write(("\r" if live else "") + bar)
        return runner

    def report(self, ids: list[int]) -> int:
        counts = batch_counts(ids)
        jobs = Job.objects.filter(id__in=ids)
        retried_ok = jobs.filter(status=JobStatus.COMPLETED, attempts__gt=1).count()
        self.stdout.write(
            f"   jobs       {len(ids):>3}\n"
            f"   completed  {counts['completed']:>3}   ({retried_ok} of them after a retry)\n"
            f"   retried    {counts['retried']:>3}   (failed at least once, then ran again)\n"
            f"   dead       {counts['dead']:>3}   (dead-lettered: in the admin, filter "
            'Jobs by status "dead" to retry them)'
        )
        if counts["unfinished"]:
            self.stdout.write(f"   unfinished {counts['unfinished']:>3}")
        for job in jobs.filter(status=JobStatus.DEAD).order_by("id"):
            self.stdout.write(
                f"     dead #{job.id} {job.task} after {job.attempts}/"
                f"{job.max_attempts} attempts: {job.last_error}"
            )
        paid = Order.objects.filter(pk__in=self.order_ids(ids), paid_at__isnull=False).count()
        invoiced = Order.objects.filter(
            pk__in=self.order_ids(ids), invoiced_at__isnull=False
        ).count()
        self.stdout.write(f"   orders paid {paid}, invoice emails sent {invoiced}")
        sys.stdout.flush()
        return counts["unfinished"]

    @staticmethod
    def order_ids(ids: list[int]) -> set[int]:
        return {
            args[0]
            for args in Job.objects.filter(
                id__in=ids, task="shop.jobs.send_invoice_email"
            ).values_list("args", flat=True)
        }
