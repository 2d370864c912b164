"""Invoices: generated once per tenant and period, exported as CSV, PDF and JSON."""

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from pypdf import PdfReader

from accounts.exports import CSV_HEADER, invoice_csv, invoice_json, invoice_pdf
from accounts.models import Invoice, InvoiceLine
from accounts.services import (
    invoice_generate,
    month_bounds,
    request_open,
    request_settle,
)
from tests.accounts.factories import market_create, priority_charge, tenant_create

pytestmark = pytest.mark.django_db

D = Decimal
NOV_START, NOV_END = month_bounds(year=2026, month=11)
AFTER_NOV = datetime(2026, 12, 2, tzinfo=UTC)


def served(tenant, market, rid, *, priority, tokens, at) -> None:
    """A request admitted with ``priority`` dollars and completed with ``tokens``
    (prompt, cached, completion; None: none, a token charge of 0). It pays its priority charge
    once served."""
    request_open(
        request_id=rid, tenant=tenant, api_key=None, market=market, bid="1", hold_amount="5", now=at
    )
    prompt, cached, completion = tokens or (0, 0, 0)
    request_settle(
        request_id=rid,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        priority=None if priority is None else priority_charge(priority, round_id=f"rd-{rid}"),
        now=at,
    )


@pytest.fixture
def november():
    """Tenant acme's November on two markets, plus charges outside it and another tenant's.

    test-llm ($3 in, $0.30 cached, $15 out per million):
      a1: priority 0.25; tokens 1200/1000/500 -> 0.0006 + 0.0003 + 0.0075 = 0.0084; line 0.2584
      a2: priority 0.5; no tokens;                                           line 0.5
    big-llm ($10 in, $1 cached, $30 out per million):
      a3: no priority entry; tokens 2000/0/1000 -> 0.02 + 0 + 0.03 = 0.05;   line 0.05
    test-llm sum: priority 0.75, tokens 0.0084, total 0.7584
    big-llm sum:  priority 0,    tokens 0.05,   total 0.05
    invoice: priority 0.75, tokens 0.0584, total 0.8084
    """
    acme, globex = tenant_create("acme"), tenant_create("globex")
    small = market_create("test-llm")
    big = market_create("big-llm")
    big.price_input_per_mtok, big.price_cached_input_per_mtok = D(10), D(1)
    big.price_output_per_mtok = D(30)
    big.save()
    nov = datetime(2026, 11, 10, tzinfo=UTC)
    served(acme, small, "a1", priority=0.25, tokens=(1200, 1000, 500), at=nov)
    served(acme, small, "a2", priority=0.5, tokens=None, at=nov + timedelta(hours=1))
    served(acme, big, "a3", priority=None, tokens=(2000, 0, 1000), at=nov + timedelta(hours=2))
    served(acme, small, "oct", priority=7.0, tokens=None, at=datetime(2026, 10, 31, 23, tzinfo=UTC))
    served(acme, small, "dec", priority=9.0, tokens=None, at=NOV_END)  # the end is excluded
    served(globex, small, "g1", priority=3.0, tokens=None, at=nov)
    return acme


def test_an_invoice_has_a_line_per_request_with_both_parts(november) -> None:
    invoice = invoice_generate(
        tenant=november, period_start=NOV_START, period_end=NOV_END, now=AFTER_NOV
    )
    assert (invoice.priority_total, invoice.tokens_total, invoice.total) == (
        D("0.75"),
        D("0.0584"),
        D("0.8084"),
    )
    lines = {
        line.request_id: (line.priority_amount, line.tokens_amount, line.total)
        for line in invoice.lines.all()
    }
    assert lines == {
        "a1": (D("0.25"), D("0.0084"), D("0.2584")),
        "a2": (D("0.5"), D(0), D("0.5")),
        "a3": (D(0), D("0.05"), D("0.05")),
    }


def test_invoice_generation_is_idempotent(november) -> None:
    first = invoice_generate(
        tenant=november, period_start=NOV_START, period_end=NOV_END, now=AFTER_NOV
    )
    again = invoice_generate(
        tenant=november, period_start=NOV_START, period_end=NOV_END, now=AFTER_NOV
    )
    assert again.pk == first.pk
    assert Invoice.objects.count() == 1 and InvoiceLine.objects.count() == 3


def test_an_invoice_needs_a_finished_period_that_overlaps_no_other(november) -> None:
    with pytest.raises(ValueError, match="not over"):
        invoice_generate(
            tenant=november,
            period_start=NOV_START,
            period_end=NOV_END,
            now=NOV_END - timedelta(seconds=1),
        )
    invoice_generate(tenant=november, period_start=NOV_START, period_end=NOV_END, now=AFTER_NOV)
    with pytest.raises(ValueError, match="overlaps"):
        invoice_generate(
            tenant=november,
            period_start=NOV_START + timedelta(days=1),
            period_end=NOV_END,
            now=AFTER_NOV,
        )
    with pytest.raises(ValueError):
        invoice_generate(tenant=november, period_start=NOV_END, period_end=NOV_START, now=AFTER_NOV)


