"""``manage.py invoices_generate [--month YYYY-MM]``: every tenant's invoice for a month (the
previous UTC month by default). Idempotent: existing invoices are kept as they are."""

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.models import Tenant
from accounts.money import money_str
from accounts.services import invoice_generate, month_bounds, previous_month_bounds


class Command(BaseCommand):
    help = "Generate every tenant's invoice for a month (default: the previous UTC month)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--month", help="YYYY-MM (UTC); default: the previous month")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["month"]:
            try:
                when = datetime.strptime(options["month"], "%Y-%m")
            except ValueError as exc:
                raise CommandError("--month must look like 2026-11") from exc
            start, end = month_bounds(year=when.year, month=when.month)
        else:
            start, end = previous_month_bounds(now=datetime.now(UTC))
        for tenant in Tenant.objects.order_by("slug"):
            try:
                invoice = invoice_generate(tenant=tenant, period_start=start, period_end=end)
            except ValueError as exc:
                raise CommandError(f"{tenant.slug}: {exc}") from exc
            self.stdout.write(f"{invoice.number}: ${money_str(invoice.total)}")
