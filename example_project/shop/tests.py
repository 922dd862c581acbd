"""The shop's own tests: ``python manage.py test shop`` (a real PostgreSQL, like the demo)."""

from __future__ import annotations

import re

from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgjobs.models import Job
from django_pgjobs.testing import run_jobs

from .jobs import export_orders_to_crm
from .models import CARD_DECLINED, CARD_OK, CARD_TIMES_OUT_ONCE, InvoiceEmail, Order, Product


class OrderViewTests(TestCase):
    def setUp(self) -> None:
        self.lamp = Product.objects.get(sku="LAMP")
        self.teapot = Product.objects.get(sku="TEAPOT")

    def post(self, product: Product, quantity: int = 1, card: str = CARD_OK):
        return self.client.post(
            reverse("shop:orders"),
            {
                "email": "ada@example.com",
                "product": product.pk,
                "quantity": quantity,
                "card_last4": card,
            },
        )

    def test_an_order_and_its_jobs_are_created_together(self) -> None:
        response = self.post(self.lamp, quantity=2)

        self.assertRedirects(response, reverse("shop:orders"))
        order = Order.objects.get()
        jobs = {job.task: job for job in Job.objects.all()}
        self.assertEqual(set(jobs), {"shop.jobs.capture_payment", "shop.jobs.send_invoice_email"})
        self.assertEqual(jobs["shop.jobs.send_invoice_email"].args, [order.pk])
        self.assertEqual(
            jobs["shop.jobs.send_invoice_email"].idempotency_key, f"invoice:{order.pk}"
        )
        self.assertEqual(jobs["shop.jobs.capture_payment"].queue, "payments")
        self.lamp.refresh_from_db()
        self.assertEqual(self.lamp.stock, 48)

    def test_a_rolled_back_order_leaves_no_job_behind(self) -> None:
        stock = self.teapot.stock
        with CaptureQueriesContext(connection) as queries:
            response = self.post(self.teapot, quantity=stock + 1)

        self.assertEqual(response.status_code, 200)
        self.assertContains(response, "no job was enqueued")
        # The job INSERTs did run, inside the order's transaction...
        inserts = [
            q["sql"]
            for q in queries.captured_queries
            if re.search(r'INSERT INTO "?django_pgjobs_job"? ', q["sql"])
        ]
        self.assertEqual(len(inserts), 2)
        # ...and the stock constraint rolled them back with the order.
        self.assertFalse(Order.objects.exists())
        self.assertFalse(Job.objects.exists())
        self.teapot.refresh_from_db()
        self.assertEqual(self.teapot.stock, stock)

    def test_the_page_lists_orders_with_their_jobs(self) -> None:
        self.post(self.lamp)
        export_orders_to_crm.enqueue([Order.objects.get().pk])  # not an order's own job
        response = self.client.get(reverse("shop:orders"))
        self.assertContains(response, "send_invoice_email: pending")
        self.assertContains(response, "capture_payment: pending")


class JobTests(TestCase):
    def place(self, card: str) -> Order:
        self.client.post(
            reverse("shop:orders"),
            {
                "email": "ada@example.com",
                "product": Product.objects.get(sku="MUG").pk,
                "quantity": 1,
                "card_last4": card,
            },
        )
        return Order.objects.latest("id")

    def test_payment_and_invoice_complete(self) -> None:
        order = self.place(CARD_OK)
        ran = run_jobs()
        self.assertEqual(sorted(r.status for r in ran), ["completed", "completed"])
        order.refresh_from_db()
        self.assertIsNotNone(order.paid_at)
        self.assertIsNotNone(order.invoiced_at)
        self.assertEqual(InvoiceEmail.objects.get().to, "ada@example.com")

    def test_a_gateway_timeout_is_retried(self) -> None:
        self.place(CARD_TIMES_OUT_ONCE)
        run_jobs(queues=["payments"])
        job = Job.objects.get(task="shop.jobs.capture_payment")
        self.assertEqual((job.status, job.attempts), ("pending", 1))
        self.assertIn("GatewayTimeout", job.last_error)

    def test_a_declined_card_is_dead_lettered_at_once(self) -> None:
        self.place(CARD_DECLINED)
        run_jobs(queues=["payments"])
        job = Job.objects.get(task="shop.jobs.capture_payment")
        self.assertEqual((job.status, job.attempts), ("dead", 1))
        self.assertIn("CardDeclined", job.last_error)
