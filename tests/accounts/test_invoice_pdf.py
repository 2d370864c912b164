"""The invoice people read: the PDF (and the invoice page) summarise by day, API key and market
in cents, with the issuer, the tenant billed, the dates and page numbers; the CSV keeps every
request at 9 places, and its token columns mean what the PDF's do.

Expected figures are worked out by hand in the fixture's docstring, never read from the code.
"""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from pypdf import PdfReader

from accounts.exports import CSV_HEADER, invoice_csv, invoice_pdf
from accounts.models import ApiKey, Invoice
from accounts.services import (
    api_key_create,
    invoice_generate,
    month_bounds,
    request_open,
    request_settle,
)
from tests.accounts.factories import (
    PASSWORD,
    market_create,
    priority_charge,
    tenant_create,
    user_create,
)

pytestmark = pytest.mark.django_db

D = Decimal
NOV_START, NOV_END = month_bounds(year=2026, month=11)
ISSUED = datetime(2026, 12, 2, 9, 30, tzinfo=UTC)  # the invoice is made on 2 December


def charged(tenant, market, rid, *, key=None, opened, settled=None, priority=None, tokens) -> None:
    """A request opened at ``opened`` and settled at ``settled`` (the same time unless said)
    with ``priority`` dollars (None: no priority charge) and ``tokens`` (prompt, of which
    cached, completion)."""
    request_open(
        request_id=rid,
        tenant=tenant,
        api_key=key,
        market=market,
        bid="1",
        hold_amount="5",
        now=opened,
    )
    prompt, cached, completion = tokens
    request_settle(
        request_id=rid,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        priority=None if priority is None else priority_charge(priority, round_id=f"rd-{rid}"),
        now=settled or opened,
    )


@dataclass(frozen=True)
class Billed:
    """The invoice and the keys its requests came through."""

    invoice: Invoice
    web: ApiKey
    batch: ApiKey


@pytest.fixture
def billed(settings) -> Billed:
    """Acme's November on test-llm ($3 uncached, $0.30 cached, $15 completion per million),
    through keys "web" and "batch" and without a key; issued 2026-12-02, due 14 days later.
    (Request ids below without their "req-" prefix.)

      w1 web, 11-03 10:00: priority 0.125; tokens 1000/400/200:
         600 x 3 + 400 x 0.3 + 200 x 15 = 1800 + 120 + 3000 = 4920 micro$ = 0.00492
      w2 web, opened 11-03 23:59:50, charged 11-04 00:00:05 (so on the 4th): priority 0.3;
         tokens 2000/0/100: 6000 + 1500 micro$ = 0.0075
      b1 batch, 11-04 02:00: no priority charge; tokens 10000/8000/1000:
         2000 x 3 + 8000 x 0.3 + 1000 x 15 = 6000 + 2400 + 15000 micro$ = 0.0234
      c1 no key, 11-20 12:00: priority 0.004; tokens 100/0/10: 300 + 150 micro$ = 0.00045

    By day:   11-03  1 req, 1000/400/200,    priority 0.125 ($0.13, half up), tokens 0.00492
                     (< $0.01), total 0.12992 ($0.13)
              11-04  2 req, 12000/8000/1100, priority 0.3 ($0.30), tokens 0.0309 ($0.03),
                     total 0.3309 ($0.33)
              11-20  1 req, 100/0/10, priority 0.004, tokens 0.00045, total 0.00445 (all < $0.01)
    By key:   batch  1 req, 10000/8000/1000, $0.00, tokens 0.0234 ($0.02), total $0.02
              web    2 req, 3000/400/300, priority 0.425 ($0.43, half up), tokens 0.01242
                     ($0.01), total 0.43742 ($0.44)
              console / no key: c1 as above
    Total: 4 req, 13100/8400/1310, priority 0.429 ($0.43), tokens 0.03627 ($0.04), total
           0.46527: $0.47 due (the rows' $0.13 + $0.33 + < $0.01 differ by a cent: rounded apart)
    """
    settings.INVOICE_ISSUER_NAME = "Nano Auctions GmbH"
    settings.INVOICE_ISSUER_ADDRESS = ["Marktplatz 1", "10115 Berlin"]
    settings.INVOICE_DUE_DAYS = 14
    acme, globex = tenant_create("acme"), tenant_create("globex")
    market = market_create("test-llm")
    web, _ = api_key_create(tenant=acme, name="web", created_by=None)
    batch, _ = api_key_create(tenant=acme, name="batch", created_by=None)
    nov = NOV_START
    charged(acme, market, "req-w1", key=web, opened=nov + timedelta(days=2, hours=10),
            priority="0.125", tokens=(1000, 400, 200))  # fmt: skip
    charged(acme, market, "req-w2", key=web, opened=nov + timedelta(days=3, seconds=-10),
            settled=nov + timedelta(days=3, seconds=5), priority="0.3",
            tokens=(2000, 0, 100))  # fmt: skip
    charged(acme, market, "req-b1", key=batch, opened=nov + timedelta(days=3, hours=2),
            tokens=(10000, 8000, 1000))  # fmt: skip
    charged(acme, market, "req-c1", opened=nov + timedelta(days=19, hours=12), priority="0.004",
            tokens=(100, 0, 10))  # fmt: skip
    charged(globex, market, "req-g1", opened=nov + timedelta(days=5), priority="9",
            tokens=(1, 0, 1))  # fmt: skip
    invoice = invoice_generate(tenant=acme, period_start=NOV_START, period_end=NOV_END, now=ISSUED)
    return Billed(invoice=invoice, web=web, batch=batch)


