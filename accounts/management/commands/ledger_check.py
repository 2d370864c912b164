"""``manage.py ledger_check``: the ledger check after a fault or a soak
(``accounts.selectors.ledger_check``); exits 1 when it fails."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.selectors.ledger_check import ledger_check


class Command(BaseCommand):
    help = "Check that every served request is charged once and the counters equal the ledger."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--grace",
            type=float,
            default=None,
            metavar="SECONDS",
            help="a request may stay queued this long (default: STALE_REQUEST_S)",
        )

    def handle(self, *args: object, grace: float | None, **options: object) -> None:
        check = ledger_check(grace_s=settings.STALE_REQUEST_S if grace is None else grace)
        self.stdout.write("\n".join(check.lines()))
        if not check.ok:
            raise CommandError("the ledger check failed")
