"""Batches run by the Celery task (eagerly, in this process) against the simulated engine:
every served line answered as the endpoint would have answered it and charged once, at its
prices x its tokens; refusals are answers and the batch goes on."""

from __future__ import annotations

from decimal import Decimal

import pytest

from accounts.models import BudgetCounter, ChargeKind, Hold, HoldState, LedgerEntry, Request
from accounts.money import money
from accounts.services import budget_set
from openai_api.batches.tasks import batch_run
from openai_api.models import BatchItem, ItemStatus
from tests.conftest import dead_port
from tests.openai_api.batches.batch_helpers import (
    batch_of,
    batch_queue,  # noqa: F401 (a fixture)
    charge_of,
    completion_line,
    jsonl,
    prompt_of,
    results,
)
from tests.openai_api.conftest import market_create

pytestmark = [pytest.mark.usefixtures("batch_queue")]
JSONL = {"Content-Type": "application/jsonl"}
# "<|user|>\nHi batch\n<|assistant|>\n": < | user | > \n Hi ␠ batch \n < | assistant | > \n
CHAT_TOKENS = 16


def submit(http, lines: list[dict]) -> str:
    answer = http.post("/v1/batches", content=jsonl(lines), headers=JSONL)
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def run(public_id: str) -> dict:
    """The task, eagerly (Celery's apply: in this process, as a worker would run it)."""
    return batch_run.apply(args=[batch_of(public_id).pk]).get()


