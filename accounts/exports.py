"""Invoice exports: CSV and JSON for programs, PDF for people.

CSV and JSON carry every amount exactly as the ledger holds it (dollars, 9 decimal places):
the CSV has a header, a ``request`` row per request with both parts, a ``market`` summary row
per market, then one ``total`` row.

The PDF is the invoice a person reads: the issuer (``INVOICE_ISSUER_NAME`` and
``INVOICE_ISSUER_ADDRESS``), the tenant billed, its number, period, issue and due dates, the
amount due, and the usage summed by day, by API key and by market (request-level detail stays in
the CSV). Its amounts are rounded to the cent for display (:func:`accounts.money.cents_str`);
the total due is the exact total rounded once, half up (``Invoice.total_due``). Its token
columns are the CSV's: ``prompt_tokens`` all prompt tokens, ``cached_tokens`` those of them that
were cached, ``completion_tokens``. Every page has the invoice number and "Page N of M".
"""

from __future__ import annotations

import csv
import io

from django.conf import settings
from fpdf import FPDF, FontFace
from fpdf.enums import TableBordersLayout

from accounts.models import Invoice, InvoiceLine
from accounts.money import cents_str, money_str
from accounts.selectors.billing import (
    UsageSum,
    invoice_breakdown,
    invoice_lines,
    usage_by_market,
)

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


def invoice_csv(invoice: Invoice) -> str:
    """The invoice as CSV text."""
    lines = list(invoice_lines(invoice=invoice))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for line in lines:
        writer.writerow(["request", *_line_json(line).values()])
    for s in usage_by_market(lines):
        amounts = [money_str(s.priority), money_str(s.tokens), money_str(s.total)]
        writer.writerow(["market", "", s.label, "", "", "", "", *amounts])
    totals = [invoice.priority_total, invoice.tokens_total, invoice.total]
    writer.writerow(["total", "", "", "", "", "", "", *map(money_str, totals)])
    return out.getvalue()


def _line_json(line: InvoiceLine) -> dict[str, object]:
    """A request's line, in the CSV's column order: its tokens and both charges (dollars)."""
    return {
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
        "issue_date": invoice.issued_on.isoformat(),
        "due_date": invoice.due_on.isoformat(),
    }
    if with_lines:
        lines = list(invoice_lines(invoice=invoice))
        data["lines"] = [_line_json(line) for line in lines]
        data["markets"] = [
            {
                "market": s.label,
                "requests": s.requests,
                "priority": money_str(s.priority),
                "tokens": money_str(s.tokens),
                "total": money_str(s.total),
            }
            for s in usage_by_market(lines)
        ]
    return data


def _latin1(text: str) -> str:
    """The PDF's core font speaks Latin-1; anything else becomes '?'."""
    return text.encode("latin-1", "replace").decode("latin-1")


# The PDF's summary tables: the first column's heading, then the columns every table shares.
# Token headings are the CSV's column names, with what they count.
_SUMMARY_HEADINGS = (
    "Requests",
    "prompt_tokens\n(all)",
    "cached_tokens\n(of which cached)",
    "completion_tokens",
    "Priority $",
    "Tokens $",
    "Total $",
)
_SUMMARY_WIDTHS = (41, 15, 24, 27, 28, 15, 15, 15)  # mm, 180 in all (A4 less 15 mm margins)
_INK, _MUTED, _RULE, _SHADE = (33, 37, 41), (108, 117, 125), (190, 195, 200), (241, 243, 245)
_NOTES = (
    "Amounts in US dollars, rounded to the cent (half up), each row on its own: rows may differ "
    'from the total by a cent; "< $0.01" is a charge under half a cent. Total due: the exact sum '
    "of the charges, rounded once. Priority: what the market's auction charged for the waiting "
    "a request's bid saved it. Tokens: the market's posted prices per million tokens. Days: UTC, "
    "the day a request was charged. prompt_tokens counts all prompt tokens, cached_tokens those "
    "of them that were cached, as in the CSV export, which lists every request with its exact "
    "amounts (9 decimal places)."
)