def test_csv_has_request_lines_market_summaries_and_a_total(november) -> None:
    invoice = invoice_generate(
        tenant=november, period_start=NOV_START, period_end=NOV_END, now=AFTER_NOV
    )
    rows = list(csv.reader(io.StringIO(invoice_csv(invoice))))
    assert rows[0] == CSV_HEADER
    body = [dict(zip(CSV_HEADER, row, strict=True)) for row in rows[1:]]
    requests = [r for r in body if r["row"] == "request"]
    markets = [r for r in body if r["row"] == "market"]
    totals = [r for r in body if r["row"] == "total"]
    assert [r["row"] for r in body] == ["request"] * 3 + ["market"] * 2 + ["total"]
    a1 = next(r for r in requests if r["request_id"] == "a1")
    assert (
        a1["market"],
        a1["round_id"],
        a1["prompt_tokens"],
        a1["cached_tokens"],
        a1["completion_tokens"],
    ) == (
        "test-llm",
        "rd-a1",
        "1200",
        "1000",
        "500",
    )
    assert (a1["priority_usd"], a1["tokens_usd"], a1["total_usd"]) == (
        "0.250000000",
        "0.008400000",
        "0.258400000",
    )
    assert [(m["market"], m["priority_usd"], m["tokens_usd"], m["total_usd"]) for m in markets] == [
        ("big-llm", "0.000000000", "0.050000000", "0.050000000"),
        ("test-llm", "0.750000000", "0.008400000", "0.758400000"),
    ]
    assert (totals[0]["priority_usd"], totals[0]["tokens_usd"], totals[0]["total_usd"]) == (
        "0.750000000",
        "0.058400000",
        "0.808400000",
    )
    # The request lines add up to the total, exactly.
    assert sum(D(r["total_usd"]) for r in requests) == D(totals[0]["total_usd"])


def test_pdf_is_a_real_pdf_with_the_totals_in_cents(november) -> None:
    invoice = invoice_generate(
        tenant=november, period_start=NOV_START, period_end=NOV_END, now=AFTER_NOV
    )
    data = invoice_pdf(invoice)
    assert data.startswith(b"%PDF-")
    text = "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(data)).pages)
    assert "Tenant ACME" in text
    # priority 0.75; tokens 0.0584 -> $0.06; total 0.8084 -> $0.81
    assert "Priority charges (the auction) $0.75" in text
    assert "Token charges (posted prices) $0.06" in text
    assert "3 requests." in text
    assert "Total due $0.81" in text
    assert "Exact total USD 0.808400000" in text
    # a1, a2, a3 on 10 November, no key: 3 requests, prompt 1200 + 0 + 2000, cached 1000,
    # completion 500 + 1000
    assert "2026-11-10 3 3,200 1,000 1,500 $0.75 $0.06 $0.81" in text
    assert "console / no key 3 3,200 1,000 1,500 $0.75 $0.06 $0.81" in text
    assert "big-llm 1 2,000 0 1,000 $0.00 $0.05 $0.05" in text
    assert "test-llm 2 1,200 1,000 500 $0.75 $0.01 $0.76" in text  # tokens 0.0084 -> $0.01
    assert "g1" not in text and "7.00" not in text and "9.00" not in text


def test_pdf_of_many_requests_summarises_them_on_one_page(november) -> None:
    market = market_create("many-llm")
    at = datetime(2026, 11, 20, tzinfo=UTC)
    for i in range(120):
        served(november, market, f"m{i:03d}", priority=0.001, tokens=None, at=at)
    invoice = invoice_generate(
        tenant=november, period_start=NOV_START, period_end=NOV_END, now=AFTER_NOV
    )
    (page,) = PdfReader(io.BytesIO(invoice_pdf(invoice))).pages  # a line per day, not request
    text = page.extract_text()
    # 0.8084 + 120 x 0.001 = 0.9284 -> $0.93; the 20th: 120 x 0.001 = $0.12
    assert "Total due $0.93" in text
    assert "2026-11-20 120 0 0 0 $0.12 $0.00 $0.12" in text
    assert "Page 1 of 1" in text


def test_json_carries_exact_amounts(november) -> None:
    invoice = invoice_generate(
        tenant=november, period_start=NOV_START, period_end=NOV_END, now=AFTER_NOV
    )
    data = invoice_json(invoice)
    assert (data["tenant"], data["total"], data["priority_total"], data["tokens_total"]) == (
        "acme",
        "0.808400000",
        "0.750000000",
        "0.058400000",
    )
    assert {line["request_id"]: line["total"] for line in data["lines"]} == {
        "a1": "0.258400000",
        "a2": "0.500000000",
        "a3": "0.050000000",
    }
    assert [m["market"] for m in data["markets"]] == ["big-llm", "test-llm"]