def test_a_batch_runs_end_to_end_and_each_line_is_charged_once(gateway, acme, market):
    model = market.served_model
    lines = [
        completion_line(f"q{i}", model, prompt=prompt_of(i, 3 + i), max_tokens=1 + i % 3,
                        bid=f"0.0{i}")
        for i in range(6)
    ]  # fmt: skip
    chat = {
        "custom_id": "chat",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "max_tokens": 3, "bid": 0.5,
                 "messages": [{"role": "user", "content": "Hi batch"}]},
    }  # fmt: skip
    with acme.http(gateway) as http:
        public_id = submit(http, [*lines, chat])
        outcome = run(public_id)
        assert (outcome["status"], outcome["completed"], outcome["failed"]) == ("completed", 7, 0)
        batch = http.get(f"/v1/batches/{public_id}").json()
        output = results(http.get(f"/v1/batches/{public_id}/output").text)
        errors = http.get(f"/v1/batches/{public_id}/errors").text
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 7, "completed": 7, "failed": 0, "cancelled": 0}
    assert batch["in_progress_at"] is not None and batch["completed_at"] is not None
    assert errors == ""
    assert list(output) == [f"q{i}" for i in range(6)] + ["chat"]  # input order

    expected = {line["custom_id"]: charge_of(line) for line in lines}
    # 16 prompt tokens x $3 + 3 completion tokens x $15 per million
    expected["chat"] = (Decimal(CHAT_TOKENS) * 3 + 3 * 15) / 1_000_000
    for line in [*lines, chat]:
        row = output[line["custom_id"]]
        assert row["error"] is None and row["response"]["status_code"] == 200
        body = row["response"]["body"]
        rid = row["response"]["request_id"]
        assert body["id"] in (f"cmpl-{rid}", f"chatcmpl-{rid}")
        usage = body["usage"]
        if line is chat:
            assert body["object"] == "chat.completion"
            assert (usage["prompt_tokens"], usage["completion_tokens"]) == (CHAT_TOKENS, 3)
        else:
            assert body["object"] == "text_completion"
            assert usage["prompt_tokens"] == len(line["body"]["prompt"])
            assert usage["completion_tokens"] == line["body"]["max_tokens"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        auction = body["auction"]
        assert Decimal(auction["bid"]) == Decimal(str(line["body"]["bid"]))
        assert auction["bid_source"] == "explicit"
        assert Decimal(auction["token_charge"]) == expected[line["custom_id"]]
        # The token charge and the priority charge, once each, settled with the answer.
        entry, priority = (
            LedgerEntry.objects.get(request_id=rid, kind=kind)
            for kind in (ChargeKind.TOKENS, ChargeKind.PRIORITY)
        )
        assert entry.amount == expected[line["custom_id"]]
        assert (entry.tenant, entry.api_key) == (acme.tenant, acme.api_key)
        assert Decimal(auction["priority_charge"]) == priority.amount
        assert priority.amount == money(priority.detail["engine_charge"])  # its rounding, once
        request = Request.objects.get(request_id=rid)
        assert (request.status, request.bid) == ("served", Decimal(str(line["body"]["bid"])))
    assert LedgerEntry.objects.count() == 14
    tokens = LedgerEntry.objects.filter(kind=ChargeKind.TOKENS)
    assert sum(e.amount for e in tokens) == sum(expected.values())
    # Served, every line's hold is settled: nothing stays reserved.
    assert not Hold.objects.filter(state=HoldState.OPEN).exists()
    assert Hold.objects.filter(state=HoldState.SETTLED).count() == 7
    counter = BudgetCounter.objects.get(tenant=acme.tenant, api_key=None)
    spent = sum(e.amount for e in LedgerEntry.objects.all())
    assert (counter.held, counter.spent_total) == (0, spent)

    # Run again (a redelivered task): every item is finished, nothing more is charged.
    assert run(public_id)["skipped"]
    assert LedgerEntry.objects.count() == 14


def test_an_exhausted_budget_fails_that_line_with_a_429_and_the_batch_goes_on(
    gateway, acme, market, settings
):
    settings.BATCH_CONCURRENCY = 1  # one line at a time: which line meets the limit is known
    budget_set(tenant=acme.tenant, limit="0.000105", period="month")
    model = market.served_model
    # Holds (no bid: tokens only): 4 x $3 + 2 x $15 per million = $0.000042 for the first
    # three lines, 1 x $3 + 1 x $15 = $0.000018 for the last. Served lines are charged exactly
    # their hold. Spent before each: 0, 42, 84 (84 + 42 > 105: refused), 84 (+ 18 = 102: fits).
    lines = [
        completion_line("a", model, prompt=prompt_of(1, 4), max_tokens=2),
        completion_line("b", model, prompt=prompt_of(2, 4), max_tokens=2),
        completion_line("c", model, prompt=prompt_of(3, 4), max_tokens=2),
        completion_line("d", model, prompt=prompt_of(4, 1), max_tokens=1),
    ]
    with acme.http(gateway) as http:
        public_id = submit(http, lines)
        outcome = run(public_id)
        output = results(http.get(f"/v1/batches/{public_id}/output").text)
        errors = results(http.get(f"/v1/batches/{public_id}/errors").text)
    assert (outcome["status"], outcome["completed"], outcome["failed"]) == ("completed", 3, 1)
    assert list(errors) == ["c"]
    refused = output["c"]
    assert refused["response"]["status_code"] == 429
    assert refused["response"]["body"]["error"]["code"] == "insufficient_quota"
    assert refused["error"]["code"] == "insufficient_quota"
    # A 429 like a full queue's, but the line's answer: tried once, not waited out.
    assert BatchItem.objects.get(custom_id="c").attempts == 1
    assert not Request.objects.filter(request_id=refused["response"]["request_id"]).exists()
    charged = {cid: Decimal(output[cid]["response"]["body"]["auction"]["token_charge"])
               for cid in "abd"}  # fmt: skip
    assert charged == {"a": Decimal("0.000042"), "b": Decimal("0.000042"), "d": Decimal("0.000018")}
    tokens = LedgerEntry.objects.filter(kind=ChargeKind.TOKENS)
    assert sorted(tokens.values_list("amount", flat=True)) == sorted(charged.values())
    # No bid: each served line's priority charge is 0.
    priority = LedgerEntry.objects.filter(kind=ChargeKind.PRIORITY)
    assert list(priority.values_list("amount", flat=True)) == [Decimal(0)] * 3
    counter = BudgetCounter.objects.get(tenant=acme.tenant, api_key=None)
    assert (counter.held, counter.spent_total) == (0, Decimal("0.000102"))


@pytest.mark.parametrize("refusal", ["queue_full", "insufficient_quota"])
def test_a_full_queue_is_waited_out_and_an_exhausted_budget_is_the_lines_answer(
    gateway, acme, market, monkeypatch, refusal
):
    """Both are 429s. The first attempt is refused after its admission (its hold placed, then
    released as the gateway does); a full queue (Retry-After 0 here) is retried as the line's
    next attempt and served, an exhausted budget is the line's answer at once."""
    from accounts.services import request_fail
    from openai_api.batches import run as batches_run
    from openai_api.gateway.db import db_call
    from openai_api.gateway.errors import BudgetExhaustedError, EngineBusy

    forward = batches_run.services.completion_forward
    calls: list[str] = []

    async def refused_once(*, admitted, **kwargs):
        calls.append(admitted.request_id)
        if len(calls) > 1:
            return await forward(admitted=admitted, **kwargs)
        await db_call(request_fail, request_id=admitted.request_id)
        if refusal == "queue_full":
            raise EngineBusy("the engine's queue is full", headers={"Retry-After": "0"})
        raise BudgetExhaustedError("The tenant's budget is exhausted")

    monkeypatch.setattr(batches_run.services, "completion_forward", refused_once)
    line = completion_line("q", market.served_model, prompt=prompt_of(1, 4), max_tokens=2)
    with acme.http(gateway) as http:
        outcome = run(submit(http, [line]))
    item = BatchItem.objects.get()
    first = Request.objects.get(request_id=calls[0])
    assert first.status == "failed"  # the refused attempt: released, never charged
    assert Hold.objects.get(request_id=calls[0]).state == HoldState.RELEASED
    if refusal == "queue_full":
        assert (outcome["completed"], outcome["failed"]) == (1, 0)
        assert (item.status, item.status_code, item.attempts) == (ItemStatus.COMPLETED, 200, 2)
        assert len(calls) == 2 and item.request_id == calls[1] != calls[0]
        # 4 x $3 + 2 x $15 per million, once, for the attempt served
        (entry,) = LedgerEntry.objects.filter(kind=ChargeKind.TOKENS)
        assert (entry.request_id, entry.amount) == (calls[1], Decimal("0.000042"))
    else:
        assert (outcome["completed"], outcome["failed"]) == (0, 1)
        assert (item.status, item.status_code, item.attempts) == (ItemStatus.FAILED, 429, 1)
        assert item.error["code"] == item.response["error"]["code"] == "insufficient_quota"
        assert calls == [item.request_id]
        assert not LedgerEntry.objects.exists()  # nothing at all: never served


def test_an_engine_that_is_down_fails_lines_with_a_503_and_charges_nothing(gateway, acme):
    market = market_create(engine_url=f"http://127.0.0.1:{dead_port()}")
    lines = [
        completion_line(f"q{i}", market.served_model, prompt=prompt_of(i, 3), max_tokens=2,
                        bid=0.25)
        for i in range(3)
    ]  # fmt: skip
    with acme.http(gateway) as http:
        public_id = submit(http, lines)
        outcome = run(public_id)
        errors = results(http.get(f"/v1/batches/{public_id}/errors").text)
    assert (outcome["status"], outcome["completed"], outcome["failed"]) == ("completed", 0, 3)
    assert sorted(errors) == ["q0", "q1", "q2"]
    for row in errors.values():
        assert row["response"]["status_code"] == 503
        assert row["response"]["body"]["error"]["code"] == "engine_unavailable"
    assert LedgerEntry.objects.count() == 0
    assert set(Request.objects.values_list("status", flat=True)) == {"failed"}
    assert set(Hold.objects.values_list("state", flat=True)) == {HoldState.RELEASED}
    assert BudgetCounter.objects.get(tenant=acme.tenant, api_key=None).held == 0


def test_a_revoked_key_fails_the_lines_left_with_a_401(gateway, acme, market):
    from accounts.services import api_key_revoke

    lines = [completion_line("q", market.served_model, prompt=prompt_of(1, 2), max_tokens=1)]
    with acme.http(gateway) as http:
        public_id = submit(http, lines)
    api_key_revoke(api_key=acme.api_key)
    outcome = run(public_id)
    assert (outcome["completed"], outcome["failed"]) == (0, 1)
    item = BatchItem.objects.get()
    assert (item.status, item.status_code) == (ItemStatus.FAILED, 401)
    assert LedgerEntry.objects.count() == 0 and Hold.objects.count() == 0


def test_cancel_mid_run_cancels_pending_lines_and_lets_the_one_in_flight_finish(
    gateway, acme, market, settings, monkeypatch, tmp_path
):
    import threading

    from django.db import connection

    from openai_api.batches import run as batches_run
    from tests.pause_hooks import batch_pause

    settings.BATCH_CONCURRENCY = 1
    pause = tmp_path / "pause"
    pause.write_text("0")  # every admitted line waits before the engine while the file exists
    monkeypatch.setattr(batches_run, "BEFORE_FORWARD", [batch_pause(pause)])
    lines = [
        completion_line(f"q{i}", market.served_model, prompt=prompt_of(i, 3), max_tokens=2)
        for i in range(4)
    ]
    outcome: dict = {}

    def worker() -> None:
        try:
            outcome.update(run(public_id))
        finally:
            connection.close()

    with acme.http(gateway) as http:
        public_id = submit(http, lines)
        thread = threading.Thread(target=worker)
        thread.start()
        wait_until_true(lambda: Request.objects.filter(status="queued").count() == 1)
        cancelling = http.post(f"/v1/batches/{public_id}/cancel").json()
        pause.unlink()
        thread.join(timeout=60)
        final = http.get(f"/v1/batches/{public_id}").json()
        output = results(http.get(f"/v1/batches/{public_id}/output").text)
        errors = results(http.get(f"/v1/batches/{public_id}/errors").text)
    assert cancelling["status"] == "cancelling"
    assert cancelling["request_counts"]["cancelled"] == 3
    assert final["status"] == "cancelled" and final["cancelled_at"] is not None
    assert final["request_counts"] == {"total": 4, "completed": 1, "failed": 0, "cancelled": 3}
    assert outcome["status"] == "cancelled"
    assert list(output) == ["q0"] and sorted(errors) == ["q1", "q2", "q3"]
    # The line in flight, and only it, was charged (its tokens, and its priority: no bid, 0).
    (entry,) = LedgerEntry.objects.filter(kind=ChargeKind.TOKENS)
    assert LedgerEntry.objects.count() == 2
    assert entry.amount == charge_of(lines[0])


def wait_until_true(check, timeout_s: float = 30.0) -> None:
    from tests.openai_api.helpers import wait_until

    wait_until(check, timeout_s=timeout_s)
