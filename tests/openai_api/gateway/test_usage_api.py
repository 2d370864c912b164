"""``GET /v1/organization/usage/completions`` and ``GET /v1/organization/costs``: a program
reads, with its API key, its tenant's tokens and charges per time bucket, from the ledger.

Hand-built rows over two UTC days from ``T0`` (2026-11-17 00:00 UTC), tenant A (acme) with two
keys (P, its program key, and S) and two markets, tenant B (globex) with one request. Every
figure below is worked by hand from the table in ``world``; each answer is also checked
against the OpenAPI document's schema.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import pytest

from accounts.models import ChargeKind, LedgerEntry, Request, RequestStatus
from accounts.services import api_key_create
from tests.openai_api.conftest import market_create
from tests.openai_api.openapi.schema_check import checked
from tests.personas import program_create

T0_DT = datetime(2026, 11, 17, tzinfo=UTC)
T0 = 1_794_873_600  # 2026-11-17T00:00:00Z: 20,774 days x 86,400 s since 1970-01-01
DAY, HOUR = 86_400, 3_600
USAGE, COSTS = "/v1/organization/usage/completions", "/v1/organization/costs"


def test_t0_is_the_unix_second_written():
    assert T0_DT.timestamp() == T0 and T0 == 20_774 * DAY


@pytest.fixture
def world(acme, transactional_db) -> dict:
    """The rows: (id, tenant, key, market, class, finished at T0+s, prompt, cached, completion,
    status, token charge, priority charge).

    a1  A P m1 interactive   0      100  40  10 served 0.001000000 0.000500000  (day 1's edge)
    a5  A P m1 interactive   3600   999   0 999 failed -           -            (never counted)
    a2  A S m1 batch         86399  200   0  20 served 0.002000000 -            (day 1's last s)
    a3  A P m2 interactive   86400  300 100  30 served 0.003000000 0.000250000  (day 2's edge)
    a4  A S m2 interactive   90000   50  50   5 served 0.000123456 0.000000001
    a6  A P m1 interactive   172800   7   0   7 served 0.500000000 -            (window's end)
    b1  B B m1 interactive   100   1000   0 1000 served 9.000000000 1.000000000 (other tenant)
    """
    globex = program_create("globex")
    second, second_key = api_key_create(tenant=acme.tenant, name="second", created_by=None)
    m1 = market_create(engine_url="http://127.0.0.1:9", slug="usage-m1")
    m2 = market_create(engine_url="http://127.0.0.1:9", slug="usage-m2")
    rows = [
        ("a1", acme.tenant, acme.api_key, m1, "interactive", 0, 100, 40, 10, "served",
         "0.001", "0.0005"),
        ("a5", acme.tenant, acme.api_key, m1, "interactive", 3600, 999, 0, 999, "failed",
         None, None),
        ("a2", acme.tenant, second, m1, "batch", 86399, 200, 0, 20, "served", "0.002", None),
        ("a3", acme.tenant, acme.api_key, m2, "interactive", 86400, 300, 100, 30, "served",
         "0.003", "0.00025"),
        ("a4", acme.tenant, second, m2, "interactive", 90000, 50, 50, 5, "served",
         "0.000123456", "0.000000001"),
        ("a6", acme.tenant, acme.api_key, m1, "interactive", 172800, 7, 0, 7, "served",
         "0.5", None),
        ("b1", globex.tenant, globex.api_key, m1, "interactive", 100, 1000, 0, 1000, "served",
         "9", "1"),
    ]  # fmt: skip
    for rid, tenant, key, market, klass, at_s, prompt, cached, completion, status, tok, pri in rows:
        at = T0_DT + timedelta(seconds=at_s)
        request = Request.objects.create(
            request_id=rid, tenant=tenant, api_key=key, market=market, request_class=klass,
            status=RequestStatus(status), created_at=at - timedelta(seconds=1), finished_at=at,
            prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion,
        )  # fmt: skip
        for kind, amount in ((ChargeKind.TOKENS, tok), (ChargeKind.PRIORITY, pri)):
            if amount is not None:
                LedgerEntry.objects.create(
                    request=request, kind=kind, tenant=tenant, api_key=key, market=market,
                    amount=Decimal(amount), created_at=at, detail={},
                )  # fmt: skip
    return {
        "a": acme.key,
        "a_second": second_key,
        "b": globex.key,
        "p_id": f"im_{acme.api_key.prefix}",
        "s_id": f"im_{second.prefix}",
    }


def _get(gateway, key: str, path: str, **params) -> httpx.Response:
    return httpx.get(
        f"{gateway.url}{path}",
        params=params,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def _read(gateway, key: str, path: str, **params) -> dict:
    answer = _get(gateway, key, path, **params)
    assert answer.status_code == 200, answer.text
    return checked(answer, path)


def _tokens(result: dict) -> tuple[int, int, int, int]:
    return (
        result["input_tokens"],
        result["input_cached_tokens"],
        result["output_tokens"],
        result["num_model_requests"],
    )


TWO_DAYS = {"start_time": T0, "end_time": T0 + 2 * DAY}


def test_usage_per_day_counts_served_requests_with_the_edges_in_the_later_bucket(gateway, world):
    page = _read(gateway, world["a"], USAGE, **TWO_DAYS)
    assert (page["object"], page["has_more"], page["next_page"]) == ("page", False, None)
    assert [(b["object"], b["start_time"], b["end_time"]) for b in page["data"]] == [
        ("bucket", T0, T0 + DAY),
        ("bucket", T0 + DAY, T0 + 2 * DAY),
    ]
    day1, day2 = (b["results"] for b in page["data"])
    # day 1: a1 + a2 (a5 failed, b1 is B's); day 2: a3 + a4 (a6 at the window's end is out)
    assert [_tokens(r) for r in day1] == [(100 + 200, 40 + 0, 10 + 20, 2)]
    assert [_tokens(r) for r in day2] == [(300 + 50, 100 + 50, 30 + 5, 2)]
    assert day1[0]["object"] == "organization.usage.completions.result"
    assert day1[0]["model"] is None and day1[0]["api_key_id"] is None


def test_usage_grouped_by_key_and_by_model_and_class(gateway, world):
    by_key = _read(gateway, world["a"], USAGE, group_by="api_key_id", **TWO_DAYS)
    p, s = world["p_id"], world["s_id"]
    assert [{r["api_key_id"]: _tokens(r) for r in b["results"]} for b in by_key["data"]] == [
        {p: (100, 40, 10, 1), s: (200, 0, 20, 1)},
        {p: (300, 100, 30, 1), s: (50, 50, 5, 1)},
    ]
    by_model = _read(gateway, world["a"], USAGE, group_by="model,market", **TWO_DAYS)
    assert [
        [(r["model"], r["market"], _tokens(r)) for r in b["results"]] for b in by_model["data"]
    ] == [
        [("org/usage-m1", "usage-m1", (300, 40, 30, 2))],
        [("org/usage-m2", "usage-m2", (350, 150, 35, 2))],
    ]
    by_class = _read(gateway, world["a"], USAGE, **{"group_by[]": "request_class"}, **TWO_DAYS)
    assert [{r["request_class"]: _tokens(r) for r in b["results"]} for b in by_class["data"]] == [
        {"interactive": (100, 40, 10, 1), "batch": (200, 0, 20, 1)},
        {"interactive": (350, 150, 35, 2)},
    ]


def test_costs_per_day_and_per_line_item_in_exact_dollars(gateway, world):
    page = _read(gateway, world["a"], COSTS, **TWO_DAYS)
    # day 1: 0.001 + 0.0005 + 0.002; day 2: 0.003 + 0.00025 + 0.000123456 + 0.000000001
    assert [
        [(r["object"], r["amount"], r["line_item"]) for r in b["results"]] for b in page["data"]
    ] == [
        [("organization.costs.result", {"value": "0.003500000", "currency": "usd"}, None)],
        [("organization.costs.result", {"value": "0.003373457", "currency": "usd"}, None)],
    ]
    items = _read(gateway, world["a"], COSTS, group_by="line_item", **TWO_DAYS)
    assert [
        {r["line_item"]: r["amount"]["value"] for r in b["results"]} for b in items["data"]
    ] == [
        {"tokens": "0.003000000", "priority": "0.000500000"},
        {"tokens": "0.003123456", "priority": "0.000250001"},
    ]


def test_buckets_are_clipped_to_the_window_and_half_open(gateway, world):
    # Two seconds across day 1's end: a2 (T0+86399) in the first, a3 (T0+86400) in the second.
    page = _read(gateway, world["a"], USAGE, start_time=T0 + DAY - 1, end_time=T0 + DAY + 1)
    assert [(b["start_time"], b["end_time"], [_tokens(r) for r in b["results"]])
            for b in page["data"]] == [
        (T0 + DAY - 1, T0 + DAY, [(200, 0, 20, 1)]),
        (T0 + DAY, T0 + DAY + 1, [(300, 100, 30, 1)]),
    ]  # fmt: skip
    # Up to the window's end: a6 at T0+2 days is counted once end_time passes it.
    later = _read(gateway, world["a"], COSTS, start_time=T0 + 2 * DAY, end_time=T0 + 2 * DAY + 1)
    assert [[r["amount"]["value"] for r in b["results"]] for b in later["data"]] == [
        ["0.500000000"]
    ]


def test_pages_follow_next_page_with_empty_buckets_kept(gateway, world):
    window = {"start_time": T0, "end_time": T0 + 3 * HOUR, "bucket_width": "1h", "limit": 2}
    first = _read(gateway, world["a"], USAGE, **window)
    assert [(b["start_time"], [_tokens(r) for r in b["results"]]) for b in first["data"]] == [
        (T0, [(100, 40, 10, 1)]),  # a1
        (T0 + HOUR, []),  # a5 failed
    ]
    assert (first["has_more"], first["next_page"]) == (True, str(T0 + 2 * HOUR))
    second = _read(gateway, world["a"], USAGE, page=first["next_page"], **window)
    assert [(b["start_time"], b["end_time"], b["results"]) for b in second["data"]] == [
        (T0 + 2 * HOUR, T0 + 3 * HOUR, [])
    ]
    assert (second["has_more"], second["next_page"]) == (False, None)
    # 1d's default limit is 7 buckets: ten days make a page of 7 and one of 3.
    ten = {"start_time": T0, "end_time": T0 + 10 * DAY}
    week = _read(gateway, world["a"], COSTS, **ten)
    assert len(week["data"]) == 7 and week["next_page"] == str(T0 + 7 * DAY)
    rest = _read(gateway, world["a"], COSTS, page=week["next_page"], **ten)
    assert [b["start_time"] for b in rest["data"]] == [T0 + 7 * DAY, T0 + 8 * DAY, T0 + 9 * DAY]
    assert [b["results"] for b in rest["data"]] == [[], [], []]


def test_a_key_sees_only_its_own_tenant(gateway, world):
    usage = _read(gateway, world["b"], USAGE, **TWO_DAYS)
    assert [[_tokens(r) for r in b["results"]] for b in usage["data"]] == [
        [(1000, 0, 1000, 1)],
        [],
    ]
    costs = _read(gateway, world["b"], COSTS, group_by="line_item", **TWO_DAYS)
    assert [
        {r["line_item"]: r["amount"]["value"] for r in b["results"]} for b in costs["data"]
    ] == [
        {"tokens": "9.000000000", "priority": "1.000000000"},
        {},
    ]
    # A's second key sees all of A (its tenant's usage), and nothing of B.
    second = _read(gateway, world["a_second"], USAGE, group_by="api_key_id", **TWO_DAYS)
    assert {r["api_key_id"] for b in second["data"] for r in b["results"]} == {
        world["p_id"],
        world["s_id"],
    }


@pytest.mark.parametrize(
    ("path", "params", "param"),
    [
        (USAGE, {}, "start_time"),
        (USAGE, {"start_time": "-5"}, "start_time"),
        (USAGE, {"start_time": "1.5"}, "start_time"),
        (USAGE, {"start_time": "99999999999999"}, "start_time"),
        (USAGE, {"start_time": T0, "end_time": T0}, "end_time"),
        (USAGE, {"start_time": T0, "bucket_width": "2h"}, "bucket_width"),
        (USAGE, {"start_time": T0, "group_by": "line_item"}, "group_by"),
        (USAGE, {"start_time": T0, "group_by": "project_id"}, "group_by"),
        (USAGE, {"start_time": T0, "limit": "0"}, "limit"),
        (USAGE, {"start_time": T0, "limit": "32"}, "limit"),
        (USAGE, {"start_time": T0, "bucket_width": "1m", "limit": "1441"}, "limit"),
        (USAGE, {"start_time": T0, "end_time": T0 + DAY, "page": T0 + DAY}, "page"),
        (USAGE, {"start_time": T0, "end_time": T0 + DAY, "page": T0 + 5}, "page"),
        (USAGE, {"start_time": T0, "models": "org/usage-m1"}, "models"),
        (COSTS, {"start_time": T0, "group_by": "project_id"}, "group_by"),
        (COSTS, {"start_time": T0, "bucket_width": "1w"}, "bucket_width"),
    ],
)
def test_bad_parameters_are_400_naming_the_field(gateway, world, path, params, param):
    answer = _get(gateway, world["a"], path, **params)
    assert answer.status_code == 400, answer.text
    body = checked(answer, path)
    assert (body["error"]["param"], body["error"]["code"]) == (param, "malformed_request")


def test_no_key_is_401(gateway, world):
    answer = httpx.get(f"{gateway.url}{USAGE}", params={"start_time": T0}, timeout=30)
    assert answer.status_code == 401
    assert checked(answer, USAGE)["error"]["code"] == "invalid_api_key"