@pytest.fixture
def invoice(billed: Billed) -> Invoice:
    return billed.invoice


AMOUNT = r"(?:\$[\d,]+\.\d\d|< \$0\.01)"
ROW = re.compile(
    rf"(?P<label>\S.*?) (?P<requests>[\d,]+) (?P<prompt>[\d,]+) (?P<cached>[\d,]+) "
    rf"(?P<completion>[\d,]+) (?P<priority>{AMOUNT}) (?P<tokens>{AMOUNT}) (?P<total>{AMOUNT})"
)


def pdf_pages(data: bytes) -> list[str]:
    return [page.extract_text() for page in PdfReader(io.BytesIO(data)).pages]


def pdf_table(text: str, title: str) -> dict[str, tuple[str, ...]]:
    """The rows of the summary table under ``title``, by label: (requests, prompt, cached,
    completion, priority, tokens, total) as printed."""
    section = text.split(title, 1)[1].split("Usage by", 1)[0].split("Amounts are in", 1)[0]
    body = " ".join(section.split("Total $", 1)[1].split())  # past the headings, one line
    return {
        m["label"]: (
            m["requests"],
            m["prompt"],
            m["cached"],
            m["completion"],
            m["priority"],
            m["tokens"],
            m["total"],
        )  # fmt: skip
        for m in ROW.finditer(body)
    }


def key_label(key) -> str:
    return f"{key.name} (im_{key.prefix}_...)"


def test_pdf_summarises_by_day_in_cents(invoice) -> None:
    text = "\n".join(pdf_pages(invoice_pdf(invoice)))
    assert pdf_table(text, "Usage by day (UTC)") == {
        "2026-11-03": ("1", "1,000", "400", "200", "$0.13", "< $0.01", "$0.13"),
        "2026-11-04": ("2", "12,000", "8,000", "1,100", "$0.30", "$0.03", "$0.33"),
        "2026-11-20": ("1", "100", "0", "10", "< $0.01", "< $0.01", "< $0.01"),
        "Total": ("4", "13,100", "8,400", "1,310", "$0.43", "$0.04", "$0.47"),
    }
    # Request-level detail is the CSV's. (The ids carry a prefix no key prefix's hex can hold.)
    assert "req-" not in text


def test_pdf_summarises_by_api_key_with_requests_without_a_key_last(billed) -> None:
    text = "\n".join(pdf_pages(invoice_pdf(billed.invoice)))
    table = pdf_table(text, "Usage by API key")
    web, batch = key_label(billed.web), key_label(billed.batch)
    assert table == {
        batch: ("1", "10,000", "8,000", "1,000", "$0.00", "$0.02", "$0.02"),
        web: ("2", "3,000", "400", "300", "$0.43", "$0.01", "$0.44"),
        "console / no key": ("1", "100", "0", "10", "< $0.01", "< $0.01", "< $0.01"),
        "Total": ("4", "13,100", "8,400", "1,310", "$0.43", "$0.04", "$0.47"),
    }
    assert list(table) == [batch, web, "console / no key", "Total"]
    assert pdf_table(text, "Usage by market") == {
        "test-llm": ("4", "13,100", "8,400", "1,310", "$0.43", "$0.04", "$0.47"),
        "Total": ("4", "13,100", "8,400", "1,310", "$0.43", "$0.04", "$0.47"),
    }


def test_pdf_has_the_issuer_the_tenant_the_dates_and_the_total_due_in_cents(invoice) -> None:
    (text,) = pdf_pages(invoice_pdf(invoice))
    lines = text.splitlines()
    assert lines[:3] == ["Nano Auctions GmbH", "Marktplatz 1", "10115 Berlin"]
    assert "Tenant ACME" in text and "Tenant account: acme" in text
    assert f"Invoice number {invoice.number}" in text
    assert "Issue date 2026-12-02" in text
    assert "Due date 2026-12-16" in text  # 2 December + 14 days
    assert "Period 2026-11-01 to 2026-11-30 (UTC)" in text
    assert "Priority charges (the auction) $0.43" in text
    assert "Token charges (posted prices) $0.04" in text
    assert "Total due $0.47" in text
    assert "4 requests. Due by 2026-12-16. Exact total USD 0.465270000, rounded half up." in text
    assert "globex" not in text.lower() and "9.00" not in text
    assert text.rstrip().endswith(f"Nano Auctions GmbH - Invoice {invoice.number} Page 1 of 1")


