"""The fault matrix's client process: one action per run, with the injector of
``$PGJOBS_FAULT_PLAN`` installed (tests/settings.py does that).

``python -m tests.faults.driver ACTION [JSON]`` prints one JSON line: ``{"ok": bool,
"error": str | None, ...}``. Actions are what an application or an operator does:
enqueue (with an idempotency key, retried once after an error as a caller should;
also a ``unique_while`` job, through JOB_INSERT_FLOW, and a debounced one, through
JOB_DEBOUNCE),
enqueue_many (``batch``: rows per COPY), pause/resume a queue (``pause_resume``:
both, each retried once; ``pause`` / ``resume``: one attempt), admin cancel / retry / pages, jobs_status, prune --dry-run,
``testing.run_jobs``; ``send_signal`` (delivered twice with one key) and ``emit_event``,
each retried once; workflows: enqueue a chain (retried once), a batch with one member
(``batch``) or none (``batch_empty``: its close fires it), each closed again once
after an error, and cancelling a workflow (retried once).
"""

from __future__ import annotations

import io
import json
import sys
from typing import Any


def _admin_client() -> Any:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user_model = get_user_model()
    user = user_model.objects.filter(username="fault-admin").first()
    if user is None:
        user = user_model.objects.create_superuser("fault-admin", "a@example.com", "pw")
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def _admin_action(action: str, ids: list[int]) -> dict[str, Any]:
    client = _admin_client()
    response = client.post(
        "/admin/django_pgjobs/job/",
        {"action": action, "_selected_action": [str(i) for i in ids], "index": "0"},
    )
    return {"ok": response.status_code in (200, 302), "status": response.status_code}


def _retry_child_after_parent() -> dict[str, Any]:
    """A node and its child (``on_parent_failure="run"``, a higher priority: claimed
    first if it were pending), both dead; the operator retries the parent, then the
    child: two admin posts, each made again once if it failed."""
    from django.utils import timezone

    from django_pgjobs import Workflow
    from django_pgjobs.models import Job
    from tests.testapp.jobs import fault_atomic, fault_step

    wf = Workflow("retry order")
    node = wf.add(fault_step.s())
    wf.add(fault_atomic.using(priority=10).s(), after=[node], on_parent_failure="run")
    parent, child = (j.id for j in wf.enqueue().jobs)
    for job_id in (parent, child):  # the parent's death releases the child, which dies
        Job.objects.filter(id=job_id).update(status="dead", finished_at=timezone.now())
    posts = []
    for ids in ([parent], [child]):
        for _ in range(2):
            post = _admin_action("retry_now", ids)
            if post["ok"]:
                break
        posts.append(post)
    ok = all(p["ok"] for p in posts)
    return {"ok": ok, "parent": parent, "child": child, "posts": posts}


def _send_signal_twice(job_id: int, key: str) -> dict[str, Any]:
    """A webhook's signal delivered twice with one idempotency key, each delivery
    retried once after an error: both must name the one stored signal."""
    from django_pgjobs import send_signal

    ids, errors = [], []
    for _delivery in range(2):
        for _ in range(2):
            try:
                ids.append(send_signal(job_id, "approval", {"ok": True}, idempotency_key=key))
                break
            except Exception as exc:  # noqa: BLE001 - the caller retries once, same key
                errors.append(f"{type(exc).__name__}: {exc}")
        else:
            return {"ok": False, "job": job_id, "signals": ids, "error": errors}
    return {"ok": len(set(ids)) == 1, "job": job_id, "signals": ids, "error": errors or None}


