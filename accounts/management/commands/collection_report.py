"""``manage.py collection_report [--minutes N]``: what the ledger collected in priority and
tokens, and what the settlement rule cut, by cause (``accounts.selectors.collection``)."""

from __future__ import annotations

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from accounts.money import money_str
from accounts.selectors.collection import collection


class Command(BaseCommand):
    help = "Priority revenue and what budget cuts left uncollected (all time, or recent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--minutes", type=float, help="only the last N minutes")

    def handle(self, *args: object, minutes: float | None, **options: object) -> None:
        start = None if minutes is None else timezone.now() - timedelta(minutes=minutes)
        got = collection(start=start)
        self.stdout.write(
            f"priority revenue ${money_str(got.priority)}, tokens ${money_str(got.tokens)}; "
            f"uncollected ${money_str(got.uncollected)} ({got.uncollected_share:.3%}) "
            f"(cut by a budget at its edge); given away by autobidders' budgets "
            f"${money_str(got.given_away)}; over the consent cap ${money_str(got.over_consent)}"
        )
