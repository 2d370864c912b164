"""The dashboard's batch jobs panel for every persona: tenant admins and operators upload,
viewers see but cannot submit, other tenants and anonymous visitors get nothing. A bad file is
refused whole, its bad lines named; results download as JSONL."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from accounts.services import api_key_create
from openai_api.models import BatchItem, BatchJob, BatchStatus, ItemStatus
from tests.personas import World, login, world_create

pytestmark = pytest.mark.django_db
UPLOAD = "/tenants/acme/batches/"
DASHBOARD = "/tenants/acme/dashboard/"


@pytest.fixture
def world() -> World:
    return world_create()


def jsonl_file(*lines: dict, name: str = "batch.jsonl") -> SimpleUploadedFile:
    text = "".join(json.dumps(line) + "\n" for line in lines)
    return SimpleUploadedFile(name, text.encode(), content_type="application/jsonl")


def good(custom_id: str, bid: float = 0.01) -> dict:
    body = {"model": "org/test-llm", "prompt": "Once upon a time", "max_tokens": 4, "bid": bid}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}


@pytest.mark.parametrize("persona", ["a_admin", "operator"])
def test_admins_and_operators_upload_a_batch(client, world, persona) -> None:
    login(client, persona)
    response = client.post(UPLOAD, {"input": jsonl_file(good("x"), good("y", 0.5))}, follow=True)
    assert response.status_code == 200
    batch = BatchJob.objects.get()
    assert (batch.tenant, batch.api_key, batch.submitted_by) == (world.a, None, persona)
    assert (batch.status, batch.total, batch.endpoint) == (
        BatchStatus.VALIDATING,
        2,
        "/v1/completions",
    )
    assert list(batch.items.values_list("line", "custom_id")) == [(1, "x"), (2, "y")]
    page = response.content.decode()
    assert f"Batch {batch.public_id} submitted: 2 requests." in page
    assert "Batch jobs" in page and f"/tenants/acme/batches/{batch.public_id}/output/" in page


def test_an_upload_may_be_charged_to_one_of_the_tenants_keys(client, world) -> None:
    key, _ = api_key_create(tenant=world.a, name="batch key", created_by=None)
    login(client, "a_admin")
    client.post(UPLOAD, {"input": jsonl_file(good("x")), "api_key": key.pk})
    assert BatchJob.objects.get().api_key == key


def test_a_bad_file_is_refused_with_its_line_numbers_and_nothing_is_created(client, world):
    login(client, "a_admin")
    bad = good("y")
    bad["body"]["bid"] = -1
    response = client.post(UPLOAD, {"input": jsonl_file(good("x"), bad, good("x"))}, follow=True)
    page = response.content.decode()
    assert "Batch refused, nothing was submitted." in page
    assert "line 2: bid must not be negative" in page
    assert "line 3: custom_id &#x27;x&#x27; is also on line 1" in page
    assert BatchJob.objects.count() == 0 and BatchItem.objects.count() == 0


def test_viewers_see_the_panel_but_cannot_submit(client, world) -> None:
    login(client, "a_viewer")
    page = client.get(DASHBOARD).content.decode()
    assert "Batch jobs" in page and 'id="batch-upload"' not in page
    assert "Only the tenant's admins submit batch jobs." in page
    assert client.post(UPLOAD, {"input": jsonl_file(good("x"))}).status_code == 403
    assert BatchJob.objects.count() == 0
    client.logout()
    login(client, "a_admin")
    assert 'id="batch-upload"' in client.get(DASHBOARD).content.decode()


def test_other_tenants_and_anonymous_visitors_get_nothing(client, world) -> None:
    response = client.post(UPLOAD, {"input": jsonl_file(good("x"))})
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    login(client, "b_admin")
    assert client.post(UPLOAD, {"input": jsonl_file(good("x"))}).status_code == 404
    assert BatchJob.objects.count() == 0


def test_a_get_is_not_an_upload(client, world) -> None:
    login(client, "a_admin")
    assert client.get(UPLOAD).status_code == 405


def finished_batch(world) -> BatchJob:
    now = timezone.now()
    batch = BatchJob.objects.create(
        public_id="batch_done", tenant=world.a, input="...", total=3, completed=1,
        failed=1, cancelled=1, status=BatchStatus.COMPLETED, created_at=now, finished_at=now,
    )  # fmt: skip
    body = {"id": "cmpl-r1", "object": "text_completion", "usage": {"prompt_tokens": 3}}
    error = {"error": {"message": "no", "type": "insufficient_quota", "param": None,
                       "code": "insufficient_quota"}}  # fmt: skip
    rows = [
        ("a", ItemStatus.COMPLETED, 200, body, None, "r1"),
        ("b", ItemStatus.FAILED, 429, error, {"code": "insufficient_quota", "message": "no"}, "r2"),
        ("c", ItemStatus.CANCELLED, None, None, None, ""),
    ]
    for line, (cid, status, code, response, err, rid) in enumerate(rows, start=1):
        BatchItem.objects.create(
            batch=batch, line=line, custom_id=cid, url="/v1/completions", body={}, status=status,
            status_code=code, response=response, error=err, request_id=rid,
        )  # fmt: skip
    return batch


@pytest.mark.parametrize("persona", ["a_admin", "a_viewer", "operator"])
def test_members_download_output_and_errors(client, world, persona) -> None:
    batch = finished_batch(world)
    login(client, persona)
    page = client.get(DASHBOARD).content.decode()
    assert "batch_done" in page and "Completed" in page
    output = client.get(f"/tenants/acme/batches/{batch.public_id}/output/")
    assert output["Content-Type"].startswith("application/jsonl")
    assert 'filename="batch_done_output.jsonl"' in output["Content-Disposition"]
    rows = [json.loads(line) for line in output.content.decode().splitlines()]
    assert [(r["custom_id"], r["response"]["status_code"]) for r in rows] == [
        ("a", 200),
        ("b", 429),
    ]
    assert rows[0]["response"]["body"]["id"] == "cmpl-r1" and rows[0]["error"] is None
    assert rows[0]["response"]["request_id"] == "r1"
    errors = client.get(f"/tenants/acme/batches/{batch.public_id}/errors/")
    rows = [json.loads(line) for line in errors.content.decode().splitlines()]
    assert [(r["custom_id"], r["error"]["code"]) for r in rows] == [
        ("b", "insufficient_quota"),
        ("c", "batch_cancelled"),
    ]
    assert rows[1]["response"] is None


def test_another_tenants_batch_cannot_be_downloaded(client, world) -> None:
    batch = finished_batch(world)
    login(client, "b_admin")
    assert client.get(f"/tenants/acme/batches/{batch.public_id}/output/").status_code == 404
    assert client.get(f"/tenants/globex/batches/{batch.public_id}/output/").status_code == 404
    assert client.get(f"/tenants/globex/batches/{batch.public_id}/errors/").status_code == 404
