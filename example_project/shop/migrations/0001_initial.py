"""The shop's tables, and a few products to sell."""

import django.db.models.deletion
from django.db import migrations, models

CARDS = [
    ("4242", "…4242 (pays)"),
    ("0119", "…0119 (gateway times out once, then pays)"),
    ("0002", "…0002 (declined)"),
]

PRODUCTS = [
    ("LAMP", "Desk lamp", 3900, 50),
    ("MUG", "Enamel mug", 1200, 200),
    ("TEAPOT", "Cast-iron teapot", 5400, 3),
]


def add_products(apps, schema_editor):
    Product = apps.get_model("shop", "Product")
    for sku, name, price_cents, stock in PRODUCTS:
        Product.objects.get_or_create(
            sku=sku, defaults={"name": name, "price_cents": price_cents, "stock": stock}
        )


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Product",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("sku", models.CharField(max_length=32, unique=True)),
                ("name", models.CharField(max_length=100)),
                ("price_cents", models.PositiveIntegerField()),
                ("stock", models.IntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("stock__gte", 0)), name="shop_stock_not_negative"
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="Order",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("email", models.EmailField(max_length=254)),
                ("quantity", models.PositiveIntegerField(default=1)),
                ("card_last4", models.CharField(choices=CARDS, default="4242", max_length=4)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("paid_at", models.DateTimeField(blank=True, null=True)),
                ("invoiced_at", models.DateTimeField(blank=True, null=True)),
                (
                    "product",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="orders",
                        to="shop.product",
                    ),
                ),
            ],
            options={"ordering": ["-id"]},
        ),
        migrations.CreateModel(
            name="InvoiceEmail",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("to", models.EmailField(max_length=254)),
                ("subject", models.CharField(max_length=200)),
                ("body", models.TextField()),
                ("sent_at", models.DateTimeField(auto_now_add=True)),
                (
                    "order",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="invoice_email",
                        to="shop.order",
                    ),
                ),
            ],
        ),
        migrations.RunPython(add_products, migrations.RunPython.noop),
    ]
