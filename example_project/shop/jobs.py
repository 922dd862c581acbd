"""The shop's jobs (autodiscovered: django_pgjobs imports every app's ``jobs`` module).

Three behaviours worth watching in the demo and the admin:

* ``send_invoice_email`` always succeeds, and is ``atomic``: the "sent" row and the
  job's completion commit together, so a retried or reclaimed job never emails twice;
* ``capture_payment`` talks to a fake gateway that times out once for card …0119
  (the job is retried after a short backoff, then succeeds) and declines card …0002
  (``discard_on``: dead-lettered at once, retrying cannot help);
* ``export_orders_to_crm`` calls a legacy CRM that is down: it fails every attempt
  and is dead-lettered after ``max_attempts``.
"""

from __future__ import annotations

import random
import time

from django.utils import timezone

from django_pgjobs import JobContext, job

from .models import CARD_DECLINED, CARD_TIMES_OUT_ONCE, InvoiceEmail, Order


class GatewayTimeout(Exception):
    """The payment gateway did not answer in time: worth another try."""


class CardDeclined(Exception):
    """The bank said no: retrying will not change its mind."""


def network_call() -> None:
    """Simulated latency of a third-party API, so the demo's progress bar has something to show."""
    time.sleep(random.uniform(0.05, 0.2))


@job(
    queue="payments",
    priority=10,
    max_attempts=4,
    retry_on=(GatewayTimeout,),
    discard_on=(CardDeclined,),
    takes_context=True,
)
def capture_payment(context: JobContext, order_id: int) -> dict[str, object]:
    order = Order.objects.get(pk=order_id)
    if order.paid_at is not None:  # at-least-once: an earlier attempt may have got here
        return {"order": order_id, "already_paid": True}
    network_call()
    if order.card_last4 == CARD_DECLINED:
        raise CardDeclined(f"card ending {order.card_last4} declined for order #{order_id}")
    if order.card_last4 == CARD_TIMES_OUT_ONCE and context.attempt == 1:
        raise GatewayTimeout(f"payment gateway timed out for order #{order_id} (simulated)")
    Order.objects.filter(pk=order_id, paid_at__isnull=True).update(paid_at=timezone.now())
    return {"order": order_id, "charged_cents": order.total_cents, "attempt": context.attempt}


@job(queue="emails", atomic=True)
def send_invoice_email(order_id: int) -> dict[str, object]:
    order = Order.objects.select_related("product").get(pk=order_id)
    network_call()
    InvoiceEmail.objects.create(
        order=order,
        to=order.email,
        subject=f"Your invoice for order #{order.pk}",
        body=f"{order.quantity} x {order.product.name}: {order.total_cents / 100:.2f} EUR",
    )
    Order.objects.filter(pk=order_id).update(invoiced_at=timezone.now())
    return {"order": order_id, "to": order.email}


@job(max_attempts=3)
def export_orders_to_crm(order_ids: list[int]) -> int:
    network_call()
    raise ConnectionRefusedError(
        f"legacy CRM at crm.internal:8080 refused the connection ({len(order_ids)} orders "
        "not exported; simulated outage)"
    )
