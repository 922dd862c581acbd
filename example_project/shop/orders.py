"""Placing an order: the business write and its jobs commit together, or not at all."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import F

from .jobs import capture_payment, send_invoice_email
from .models import CARD_OK, Order, Product


class OutOfStock(Exception):
    """Raised after the whole order transaction — jobs included — was rolled back."""


def place_order(
    *, email: str, product: Product, quantity: int = 1, card_last4: str = CARD_OK
) -> Order:
    """Create the order, enqueue its payment and invoice email, take the stock.

    The job rows are ordinary INSERTs in this transaction (no ``on_commit``): if
    anything below fails, no worker ever sees a job for an order that does not
    exist. The stock update runs last on purpose, to show exactly that — an
    oversold product violates ``shop_stock_not_negative`` and the jobs vanish with
    the order.
    """
    try:
        with transaction.atomic():
            order = Order.objects.create(
                email=email, product=product, quantity=quantity, card_last4=card_last4
            )
            capture_payment.enqueue(order.id)
            send_invoice_email.using(idempotency_key=f"invoice:{order.id}").enqueue(order.id)
            Product.objects.filter(pk=product.pk).update(stock=F("stock") - quantity)
    except IntegrityError as exc:
        if "shop_stock_not_negative" not in str(exc):
            raise
        raise OutOfStock(f"not enough {product.name} in stock for {quantity}") from None
    return order
