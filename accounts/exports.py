"""Invoice exports: CSV, JSON and PDF. Every amount is the exact ledger amount (dollars, 9
decimal places); nothing is rounded again for display.

CSV: a header, a ``request`` row per request with both parts, a ``market`` summary row per
market, then one ``total`` row.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from fpdf import FPDF

from accounts.models import Invoice, InvoiceLine
from accounts.money import ZERO, money_str
from accounts.selectors.billing import invoice_lines

CSV_HEADER = [
    "row",
    "request_id",
    "market",
    "round_id",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "priority_usd",
    "tokens_usd",
    "total_usd",
]


@dataclass
class MarketSummary:
    market: str
    requests: int = 0
    priority: Decimal = ZERO
    tokens: Decimal = ZERO

    @property
    def total(self) -> Decimal:
        return self.priority + self.tokens


def market_summaries(lines: Iterable[InvoiceLine]) -> list[MarketSummary]:
    """Per-market sums of ``lines``, by market slug."""
    summaries: dict[str, MarketSummary] = {}
    for line in lines:
        s = summaries.setdefault(line.market.slug, MarketSummary(market=line.market.slug))
        s.requests += 1
        s.priority += line.priority_amount
        s.tokens += line.tokens_amount
    return [summaries[k] for k in sorted(summaries)]


def invoice_csv(invoice: Invoice) -> str:
    """The invoice as CSV text."""
    lines = list(invoice_lines(invoice=invoice))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for line in lines:
        writer.writerow(
            [
                "request",
                line.request_id,
                line.market.slug,
                line.round_id,
                line.prompt_tokens,
                line.cached_tokens,
                line.completion_tokens,
                money_str(line.priority_amount),
                money_str(line.tokens_amount),
                money_str(line.total),
            ]
        )
    for s in market_summaries(lines):
        amounts = [money_str(s.priority), money_str(s.tokens), money_str(s.total)]
        writer.writerow(["market", "", s.market, "", "", "", "", *amounts])
    totals = [invoice.priority_total, invoice.tokens_total, invoice.total]
    writer.writerow(["total", "", "", "", "", "", "", *map(money_str, totals)])
    return out.getvalue()


def invoice_json(invoice: Invoice, *, with_lines: bool = True) -> dict[str, object]:
    """The invoice as JSON-ready data; amounts are strings (exact decimals, dollars)."""
    data: dict[str, object] = {
        "id": invoice.pk,
        "number": invoice.number,
        "tenant": invoice.tenant.slug,
        "period_start": invoice.period_start.isoformat(),
        "period_end": invoice.period_end.isoformat(),
        "currency": "USD",
        "priority_total": money_str(invoice.priority_total),
        "tokens_total": money_str(invoice.tokens_total),
        "total": money_str(invoice.total),
        "created_at": invoice.created_at.isoformat(),
    }
    if with_lines:
        lines = list(invoice_lines(invoice=invoice))
        data["lines"] = [
            {
                "request_id": line.request_id,
                "market": line.market.slug,
                "round_id": line.round_id,
                "prompt_tokens": line.prompt_tokens,
                "cached_tokens": line.cached_tokens,
                "completion_tokens": line.completion_tokens,
                "priority": money_str(line.priority_amount),
                "tokens": money_str(line.tokens_amount),
                "total": money_str(line.total),
            }
            for line in lines
        ]
        data["markets"] = [
            {
                "market": s.market,
                "requests": s.requests,
                "priority": money_str(s.priority),
                "tokens": money_str(s.tokens),
                "total": money_str(s.total),
            }
            for s in market_summaries(lines)
        ]
    return data


def _latin1(text: str) -> str:
    """The PDF's core font speaks Latin-1; anything else becomes '?'."""
    return text.encode("latin-1", "replace").decode("latin-1")


# Column widths (mm) of the request table: request, market, tokens in/cached/out, parts, total.
_WIDTHS = (52, 28, 16, 16, 16, 22, 22, 22)


def invoice_pdf(invoice: Invoice) -> bytes:
    """The invoice as a PDF document (A4), a line per request, a summary per market, the total."""
    lines = list(invoice_lines(invoice=invoice))
    pdf = FPDF(orientation="P", unit="mm", format="A4")
    pdf.set_title(_latin1(f"Invoice {invoice.number}"))
    pdf.set_auto_page_break(auto=True, margin=15)
    pdf.add_page()
    pdf.set_font("Helvetica", "B", 16)
    pdf.cell(0, 10, _latin1(f"Invoice {invoice.number}"), new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("Helvetica", "", 10)
    for text in (
        f"Tenant: {invoice.tenant.name} ({invoice.tenant.slug})",
        f"Period: {invoice.period_start:%Y-%m-%d %H:%M} to {invoice.period_end:%Y-%m-%d %H:%M} UTC",
        "Amounts in US dollars, exact to 9 decimal places.",
    ):
        pdf.cell(0, 6, _latin1(text), new_x="LMARGIN", new_y="NEXT")
    pdf.ln(4)

    def row(cells: list[str], bold: bool = False) -> None:
        pdf.set_font("Helvetica", "B" if bold else "", 7)
        for i, (width, text) in enumerate(zip(_WIDTHS, cells, strict=True)):
            pdf.cell(width, 5, _latin1(text), border=1, align="L" if i < 2 else "R")
        pdf.ln(5)

    row(["Request", "Market", "Input", "Cached", "Output", "Priority", "Tokens", "Total"], True)
    for line in lines:
        row(
            [
                line.request_id[:40],
                line.market.slug[:20],
                str(line.prompt_tokens - line.cached_tokens),
                str(line.cached_tokens),
                str(line.completion_tokens),
                money_str(line.priority_amount),
                money_str(line.tokens_amount),
                money_str(line.total),
            ]
        )
    pdf.ln(4)
    pdf.set_font("Helvetica", "B", 10)
    pdf.cell(0, 7, "Summary by market", new_x="LMARGIN", new_y="NEXT")
    for s in market_summaries(lines):
        row(
            [
                f"{s.requests} requests",
                s.market[:20],
                "",
                "",
                "",
                *map(money_str, (s.priority, s.tokens, s.total)),
            ]
        )
    pdf.ln(4)
    pdf.set_font("Helvetica", "B", 11)
    for label, amount in (
        ("Priority total", invoice.priority_total),
        ("Tokens total", invoice.tokens_total),
        ("Total due", invoice.total),
    ):
        pdf.cell(0, 7, f"{label}: USD {money_str(amount)}", new_x="LMARGIN", new_y="NEXT")
    return bytes(pdf.output())
