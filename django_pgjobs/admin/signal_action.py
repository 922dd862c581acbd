"""The job list's "Send a signal" action: a form (the signal's name, a JSON payload,
an optional idempotency key) for the ticked jobs, then ``send_signal`` to each, in a
transaction of its own, so a finished job is named and skipped without undoing the
others. The same call as code makes: a job waiting for that name wakes at once."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from django_pgjobs.admin.job_list import is_job_id
from django_pgjobs.durable.payloads import check_name, payload_text
from django_pgjobs.durable.signals import send_signal
from django_pgjobs.exceptions import JobFinished, UnknownJob
from django_pgjobs.models import Job
from django_pgjobs.support.validation import check_key

#: Jobs one send may name (a signal is for a job, not for a crowd: use an event).
MOST = 100


class SignalForm(forms.Form):
    name = forms.CharField(max_length=255, help_text="What the job's wait_for_signal names.")
    payload = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60}),
        help_text="JSON (empty: null).",
    )
    idempotency_key = forms.CharField(
        required=False, max_length=255, help_text="A second send of this key is a no-op."
    )

    def clean_name(self) -> str:
        try:
            return check_name(self.cleaned_data["name"], "signal")
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_payload(self) -> Any:
        text = self.cleaned_data["payload"].strip()
        if not text:
            return None
        try:
            value = json.loads(text)
            payload_text(value, "signal")
        except (ValueError, TypeError) as exc:
            raise forms.ValidationError(f"not a payload: {exc}") from None
        return value

    def clean_idempotency_key(self) -> str | None:
        try:
            return check_key(self.cleaned_data["idempotency_key"] or None, "idempotency_key")
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.action(description="Send a signal (a waiting job wakes)", permissions=["change"])
def send_signal_action(
    modeladmin: admin.ModelAdmin[Job], request: HttpRequest, queryset: QuerySet[Job]
) -> TemplateResponse | None:
    ticked = [int(v) for v in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME) if is_job_id(v)]
    if request.POST.get("select_across") in ("1", "on", "true", "True"):
        ticked = list(queryset.order_by("-id").values_list("id", flat=True)[: MOST + 1])
    if len(ticked) > MOST:
        modeladmin.message_user(
            request,
            f"A signal goes to at most {MOST} jobs at once; for more, emit an event.",
            messages.ERROR,
        )
        return None
    form = SignalForm(request.POST if "send" in request.POST else None)
    if "send" not in request.POST or not form.is_valid():
        context = {
            **modeladmin.admin_site.each_context(request),
            "opts": modeladmin.model._meta,
            "form": form,
            "ids": ticked,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "title": "Send a signal",
        }
        return TemplateResponse(request, "admin/django_pgjobs/job/send_signal.html", context)
    sent, refused = [], []
    for job_id in ticked:
        try:
            with transaction.atomic(using=queryset.db):
                send_signal(
                    job_id,
                    form.cleaned_data["name"],
                    form.cleaned_data["payload"],
                    form.cleaned_data["idempotency_key"],
                    using=queryset.db,
                )
            sent.append(job_id)
        except (JobFinished, UnknownJob) as exc:
            refused.append(f"#{job_id}: {exc}")
    text = f"Sent signal {form.cleaned_data['name']!r} to {len(sent)} job(s)"
    if refused:
        text += f"; refused {len(refused)} ({'; '.join(refused[:20])})"
    modeladmin.message_user(request, text + ".", messages.WARNING if refused else messages.SUCCESS)
    return None
