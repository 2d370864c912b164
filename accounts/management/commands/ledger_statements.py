"""``manage.py ledger_statements [NAME ...]``: the ledger's statements as PostgreSQL runs them,
the money rules (``accounts.rules``) read as SQL included."""

from __future__ import annotations

import sqlparse
from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.ledger import statements

STATEMENTS = {
    "hold": statements.HOLDS_SQL,
    "settle": statements.SETTLE_SQL,
    "release": statements.RELEASE_SQL,
}


class Command(BaseCommand):
    help = "Print the ledger's SQL statements as they run (all, or the ones named)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="*", help=f"among: {', '.join(STATEMENTS)}")

    def handle(self, *args: object, names: list[str], **options: object) -> None:
        for name in names or list(STATEMENTS):
            if name not in STATEMENTS:
                raise CommandError(f"no statement {name!r}: one of {', '.join(STATEMENTS)}")
            text = sqlparse.format(STATEMENTS[name], reindent=True, keyword_case="upper")
            self.stdout.write(f"-- {name}\n{text.strip()};\n")
