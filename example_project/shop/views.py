"""One page: place an order (which enqueues its jobs atomically) and watch them finish."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from django_pgjobs.models import Job

from .jobs import capture_payment, send_invoice_email
from .models import CARD_CHOICES, CARD_OK, Order, Product
from .orders import OutOfStock, place_order


class OrderForm(forms.Form):
    email = forms.EmailField(initial="ada@example.com")
    product = forms.ModelChoiceField(queryset=Product.objects.order_by("sku"), empty_label=None)
    quantity = forms.IntegerField(min_value=1, max_value=1000, initial=1)
    card_last4 = forms.ChoiceField(choices=CARD_CHOICES, initial=CARD_OK, label="Card")


def order_view(request: HttpRequest) -> HttpResponse:
    """GET: the form and the latest orders. POST: place an order, then redirect."""
    form = OrderForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            order = place_order(**form.cleaned_data)
        except OutOfStock as exc:
            form.add_error("quantity", f"{exc}: nothing was saved and no job was enqueued.")
        else:
            messages.success(
                request,
                f"Order #{order.pk} placed; its payment and invoice "
                "email are queued. Reload to watch them finish.",
            )
            return redirect("shop:orders")
    orders = list(Order.objects.select_related("product")[:20])
    jobs_by_order: dict[int, list[Job]] = {order.pk: [] for order in orders}
    order_jobs = Job.objects.filter(
        task__in=[capture_payment.name, send_invoice_email.name], args__0__in=list(jobs_by_order)
    )
    for job in order_jobs.order_by("id"):
        jobs_by_order[job.args[0]].append(job)
    rows = [(order, jobs_by_order[order.pk]) for order in orders]
    products = Product.objects.order_by("sku")
    return render(request, "shop/orders.html", {"form": form, "rows": rows, "products": products})
