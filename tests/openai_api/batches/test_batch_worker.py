"""A batch run by a REAL Celery worker that is SIGKILLed mid-batch, with requests admitted and
held but not yet sent; another worker runs the task again and every line ends served exactly
once, charged exactly once, with no hold left open.

The kill is deterministic: a test hook (``tests.pause_hooks``) lets the first three
admissions through and holds every later one after its admission, before the engine.
"""

from __future__ import annotations

import signal
from decimal import Decimal

import pytest

from accounts.models import BudgetCounter, ChargeKind, Hold, HoldState, LedgerEntry, Request
from openai_api.batches.run import item_request_id
from openai_api.batches.tasks import batch_run
from openai_api.models import BatchItem, ItemStatus
from tests.openai_api.batches.batch_helpers import (
    batch_of,
    batch_queue,  # noqa: F401 (a fixture)
    charge_of,
    completion_line,
    jsonl,
    prompt_of,
    results,
)
from tests.pause_hooks import BATCH_PAUSE_FILE_ENV
from tests.scheduler_bridge.workers import celery_worker, wait_until

pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.usefixtures("batch_queue"),
]
LINES = 10
CONCURRENCY = 4  # the default BATCH_CONCURRENCY the workers run with
LET_THROUGH = 3
RESULT_TIMEOUT_S = 120


def test_killing_the_worker_mid_batch_serves_and_charges_every_line_exactly_once(
    gateway, acme, market, tmp_path
):
    lines = [
        completion_line(f"q{i}", market.served_model, prompt=prompt_of(i, 2 + i % 4),
                        max_tokens=1 + i % 3, bid=f"0.0{i}")
        for i in range(LINES)
    ]  # fmt: skip
    with acme.http(gateway) as http:
        answer = http.post(
            "/v1/batches", content=jsonl(lines), headers={"Content-Type": "application/jsonl"}
        )
    assert answer.status_code == 200, answer.text
    batch = batch_of(answer.json()["id"])

    pause = tmp_path / "pause"
    pause.write_text(str(LET_THROUGH))
    with celery_worker(tmp_path, env={BATCH_PAUSE_FILE_ENV: str(pause)}) as first:
        batch_run.apply_async(args=[batch.pk], queue=first.queue)
        # Three lines served; four more admitted (requests open, money held) and waiting.
        wait_until(
            lambda: (
                BatchItem.objects.filter(status=ItemStatus.COMPLETED).count() == LET_THROUGH
                and Request.objects.filter(status="queued").count() == CONCURRENCY
            ),
            what="three lines served and four admitted",
        )
        queued = Request.objects.filter(status="queued").values("request_id")
        assert Hold.objects.filter(state=HoldState.OPEN, request_id__in=queued).count() == (
            CONCURRENCY
        )
        assert LedgerEntry.objects.count() == 2 * LET_THROUGH  # tokens and priority, each
        first.kill()
    assert first.process.returncode == -signal.SIGKILL
    pause.unlink()
    stranded = set(Request.objects.filter(status="queued").values_list("request_id", flat=True))
    assert BatchItem.objects.filter(status=ItemStatus.RUNNING).count() == CONCURRENCY

    with celery_worker(tmp_path) as second:
        # What the broker does with the dead worker's unacknowledged message once its
        # visibility timeout passes: the same task, to a live worker.
        outcome = batch_run.apply_async(args=[batch.pk], queue=second.queue).get(
            timeout=RESULT_TIMEOUT_S
        )
    assert (outcome["status"], outcome["completed"], outcome["failed"]) == ("completed", LINES, 0)

    items = list(BatchItem.objects.filter(batch=batch).order_by("line"))
    assert [i.status for i in items] == [ItemStatus.COMPLETED] * LINES
    # The four interrupted lines were tried again as their second attempt, the rest once.
    assert sorted(i.attempts for i in items) == [1] * (LINES - CONCURRENCY) + [2] * CONCURRENCY
    for item in items:
        assert item.request_id == item_request_id(
            batch_public_id=batch.public_id, custom_id=item.custom_id, attempt=item.attempts
        )
    interrupted = {
        item_request_id(batch_public_id=batch.public_id, custom_id=i.custom_id, attempt=1)
        for i in items
        if i.attempts == 2
    }
    assert interrupted == stranded
    # Their first attempts: failed, released, never charged.
    for rid in stranded:
        assert Request.objects.get(request_id=rid).status == "failed"
        assert Hold.objects.get(request_id=rid).state == HoldState.RELEASED
    assert not LedgerEntry.objects.filter(request_id__in=stranded).exists()

    # One token charge and one priority charge per line, for its served request, the token
    # charge at prices x tokens.
    expected = {line["custom_id"]: charge_of(line) for line in lines}
    assert LedgerEntry.objects.count() == 2 * LINES
    for item in items:
        entry = LedgerEntry.objects.get(request_id=item.request_id, kind=ChargeKind.TOKENS)
        assert entry.amount == expected[item.custom_id]
        assert LedgerEntry.objects.filter(
            request_id=item.request_id, kind=ChargeKind.PRIORITY
        ).exists()
        assert Request.objects.get(request_id=item.request_id).status == "served"
    tokens = LedgerEntry.objects.filter(kind=ChargeKind.TOKENS)
    assert sum(tokens.values_list("amount", flat=True)) == sum(expected.values())
    # Every hold is settled or released: nothing stays reserved.
    assert not Hold.objects.filter(state=HoldState.OPEN).exists()
    counter = BudgetCounter.objects.get(tenant=acme.tenant, api_key=None)
    spent = sum(LedgerEntry.objects.values_list("amount", flat=True))
    assert (counter.held, counter.spent_total) == (0, spent)

    with acme.http(gateway) as http:
        output = results(http.get(f"/v1/batches/{batch.public_id}/output").text)
    assert list(output) == [line["custom_id"] for line in lines]
    for line in lines:
        body = output[line["custom_id"]]["response"]["body"]
        assert Decimal(body["auction"]["token_charge"]) == expected[line["custom_id"]]
        assert body["usage"]["completion_tokens"] == line["body"]["max_tokens"]
