"""The batch endpoints over HTTP (Daphne): submit, refuse a bad file whole, list, retrieve,
cancel, download; a key sees its own tenant's batches only."""

from __future__ import annotations

import pytest

from openai_api.models import BatchItem, BatchJob, ItemStatus
from tests.openai_api.batches.batch_helpers import (
    batch_queue,  # noqa: F401 (fixture)
    completion_line,
    jsonl,
    prompt_of,
    results,
)
from tests.personas import program_create

pytestmark = [pytest.mark.usefixtures("batch_queue")]

JSONL = {"Content-Type": "application/jsonl"}


def three_lines(model: str = "org/m") -> str:
    return jsonl(
        [completion_line(f"q{i}", model, prompt=prompt_of(i, 3), max_tokens=2, bid=0.01)
         for i in range(3)]
    )  # fmt: skip


def test_submit_list_retrieve_and_scoping(gateway, acme):
    other = program_create("globex")
    with acme.http(gateway) as http, other.http(gateway) as http_other:
        created = http.post("/v1/batches", content=three_lines(), headers=JSONL)
        assert created.status_code == 200, created.text
        batch = created.json()
        assert batch["object"] == "batch" and batch["id"].startswith("batch_")
        assert (batch["status"], batch["endpoint"], batch["model"]) == (
            "validating",
            "/v1/completions",
            "org/m",
        )
        assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 0, "cancelled": 0}
        second = http.post(
            "/v1/batches", json={"input": three_lines(), "metadata": {"team": "search"}}
        ).json()
        assert second["metadata"] == {"team": "search"}
        theirs = http_other.post("/v1/batches", content=three_lines(), headers=JSONL).json()

        listed = http.get("/v1/batches").json()
        assert [b["id"] for b in listed["data"]] == [second["id"], batch["id"]]  # newest first
        assert listed["has_more"] is False
        page = http.get("/v1/batches", params={"limit": 1}).json()
        assert [b["id"] for b in page["data"]] == [second["id"]] and page["has_more"] is True
        rest = http.get("/v1/batches", params={"limit": 1, "after": second["id"]}).json()
        assert [b["id"] for b in rest["data"]] == [batch["id"]]
        assert http.get(f"/v1/batches/{batch['id']}").json()["id"] == batch["id"]

        # Another tenant's batch does not exist for this key, whatever the endpoint.
        for method, path in [
            ("GET", f"/v1/batches/{theirs['id']}"),
            ("POST", f"/v1/batches/{theirs['id']}/cancel"),
            ("GET", f"/v1/batches/{theirs['id']}/output"),
            ("GET", f"/v1/batches/{theirs['id']}/errors"),
        ]:
            answer = http.request(method, path)
            assert answer.status_code == 404, (method, path)
            assert answer.json()["error"]["code"] == "batch_not_found"
        assert [b["id"] for b in http_other.get("/v1/batches").json()["data"]] == [theirs["id"]]
        # Nothing was cancelled by the attempt above.
        assert BatchJob.objects.get(public_id=theirs["id"]).status == "validating"
    stored = BatchJob.objects.get(public_id=batch["id"])
    assert stored.input == three_lines() and stored.tenant == acme.tenant
    assert stored.api_key == acme.api_key
    assert list(stored.items.values_list("line", "custom_id")) == [(1, "q0"), (2, "q1"), (3, "q2")]


def test_no_key_or_a_bad_key_is_a_401(gateway, transactional_db):
    import httpx

    for headers in ({}, {"Authorization": "Bearer im_nope_nope"}):
        answer = httpx.get(f"{gateway.url}/v1/batches", headers=headers)
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "invalid_api_key"


def test_a_bad_file_is_refused_whole_and_nothing_is_created(gateway, acme):
    lines = [completion_line(f"q{i}", "org/m", prompt=[1, 2], max_tokens=2) for i in range(3)]
    lines[1]["body"]["bid"] = "-0.5"
    lines[2]["url"] = "/v1/embeddings"
    with acme.http(gateway) as http:
        answer = http.post("/v1/batches", content=jsonl(lines), headers=JSONL)
        not_json = http.post("/v1/batches", json={"lines": []})
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["code"] == "invalid_batch_input"
    assert [(e["line"], e["param"]) for e in error["lines"]] == [(2, "body.bid"), (3, "url")]
    assert not_json.status_code == 400 and not_json.json()["error"]["param"] == "input"
    assert BatchJob.objects.count() == 0 and BatchItem.objects.count() == 0


def test_too_large_a_file_is_a_413(gateway, acme, settings):
    settings.BATCH_MAX_BYTES = 1000
    with acme.http(gateway) as http:
        answer = http.post("/v1/batches", content="x" * 1001, headers=JSONL)
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "batch_too_large"
    assert BatchJob.objects.count() == 0


def test_cancel_before_it_runs(gateway, acme):
    with acme.http(gateway) as http:
        batch = http.post("/v1/batches", content=three_lines(), headers=JSONL).json()
        cancelled = http.post(f"/v1/batches/{batch['id']}/cancel").json()
        again = http.post(f"/v1/batches/{batch['id']}/cancel")
        errors = results(http.get(f"/v1/batches/{batch['id']}/errors").text)
        output = http.get(f"/v1/batches/{batch['id']}/output").text
    assert cancelled["status"] == "cancelled" and cancelled["cancelled_at"] is not None
    assert cancelled["request_counts"] == {"total": 3, "completed": 0, "failed": 0, "cancelled": 3}
    assert again.status_code == 409
    assert sorted(errors) == ["q0", "q1", "q2"]
    assert {row["error"]["code"] for row in errors.values()} == {"batch_cancelled"}
    assert all(row["response"] is None for row in errors.values())
    assert output == ""
    assert set(BatchItem.objects.values_list("status", flat=True)) == {ItemStatus.CANCELLED}