def test_pdf_token_headings_are_the_csvs(invoice) -> None:
    text = "\n".join(pdf_pages(invoice_pdf(invoice)))
    headings = " ".join(text.split("Usage by day (UTC)", 1)[1].split("Total $", 1)[0].split())
    assert headings == (
        "Date Requests prompt_tokens (all) cached_tokens (of which cached) completion_tokens "
        "Priority $ Tokens $"
    )
    for name in ("prompt_tokens", "cached_tokens", "completion_tokens"):
        assert name in CSV_HEADER
    notes = " ".join(text.split())
    assert "prompt_tokens counts all prompt tokens, cached_tokens those of them that" in notes


def test_csv_keeps_exact_amounts_and_its_tokens_agree_with_the_pdf(invoice) -> None:
    reader = csv.reader(io.StringIO(invoice_csv(invoice)))
    rows = [dict(zip(CSV_HEADER, r, strict=True)) for r in reader][1:]
    requests = {r["request_id"]: r for r in rows if r["row"] == "request"}
    assert {
        rid: (r["priority_usd"], r["tokens_usd"], r["total_usd"]) for rid, r in requests.items()
    } == {
        "req-w1": ("0.125000000", "0.004920000", "0.129920000"),
        "req-w2": ("0.300000000", "0.007500000", "0.307500000"),
        "req-b1": ("0.000000000", "0.023400000", "0.023400000"),
        "req-c1": ("0.004000000", "0.000450000", "0.004450000"),
    }
    (total,) = [r for r in rows if r["row"] == "total"]
    assert (total["priority_usd"], total["tokens_usd"], total["total_usd"]) == (
        "0.429000000",
        "0.036270000",
        "0.465270000",
    )
    for row in rows:
        for column in ("priority_usd", "tokens_usd", "total_usd"):
            assert re.fullmatch(r"\d+\.\d{9}", row[column]), (row, column)
    # The CSV's prompt_tokens is all prompt tokens, as the PDF's: the same sums, per market
    # and in all, brute force over the CSV's request rows.
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for r in requests.values():
        for name in (r["market"], "Total"):
            tokens = (r["prompt_tokens"], r["cached_tokens"], r["completion_tokens"])
            counts = (1, *map(int, tokens))
            sums[name] = [a + b for a, b in zip(sums[name], counts, strict=True)]
    assert requests["req-w1"]["prompt_tokens"] == "1000"  # not 600, the uncached part
    text = "\n".join(pdf_pages(invoice_pdf(invoice)))
    table = pdf_table(text, "Usage by market")
    assert {
        label: [int(cell.replace(",", "")) for cell in cells[:4]] for label, cells in table.items()
    } == dict(sums)


def test_pdf_of_many_days_numbers_every_page(billed) -> None:
    market = market_create("many-llm")
    invoice, web = billed.invoice, billed.web
    for day in range(28):
        charged(invoice.tenant, market, f"d{day:02d}", key=web,
                opened=datetime(2026, 10, 1, tzinfo=UTC) + timedelta(days=day, hours=12),
                priority="0.01", tokens=(10, 0, 10))  # fmt: skip
    october = invoice_generate(
        tenant=invoice.tenant,
        period_start=datetime(2026, 10, 1, tzinfo=UTC),
        period_end=NOV_START,
        now=ISSUED,
    )
    pages = pdf_pages(invoice_pdf(october))
    assert len(pages) >= 2
    for number, text in enumerate(pages, 1):
        assert text.rstrip().endswith(f"Page {number} of {len(pages)}"), text[-200:]
        assert october.number in text  # every page says which invoice it is part of
    days = pdf_table("\n".join(pages), "Usage by day (UTC)")
    assert len(days) == 28 + 1  # a row per day, then the total
    # 28 x (0.01 + 10 x $3 + 10 x $15 per million = 0.01018) = 0.28504: $0.29
    assert "Total due $0.29" in pages[0]


def test_the_invoice_page_shows_the_summaries_in_cents(client, invoice) -> None:
    user_create("acme-viewer", tenant=invoice.tenant)
    client.login(username="acme-viewer", password=PASSWORD)
    html = client.get(f"/tenants/acme/invoices/{invoice.pk}/").content.decode()
    text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    assert "Total due: $0.47" in text
    assert "due 2026-12-16" in text and "Nano Auctions GmbH" in text
    assert "2026-11-04 2 12000 8000 1100 $0.30 $0.03 $0.33" in text
    assert "console / no key 1 100 0 10 &lt; $0.01 &lt; $0.01 &lt; $0.01" in text
    assert "0.465270000" not in text  # exact amounts are the CSV's
    listing = client.get("/tenants/acme/invoices/").content.decode()
    listing_text = " ".join(re.sub(r"<[^>]+>", " ", listing).split())
    assert "2026-11-01 to 2026-11-30 2026-12-16 $0.43 $0.04 $0.47" in listing_text


def test_pdf_of_a_month_without_charges_says_so(settings) -> None:
    idle = tenant_create("idle")
    invoice = invoice_generate(tenant=idle, period_start=NOV_START, period_end=NOV_END, now=ISSUED)
    (text,) = pdf_pages(invoice_pdf(invoice))
    assert "Total due $0.00" in text and "No charges in this period." in text
    assert "Usage by day" not in text and "Page 1 of 1" in text