def run(action: str, arg: dict[str, Any]) -> dict[str, Any]:
    from django.core.management import call_command

    from tests.testapp.jobs import fault_step

    if action == "enqueue":
        key = arg["key"]
        first_error = None
        for _ in range(2):
            try:
                job = fault_step.using(idempotency_key=key).enqueue()
                return {"ok": True, "id": job.id, "error": first_error}
            except Exception as exc:  # noqa: BLE001 - the caller retries once, same key
                first_error = f"{type(exc).__name__}: {exc}"
        return {"ok": False, "error": first_error}
    if action == "enqueue_delayed":
        first_error = None
        for _ in range(2):
            try:
                job = fault_step.using(idempotency_key=arg["key"], delay=0.05).enqueue()
                return {"ok": True, "id": job.id, "error": first_error}
            except Exception as exc:  # noqa: BLE001 - the caller retries once, same key
                first_error = f"{type(exc).__name__}: {exc}"
        return {"ok": False, "error": first_error}
    if action in ("enqueue_unique", "enqueue_unique_delayed"):
        from tests.flow_jobs import refresh_account

        options: dict[str, Any] = {"idempotency_key": arg["key"]}
        if action == "enqueue_unique_delayed":
            options["delay"] = 0.05
        first_error = None
        for _ in range(2):
            try:
                job = refresh_account.using(**options).enqueue(account_id=1)
                return {"ok": True, "id": job.id, "error": first_error}
            except Exception as exc:  # noqa: BLE001 - the caller retries once, same key
                first_error = f"{type(exc).__name__}: {exc}"
        return {"ok": False, "error": first_error}
    if action == "enqueue_debounced":
        from tests.flow_jobs import reindex_soon

        first_error = None
        for _ in range(2):
            try:  # a retry of a committed enqueue moves the same pending job on
                job = reindex_soon.enqueue(doc_id=1, version=2)
                return {"ok": True, "id": job.id, "error": first_error}
            except Exception as exc:  # noqa: BLE001 - the caller retries once, same key
                first_error = f"{type(exc).__name__}: {exc}"
        return {"ok": False, "error": first_error}
    if action == "pause_resume":
        from django_pgjobs import pause_queue, resume_queue

        errors = []
        for call in (pause_queue, resume_queue):
            for _ in range(2):  # the caller retries once
                try:
                    call("default")
                    break
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"{call.__name__}: {type(exc).__name__}: {exc}")
            else:
                return {"ok": False, "error": errors}
        return {"ok": True, "error": errors or None}
    if action in ("pause", "resume"):
        # One attempt: the cell checks what the caller was told against the rows.
        from django_pgjobs import pause_queue, resume_queue

        call = pause_queue if action == "pause" else resume_queue
        try:
            # create=True: the cell pauses a queue nothing declares ("other").
            return {"ok": True, "names": call(*arg["names"], create=True)}
        except Exception as exc:  # noqa: BLE001
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if action == "enqueue_twice":
        ids = []
        for _ in range(2):
            try:
                ids.append(fault_step.using(idempotency_key=arg["key"]).enqueue().id)
            except Exception as exc:  # noqa: BLE001
                return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "ids": ids}
        return {"ok": True, "ids": ids}
    if action == "enqueue_many":
        if arg.get("batch"):  # several COPY statements in the one transaction
            from django_pgjobs.jobs import enqueue

            enqueue.BULK_BATCH = int(arg["batch"])
        try:
            n = fault_step.enqueue_many([() for _ in range(arg["n"])])
            return {"ok": True, "n": n}
        except Exception as exc:  # noqa: BLE001
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if action in ("cancel_selected", "retry_selected", "wake_selected"):
        names = {
            "cancel_selected": "cancel_jobs",
            "retry_selected": "retry_now",
            "wake_selected": "wake_now",
        }
        return _admin_action(names[action], arg["ids"])
    if action in ("cancel_command", "retry_command"):
        command = {"cancel_command": "cancel_jobs", "retry_command": "retry_jobs"}[action]
        ids = ",".join(str(i) for i in arg["ids"])
        try:
            call_command(command, "--ids", ids, stdout=io.StringIO())
            return {"ok": True}
        except Exception as exc:  # noqa: BLE001
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if action == "admin_pages":
        client = _admin_client()
        codes = [client.get(path).status_code for path in arg["paths"]]
        return {"ok": all(c == 200 for c in codes), "codes": codes}
    if action == "jobs_status":
        try:
            call_command("jobs_status", stdout=io.StringIO())
            return {"ok": True}
        except Exception as exc:  # noqa: BLE001
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if action == "prune_dry_run":
        try:
            call_command("prune_jobs", "--dry-run", stdout=io.StringIO())
            return {"ok": True}
        except Exception as exc:  # noqa: BLE001
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if action == "tasks_enqueue":
        from tests.tasks_backend.tasks import calculate_meaning_of_life

        first_error = None
        for _ in range(2):  # the Tasks API has no idempotency key: a retry may duplicate
            try:
                return {
                    "ok": True,
                    "id": int(calculate_meaning_of_life.enqueue().id),
                    "error": first_error,
                }
            except Exception as exc:  # noqa: BLE001
                first_error = f"{type(exc).__name__}: {exc}"
        return {"ok": False, "error": first_error}
    if action == "tasks_get_result":
        from django.tasks import task_backends

        from tests.tasks_backend.tasks import calculate_meaning_of_life

        backend = task_backends["default"]
        job_id = int(calculate_meaning_of_life.enqueue().id)
        try:
            status = str(backend.get_result(str(job_id)).status)
            return {"ok": True, "id": job_id, "status": status}
        except Exception as exc:  # noqa: BLE001
            return {"ok": False, "id": job_id, "error": f"{type(exc).__name__}: {exc}"}
    if action == "enqueue_workflow":
        from django_pgjobs import chain

        first_error = None
        for _ in range(2):  # a workflow has no key: a retry after a lost reply duplicates it
            try:
                run = chain(fault_step.s(), fault_step.si()).enqueue()
                return {"ok": True, "ids": [j.id for j in run.jobs], "error": first_error}
            except Exception as exc:  # noqa: BLE001 - the caller retries once
                first_error = f"{type(exc).__name__}: {exc}"
        return {"ok": False, "error": first_error}
    if action in ("batch", "batch_empty"):
        from django_pgjobs import batch

        b = batch(on_complete=fault_step.si())
        errors = []
        try:
            with b:
                if action == "batch":
                    fault_step.enqueue()
        except Exception as exc:  # noqa: BLE001 - the caller closes it again once
            errors.append(f"{type(exc).__name__}: {exc}")
            if b.id is not None:
                try:
                    b.close()
                except Exception as again:  # noqa: BLE001
                    return {"ok": False, "error": [*errors, f"{type(again).__name__}: {again}"]}
        if b.id is None:
            return {"ok": False, "error": errors}
        return {"ok": True, "batch": b.id, "error": errors or None}
    if action == "cancel_workflow":
        from django_pgjobs import chain
        from django_pgjobs.workflows import cancel_workflow

        run = chain(fault_step.s(), fault_step.si()).enqueue()
        errors = []
        for _ in range(2):  # the caller retries once
            try:
                cancel_workflow(run.id)
                return {"ok": True, "cancelled": [j.id for j in run.jobs], "error": errors or None}
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{type(exc).__name__}: {exc}")
        return {"ok": False, "cancelled": [j.id for j in run.jobs], "error": errors}
    if action == "retry_failed_workflow":
        # the workflow admin's "retry the failed nodes": a chain whose first node died
        # (its child cancelled by the trigger), retried from the run list
        from django.utils import timezone

        from django_pgjobs import chain
        from django_pgjobs.models import Job

        run = chain(fault_step.s(), fault_step.si()).enqueue()
        first, second = (j.id for j in run.jobs)
        Job.objects.filter(id=first).update(status="dead", finished_at=timezone.now())
        response = _admin_client().post(
            "/admin/django_pgjobs/workflow/",
            {"action": "retry_failed_runs", "_selected_action": [str(run.id)], "index": "0"},
        )
        ok = response.status_code in (200, 302)
        return {"ok": ok, "status": response.status_code, "retried": [first, second]}
    if action == "retry_child_after_parent":
        return _retry_child_after_parent()
    if action == "send_signal":
        return _send_signal_twice(int(arg["id"]), arg["key"])
    if action == "emit_event":
        from django_pgjobs import emit_event

        first_error = None
        for _ in range(2):  # the caller retries once (an event has no key)
            try:
                return {
                    "ok": True,
                    "event": emit_event("fault.done", key="1"),
                    "error": first_error,
                }
            except Exception as exc:  # noqa: BLE001 - the caller retries once
                first_error = f"{type(exc).__name__}: {exc}"
        return {"ok": False, "error": first_error}
    if action == "run_jobs":
        from django_pgjobs.testing import run_jobs

        try:
            ran = run_jobs()
            return {"ok": True, "ran": [[r.id, r.status] for r in ran]}
        except Exception as exc:  # noqa: BLE001
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    raise SystemExit(f"unknown action {action!r}")


def main() -> None:
    import django

    django.setup()
    action = sys.argv[1]
    arg = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    print("DRIVER-RESULT " + json.dumps(run(action, arg)), flush=True)


if __name__ == "__main__":
    main()