class _InvoicePdf(FPDF):
    """A4 portrait; every page's footer names the issuer and the invoice and says "Page N of
    M", and every page after the first starts with the invoice's number, tenant and period."""

    def __init__(self, *, running_head: str, footer_text: str) -> None:
        super().__init__(orientation="P", unit="mm", format="A4")
        self.running_head = _latin1(running_head)
        self.footer_text = _latin1(footer_text)
        self.set_margins(15, 15, 15)
        self.set_auto_page_break(auto=True, margin=18)

    def pen(self, size: float, style: str = "", *, color: tuple[int, int, int] = _INK) -> None:
        """Write on in Helvetica of ``size`` points, ``style`` ("B": bold), in ``color``."""
        self.set_font("Helvetica", style, size)
        self.set_text_color(*color)

    def header(self) -> None:
        if self.page_no() == 1:
            return
        self.pen(8, color=_MUTED)
        self.cell(0, 5, self.running_head, new_x="LMARGIN", new_y="NEXT")
        self.set_draw_color(*_RULE)
        self.line(self.l_margin, self.get_y(), self.w - self.r_margin, self.get_y())
        self.ln(4)
        self.set_text_color(*_INK)

    def footer(self) -> None:
        self.set_y(-13)
        self.set_draw_color(*_RULE)
        self.line(self.l_margin, self.get_y(), self.w - self.r_margin, self.get_y())
        self.pen(8, color=_MUTED)
        self.cell(0, 6, self.footer_text, align="L")
        self.set_x(self.l_margin)
        # {nb} is fpdf2's alias for the page count, filled in when the document is closed.
        self.cell(0, 6, f"Page {self.page_no()} of {{nb}}", align="R")


def _pdf_letterhead(pdf: _InvoicePdf, invoice: Invoice) -> None:
    """The issuer on the left, "INVOICE" and its references on the right, then who is billed."""
    top = pdf.get_y()
    pdf.pen(14, "B")
    pdf.cell(100, 7, _latin1(settings.INVOICE_ISSUER_NAME), new_x="LMARGIN", new_y="NEXT")
    pdf.pen(9, color=_MUTED)
    for line in settings.INVOICE_ISSUER_ADDRESS:
        pdf.cell(100, 4.5, _latin1(line), new_x="LMARGIN", new_y="NEXT")
    issuer_bottom = pdf.get_y()

    pdf.set_xy(115, top)
    pdf.pen(20, "B")
    pdf.cell(80, 9, "INVOICE", align="R", new_x="LEFT", new_y="NEXT")
    references = (
        ("Invoice number", invoice.number),
        ("Issue date", invoice.issued_on.isoformat()),
        ("Due date", invoice.due_on.isoformat()),
        ("Period", f"{invoice.period_first_day} to {invoice.period_last_day} (UTC)"),
    )
    for name, value in references:
        pdf.set_x(115)
        pdf.pen(9, color=_MUTED)
        pdf.cell(28, 5, name, align="L")
        pdf.pen(9, "B")
        pdf.cell(52, 5, _latin1(value), align="R", new_x="LMARGIN", new_y="NEXT")

    pdf.set_y(max(issuer_bottom, pdf.get_y()) + 6)
    pdf.pen(8, color=_MUTED)
    pdf.cell(0, 4.5, "BILL TO", new_x="LMARGIN", new_y="NEXT")
    pdf.pen(11, "B")
    pdf.cell(0, 6, _latin1(invoice.tenant.name), new_x="LMARGIN", new_y="NEXT")
    pdf.pen(9, color=_MUTED)
    pdf.cell(
        0, 4.5, _latin1(f"Tenant account: {invoice.tenant.slug}"), new_x="LMARGIN", new_y="NEXT"
    )
    pdf.ln(6)


