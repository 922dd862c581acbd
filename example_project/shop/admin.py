"""The shop's models in the admin (the jobs themselves are under "Jobs", from django_pgjobs)."""

from django.contrib import admin

from .models import InvoiceEmail, Order, Product


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    list_display = ["sku", "name", "price_cents", "stock"]


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "email",
        "product",
        "quantity",
        "card_last4",
        "created_at",
        "paid_at",
        "invoiced_at",
    ]
    list_filter = ["card_last4", "product"]


@admin.register(InvoiceEmail)
class InvoiceEmailAdmin(admin.ModelAdmin):
    list_display = ["order", "to", "subject", "sent_at"]
