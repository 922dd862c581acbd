"""A deliberately tiny shop: products with stock, orders, and the invoice emails "sent"."""

from __future__ import annotations

from django.db import models

# Test card numbers, named after the payment gateways' conventions. The fake gateway
# in jobs.py behaves by the last four digits.
CARD_OK = "4242"
CARD_TIMES_OUT_ONCE = "0119"  # the gateway times out on the first try: the job retries
CARD_DECLINED = "0002"  # declined: retrying cannot help, the job is dead-lettered
CARD_CHOICES = [
    (CARD_OK, "…4242 (pays)"),
    (CARD_TIMES_OUT_ONCE, "…0119 (gateway times out once, then pays)"),
    (CARD_DECLINED, "…0002 (declined)"),
]


class Product(models.Model):
    sku = models.CharField(max_length=32, unique=True)
    name = models.CharField(max_length=100)
    price_cents = models.PositiveIntegerField()
    stock = models.IntegerField(default=0)

    class Meta:
        constraints = [
            # The last line of defence against overselling: two buyers racing for the
            # last lamp cannot both win, and the loser's whole transaction (order AND
            # invoice job) rolls back.
            models.CheckConstraint(
                condition=models.Q(stock__gte=0), name="shop_stock_not_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.sku})"


class Order(models.Model):
    email = models.EmailField()
    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="orders")
    quantity = models.PositiveIntegerField(default=1)
    card_last4 = models.CharField(max_length=4, choices=CARD_CHOICES, default=CARD_OK)
    created_at = models.DateTimeField(auto_now_add=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    invoiced_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"order #{self.pk}"

    @property
    def total_cents(self) -> int:
        return self.product.price_cents * self.quantity


class InvoiceEmail(models.Model):
    """What ``send_invoice_email`` "sent" (a real shop would call its mail provider)."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="invoice_email")
    to = models.EmailField()
    subject = models.CharField(max_length=200)
    body = models.TextField()
    sent_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.subject