def _pdf_amount_due(pdf: _InvoicePdf, invoice: Invoice, requests: int) -> None:
    """The charges in a shaded band, the total due in bold: what the reader looks for first."""
    rows = (
        ("Priority charges (the auction)", cents_str(invoice.priority_total), ""),
        ("Token charges (posted prices)", cents_str(invoice.tokens_total), ""),
        ("Total due", cents_str(invoice.total_due), "B"),
    )
    pdf.set_fill_color(*_SHADE)
    top = pdf.get_y()
    pdf.rect(pdf.l_margin, top, pdf.epw, 4 + 6 * len(rows) + 6, style="F")
    pdf.set_y(top + 2)
    for label, amount, style in rows:
        pdf.set_x(pdf.l_margin + 4)
        pdf.pen(12 if style else 10, style)
        pdf.cell(pdf.epw - 48, 6, label)
        pdf.cell(40, 6, amount, align="R", new_x="LMARGIN", new_y="NEXT")
    pdf.set_x(pdf.l_margin + 4)
    pdf.pen(8.5, color=_MUTED)
    exact = (
        f"{requests:,} {'request' if requests == 1 else 'requests'}. Due by {invoice.due_on}. "
        f"Exact total USD {money_str(invoice.total)}, rounded half up."
    )
    pdf.cell(pdf.epw - 8, 6, exact, align="R", new_x="LMARGIN", new_y="NEXT")
    pdf.set_y(top + 4 + 6 * len(rows) + 6 + 6)
    pdf.set_text_color(*_INK)


def _pdf_summary_table(
    pdf: _InvoicePdf, title: str, first: str, sums: list[UsageSum], total: UsageSum
) -> None:
    """One summary: a row per group, then the total row (the exact sums, rounded)."""
    if pdf.will_page_break(7 + 12 + 2 * 6):  # its title, headings and two rows: not orphaned
        pdf.add_page()
    pdf.pen(11, "B")
    pdf.cell(0, 7, title, new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("Helvetica", "", 8)
    pdf.set_draw_color(*_RULE)
    heading = FontFace(emphasis="BOLD", color=_INK, fill_color=_SHADE, size_pt=7.5)
    bold = FontFace(emphasis="BOLD")
    with pdf.table(
        col_widths=_SUMMARY_WIDTHS,
        text_align=("LEFT", *["RIGHT"] * (len(_SUMMARY_WIDTHS) - 1)),
        headings_style=heading,
        borders_layout=TableBordersLayout.HORIZONTAL_LINES,
        line_height=4.5,
        padding=(0.8, 1.5),
        width=pdf.epw,
    ) as table:
        table.row([first, *_SUMMARY_HEADINGS])
        for s in [*sums, total]:
            cells = [
                _latin1(s.label),
                f"{s.requests:,}",
                f"{s.prompt_tokens:,}",
                f"{s.cached_tokens:,}",
                f"{s.completion_tokens:,}",
                cents_str(s.priority),
                cents_str(s.tokens),
                cents_str(s.total),
            ]
            row = table.row()
            for text in cells:
                row.cell(text, style=bold if s is total else None)
    pdf.ln(4)


def invoice_pdf(invoice: Invoice) -> bytes:
    """The invoice as a PDF document (A4): letterhead, amount due, usage by day, by API key and
    by market, amounts in cents (see the module's docstring)."""
    breakdown = invoice_breakdown(invoice=invoice)
    pdf = _InvoicePdf(
        running_head=f"Invoice {invoice.number} - {invoice.tenant.name} - "
        f"{invoice.period_first_day} to {invoice.period_last_day}",
        footer_text=f"{settings.INVOICE_ISSUER_NAME} - Invoice {invoice.number}",
    )
    pdf.set_title(_latin1(f"Invoice {invoice.number}"))
    pdf.set_author(_latin1(settings.INVOICE_ISSUER_NAME))
    pdf.add_page()
    _pdf_letterhead(pdf, invoice)
    _pdf_amount_due(pdf, invoice, breakdown.total.requests)
    if not breakdown.lines:
        pdf.set_font("Helvetica", "", 10)
        pdf.cell(0, 7, "No charges in this period.", new_x="LMARGIN", new_y="NEXT")
    else:
        total = breakdown.total
        _pdf_summary_table(pdf, "Usage by day (UTC)", "Date", breakdown.by_day, total)
        _pdf_summary_table(pdf, "Usage by API key", "API key", breakdown.by_key, total)
        _pdf_summary_table(pdf, "Usage by market", "Market", breakdown.by_market, total)
    pdf.pen(7.5, color=_MUTED)
    pdf.multi_cell(0, 3.5, _latin1(_NOTES), new_x="LMARGIN", new_y="NEXT")
    return bytes(pdf.output())
