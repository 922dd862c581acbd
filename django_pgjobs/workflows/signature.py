"""``my_job.s(...)`` / ``my_job.si(...)``: a job call to place in a workflow.

Checked when built, like an enqueue: every argument must round-trip through JSON
and the encoded arguments must fit ``PGJOBS["MAX_ARGS_BYTES"]``. Arity is checked
when the signature is placed (``Workflow.add``, ``chain``, ``chord``, ``batch``):
only then is it known whether the job also receives its parents' results as a
first argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django_pgjobs.support.validation import (
    check_arguments,
    check_json,
    check_size,
    json_bytes,
    json_text,
)

if TYPE_CHECKING:
    from django_pgjobs.jobs.definition import JobDefinition


class Signature:
    """One job call, not enqueued yet: the job, its arguments and its ``.using()``
    options. ``immutable`` (``.si()``): it receives no parent result as an argument
    (``context.parent_results`` still has them)."""

    __slots__ = ("args", "args_text", "definition", "immutable", "kwargs", "kwargs_text", "options")

    def __init__(
        self,
        definition: JobDefinition,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        options: Mapping[str, Any],
        *,
        immutable: bool,
    ):
        self.definition = definition
        self.args = list(args)
        self.kwargs = dict(kwargs)
        self.options = dict(options)
        self.immutable = immutable
        name = definition.name
        try:
            for i, value in enumerate(self.args):
                check_json(value, f"argument #{i}")
            for key, value in self.kwargs.items():
                if not isinstance(key, str):
                    raise TypeError(f"keyword names must be strings, got {key!r}")
                check_json(value, f"argument {key!r}")
        except TypeError as exc:
            raise TypeError(f"{name}.{'si' if immutable else 's'}(): {exc}") from None
        self.args_text = json_text(self.args) if self.args else "[]"
        self.kwargs_text = json_text(self.kwargs) if self.kwargs else "{}"
        check_size(
            definition.checked_func,
            name,
            self.args,
            self.kwargs,
            json_bytes(self.args_text) + json_bytes(self.kwargs_text),
            takes_context=definition.checked_takes_context,
        )

    @property
    def name(self) -> str:
        return self.definition.name

    def __repr__(self) -> str:
        method = "si" if self.immutable else "s"
        shown = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        text = f"{self.name}.{method}({', '.join(shown)})"
        return text if len(text) <= 200 else text[:197] + "..."

    def check_call(self, receives: str, where: str) -> None:
        """Check the call against the job's signature, with the first argument the
        placement adds: ``receives`` "first" (a parent's result) or "list" (a list
        of results); "none" adds nothing. ``where`` names the placement in errors."""
        extra = [None] if receives in ("first", "list") else []
        try:
            check_arguments(
                self.definition.checked_func,
                self.name,
                [*extra, *self.args],
                self.kwargs,
                takes_context=self.definition.checked_takes_context,
            )
        except TypeError as exc:
            if not extra:
                raise TypeError(f"{where}: {exc}") from None
            raise TypeError(
                f"{where}: {exc} (it also receives its parent's result as its first "
                "argument; make it with .si(...) to pass none)"
            ) from None
