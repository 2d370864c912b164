"""The tenant dashboard's batch jobs: upload a JSONL (tenant admins and operators), download a
batch's output and errors (every member). Thin: the work is in ``openai_api.batches``.

A bad file is refused whole, with the first bad lines and their numbers shown on the dashboard;
nothing is written for it.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import BadRequest, PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from accounts.forms import BatchUploadForm
from accounts.models import Tenant
from accounts.selectors import can_manage_keys
from accounts.text import text_problem
from accounts.views import tenant_page
from openai_api.batches import selectors, tasks
from openai_api.batches.input import BatchInputInvalid, input_decoded, max_bytes
from openai_api.batches.services import batch_create
from openai_api.batches.views import results_file
from openai_api.gateway.errors import GatewayError
from openai_api.models import BatchJob

LINES_SHOWN = 5  # bad lines named in the message of a refused file


def can_submit_batches(*, user, tenant: Tenant) -> bool:  # type: ignore[no-untyped-def]
    """Tenant admins and operators submit batches; viewers only look."""
    return can_manage_keys(user=user, tenant=tenant)


def _refusal(exc: GatewayError) -> str:
    if isinstance(exc, BatchInputInvalid):
        shown = "; ".join(f"line {e['line']}: {e['message']}" for e in exc.lines[:LINES_SHOWN])
        more = exc.total_bad - min(len(exc.lines), LINES_SHOWN)
        return f"Batch refused, nothing was submitted. {shown}" + (
            f"; and {more} more bad lines." if more > 0 else "."
        )
    return f"Batch refused, nothing was submitted: {exc.message}"


@require_POST
@tenant_page
def batch_upload(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    if not can_submit_batches(user=request.user, tenant=tenant):
        raise PermissionDenied("Only the tenant's admins submit batch jobs.")
    form = BatchUploadForm(request.POST, request.FILES, tenant=tenant)
    if not form.is_valid():
        errors = "; ".join(f"{name}: {' '.join(e)}" for name, e in form.errors.items())
        messages.error(request, f"Batch refused, nothing was submitted: {errors}")
        return redirect("dashboard:tenant_dashboard", slug=tenant.slug)
    upload = form.cleaned_data["input"]
    try:
        raw = upload.read(max_bytes() + 1)  # one byte over the limit: input_decoded refuses it
        batch = batch_create(
            tenant=tenant,
            api_key=form.cleaned_data["api_key"],
            text=input_decoded(raw),
            submitted_by=request.user.get_username(),
            enqueue=tasks.batch_enqueue,
        )
    except GatewayError as exc:
        messages.error(request, _refusal(exc))
    else:
        messages.success(request, f"Batch {batch.public_id} submitted: {batch.total} requests.")
    return redirect("dashboard:tenant_dashboard", slug=tenant.slug)


def _results(tenant: Tenant, public_id: str, kind: str) -> HttpResponse:
    problem = text_problem(public_id)
    if problem is not None:  # a NUL would reach PostgreSQL, which refuses it
        raise BadRequest(f"the batch id {problem}")
    try:
        batch = selectors.batch_for_tenant(tenant=tenant, public_id=public_id)
    except BatchJob.DoesNotExist:
        raise Http404("No such batch") from None
    text = "".join(selectors.result_lines(batch=batch, kind=kind))
    return results_file(text, batch_id=public_id, kind=kind)


@require_GET
@tenant_page
def batch_output(request: HttpRequest, tenant: Tenant, public_id: str) -> HttpResponse:
    return _results(tenant, public_id, selectors.OUTPUT)


@require_GET
@tenant_page
def batch_errors(request: HttpRequest, tenant: Tenant, public_id: str) -> HttpResponse:
    return _results(tenant, public_id, selectors.ERRORS)
